"""SLURM: the tasks of a job step started by `srun` (inside `sbatch`).

An interactive allocation (`salloc`, then plain `python`) is no multi-task
step: SLURM sets no SLURM_PROCID there, so it is not taken for one.

The host list is checked and counted here, never expanded: every task's
host is worked out only when TensorFlow's workers ask for it.
"""
import itertools

from agnostic import cluster
from agnostic.cluster import hostlist


def detect(environ):
    if "SLURM_PROCID" not in environ or "SLURM_STEP_ID" not in environ:
        return None
    tasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ else "SLURM_NTASKS"
    world_size, rank = cluster.size_and_rank(environ, tasks, "SLURM_PROCID")
    if world_size < 2:
        return None
    nodes = _nodes(environ)
    port = cluster.job_port(environ, cluster.whole_number(environ, "SLURM_JOB_ID", default=0))
    node_rank = cluster.whole_number(environ, "SLURM_NODEID", default=0)
    name = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
                 if environ.get(n)), None)
    runs = hostlist.parse_counts(environ[name], name) if name else []
    distribution = environ.get("SLURM_DISTRIBUTION", "block")
    fits = (sum(times for _, times in runs) == len(nodes)
            and sum(count * times for count, times in runs) == world_size)
    return cluster.Environment(
        "slurm", world_size, rank,
        local_rank=cluster.whole_number(environ, "SLURM_LOCALID", default=0),
        node_rank=node_rank, coordinator=nodes.first(), port=port,
        local_world_size=_tasks_on(runs, node_rank),
        # None when SLURM's counts do not add up: the tasks then meet
        # through the coordinator alone.
        hosts=TaskHosts(nodes, runs, world_size, distribution) if fits else None,
    )


def _nodes(environ):
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"):
        if name in environ:
            return hostlist.parse(environ[name], name)
    return hostlist.parse("127.0.0.1", "SLURM_JOB_NODELIST")


def _tasks_on(runs, node_rank):
    for count, times in runs:
        if node_rank < times:
            return count
        node_rank -= times
    return 1


def expand_nodelist(nodelist, variable="SLURM_JOB_NODELIST"):
    """SLURM's compact host list as host names, in order:
    "n[1-2,05],gpu3" -> ["n1", "n2", "n05", "gpu3"]."""
    return list(hostlist.parse(nodelist, variable))


def expand_counts(counts, variable="SLURM_TASKS_PER_NODE"):
    """SLURM's compact tasks per node: "2(x3),1" -> [2, 2, 2, 1]."""
    return [count for count, times in hostlist.parse_counts(counts, variable)
            for _ in range(times)]


class TaskHosts:
    """Each task's host, in rank order, as a tuple made on first use."""

    def __init__(self, nodes, runs, world_size, distribution):
        self._made = None
        self._args = (nodes, runs, world_size, distribution)

    def hosts(self):
        if self._made is None:
            self._made = task_hosts(*self._args)
        return self._made

    def __len__(self):
        return self._args[2]

    def __iter__(self):
        return iter(self.hosts())

    def __getitem__(self, index):
        return self.hosts()[index]

    def __eq__(self, other):
        return self.hosts() == (other.hosts() if isinstance(other, TaskHosts) else other)

    def __hash__(self):
        return hash(self.hosts())

    def __repr__(self):
        return repr(self.hosts())

    def count(self, value):
        return self.hosts().count(value)


def task_hosts(nodes, runs, world_size, distribution):
    """Each task's host, in rank order: block (SLURM's default) fills each
    node in turn, cyclic deals the tasks round the nodes."""
    per_node = [count for count, times in runs for _ in range(times)]
    if distribution.split(":")[0] == "cyclic":
        left, hosts = list(per_node), []
        while len(hosts) < world_size:
            for index, node in enumerate(nodes):
                if left[index]:
                    left[index] -= 1
                    hosts.append(node)
        return tuple(hosts)
    return tuple(itertools.chain.from_iterable(
        itertools.repeat(node, count) for node, count in zip(nodes, per_node)))
