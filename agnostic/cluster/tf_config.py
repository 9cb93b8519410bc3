"""TF_CONFIG, as TensorFlow's MultiWorkerMirroredStrategy and Kubeflow's
TFJob write it: `cluster` lists each role's addresses, `task` names this
process's role and index. A `chief` entry is the first worker (rank 0);
the `worker` entries follow it."""
import collections
import json

from agnostic import cluster, errors

ROLES = ("chief", "worker")
EXAMPLE = ('{"cluster": {"worker": ["host1:2222", "host2:2222"]}, '
           '"task": {"type": "worker", "index": 0}}')

Workers = collections.namedtuple("Workers", "addresses hosts ports rank")


def detect(environ):
    if not environ.get("TF_CONFIG"):
        return None
    workers = read(environ)
    hosts, rank = workers.hosts, workers.rank
    return cluster.Environment(
        "tf-config", len(hosts), rank, node_rank=rank, coordinator=hosts[0],
        port=workers.ports[0], local_world_size=hosts.count(hosts[rank]), hosts=hosts,
        local_rank=hosts[:rank].count(hosts[rank]),
    )


def read(environ):
    """TF_CONFIG checked: every worker's address (the chief first), host and
    port, and this task's rank. A LaunchError names what is wrong."""
    raw = environ["TF_CONFIG"]

    def fail(problem):
        shown = raw if len(raw) <= 300 else raw[:300] + "..."
        raise errors.LaunchError(
            f"TF_CONFIG {problem}. Expected JSON such as {EXAMPLE}: every worker's "
            "HOST:PORT, and this task's type and index among them. Received: "
            f"TF_CONFIG={shown!r}. Correct it, or unset it for a process that is no "
            "TensorFlow worker.")

    try:
        config = json.loads(raw)
    except ValueError as error:
        fail(f"is not JSON ({error})")
    if not isinstance(config, dict):
        fail(f"must be a JSON object, not a {type(config).__name__}")
    roles, task = config.get("cluster"), config.get("task")
    if not isinstance(roles, dict) or not roles:
        fail('has no "cluster" object listing the workers')
    if not isinstance(task, dict):
        fail('has no "task" object naming this task')
    others = sorted(set(roles) - set(ROLES))
    role = task.get("type")
    if others or role in ("ps", "evaluator"):
        raise errors.LaunchError(
            "agnostic trains with every TF_CONFIG task as a worker of "
            "MultiWorkerMirroredStrategy; parameter servers and evaluators "
            f"are not supported. Received: roles {sorted(roles)}, this task "
            f"{role!r}. Use 'chief' and 'worker' only."
        )
    addresses = []
    for name in ROLES:
        listed = roles.get(name, [])
        if not isinstance(listed, list) or not all(isinstance(a, str) for a in listed):
            fail(f'lists the {name} role as {listed!r}, not a list of "HOST:PORT" strings')
        addresses += listed
    if not addresses:
        fail("lists no worker")
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        fail(f"lists {', '.join(repeated)} for more than one task: each needs a "
             "HOST:PORT of its own")
    if role not in ROLES or role not in roles:
        fail(f"names this task's type {role!r}, which is not one of its roles "
             f"({', '.join(r for r in ROLES if r in roles)})")
    index = task.get("index")
    if isinstance(index, str) and index.isdigit():
        index = int(index)
    if isinstance(index, bool) or not isinstance(index, int) \
            or not 0 <= index < len(roles[role]):
        fail(f"gives this task the index {index!r}, and the {role} role lists "
             f"{len(roles[role])} task(s): expected 0 to {len(roles[role]) - 1}")
    hosts, ports = [], []
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) <= cluster.HIGHEST_PORT:
            fail(f"lists the address {address!r}, which is not HOST:PORT with a port "
                 "from 1 to 65535")
        hosts.append(host)
        ports.append(int(port))
    rank = index + (len(roles.get("chief", [])) if role == "worker" else 0)
    return Workers(tuple(addresses), tuple(hosts), tuple(ports), rank)


def worker_addresses(environ):
    """Every task's address, the chief first: MultiWorkerMirroredStrategy's
    worker list."""
    return list(read(environ).addresses)
