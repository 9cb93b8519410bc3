"""IBM Spectrum LSF with jsrun: JSM_NAMESPACE_RANK, _SIZE, _LOCAL_RANK; the
hosts come from the job's rank file (its first line is the launch node,
which runs no task)."""
from agnostic import cluster


def detect(environ):
    if "LSB_JOBID" not in environ or "JSM_NAMESPACE_SIZE" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(
        environ, "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK")
    if world_size < 2:
        return None
    hosts = _rank_file_hosts(environ.get("LSB_DJOB_RANKFILE"))
    job = cluster.whole_number(environ, "LSB_JOBID", default=0)
    local_world_size = cluster.whole_number(environ, "JSM_NAMESPACE_LOCAL_SIZE",
                                            default=1, least=1)
    local_rank = cluster.whole_number(environ, "JSM_NAMESPACE_LOCAL_RANK", default=0)
    if "JSM_NAMESPACE_LOCAL_SIZE" in environ:
        cluster.check_rank("JSM_NAMESPACE_LOCAL_RANK", local_rank, local_world_size)
    return cluster.Environment(
        "lsf", world_size, rank, local_rank=local_rank,
        local_world_size=max(local_world_size, local_rank + 1),
        coordinator=hosts[0] if hosts else None,
        port=cluster.job_port(environ, job),
        hosts=tuple(hosts) if len(hosts) == world_size else None,
    )


def _rank_file_hosts(path):
    if not path:
        return []
    try:
        with open(path) as handle:
            lines = [line.strip() for line in handle if line.strip()]
    except OSError:
        return []
    return lines[1:]
