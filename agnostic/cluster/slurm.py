"""SLURM: the tasks of a job step started by `srun` (inside `sbatch`).

An interactive allocation (`salloc`, then plain `python`) is no multi-task
step: SLURM sets no SLURM_PROCID there, so it is not taken for one.
"""
import re

from agnostic import cluster


def detect(environ):
    if "SLURM_PROCID" not in environ or "SLURM_STEP_ID" not in environ:
        return None
    tasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    world_size, rank = cluster.size_and_rank(environ, tasks, "SLURM_PROCID")
    if world_size < 2:
        return None
    nodes = expand_nodelist(environ.get("SLURM_STEP_NODELIST")
                            or environ.get("SLURM_JOB_NODELIST") or "127.0.0.1")
    port = cluster.job_port(environ, cluster.whole_number(environ, "SLURM_JOB_ID", default=0))
    node_rank = cluster.whole_number(environ, "SLURM_NODEID", default=0)
    per_node = expand_counts(environ.get("SLURM_STEP_TASKS_PER_NODE")
                             or environ.get("SLURM_TASKS_PER_NODE") or "")
    hosts = task_hosts(nodes, per_node, world_size,
                       environ.get("SLURM_DISTRIBUTION", "block"))
    return cluster.Environment(
        "slurm", world_size, rank,
        local_rank=cluster.whole_number(environ, "SLURM_LOCALID", default=0),
        node_rank=node_rank, coordinator=hosts[0] if hosts else nodes[0], port=port,
        local_world_size=per_node[node_rank] if node_rank < len(per_node) else 1,
        hosts=hosts,
    )


def expand_nodelist(nodelist):
    """SLURM's compact host list as host names, in order:
    "n[1-2,05],gpu3" -> ["n1", "n2", "n05", "gpu3"]."""
    hosts = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,]+)", nodelist):
        if plain:
            hosts.append(plain.strip())
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if not last:
                hosts.append(prefix + first)
                continue
            width = len(first)
            hosts += [f"{prefix}{number:0{width}d}"
                      for number in range(int(first), int(last) + 1)]
    return hosts


def expand_counts(counts):
    """SLURM's compact tasks per node: "2(x3),1" -> [2, 2, 2, 1]."""
    expanded = []
    for number, times in re.findall(r"(\d+)(?:\(x(\d+)\))?", counts):
        expanded += [int(number)] * int(times or 1)
    return expanded


def task_hosts(nodes, per_node, world_size, distribution):
    """Each task's host, in rank order, or None when SLURM's counts do not
    add up (the tasks then meet through the coordinator alone)."""
    if len(per_node) != len(nodes) or sum(per_node) != world_size:
        return None
    if distribution.split(":")[0] == "cyclic":
        left, hosts = list(per_node), []
        while len(hosts) < world_size:
            for index, node in enumerate(nodes):
                if left[index]:
                    left[index] -= 1
                    hosts.append(node)
        return tuple(hosts)
    return tuple(node for node, count in zip(nodes, per_node) for _ in range(count))
