"""TF_CONFIG, as TensorFlow's MultiWorkerMirroredStrategy and Kubeflow's
TFJob write it: `cluster` lists each role's addresses, `task` names this
process's role and index. A `chief` entry is the first worker (rank 0);
the `worker` entries follow it."""
import json

from agnostic import cluster, errors

ROLES = ("chief", "worker")


def detect(environ):
    raw = environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
        roles = config["cluster"]
        task = config["task"]
        role, index = task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError) as error:
        raise errors.LaunchError(
            'TF_CONFIG must be JSON such as {"cluster": {"worker": ["host1:port", '
            '"host2:port"]}, "task": {"type": "worker", "index": 0}}. '
            f"Received: TF_CONFIG={raw!r} ({error})"
        ) from error
    others = sorted(set(roles) - set(ROLES))
    if others or role not in ROLES:
        raise errors.LaunchError(
            "agnostic trains with every TF_CONFIG task as a worker of "
            "MultiWorkerMirroredStrategy; parameter servers and evaluators "
            f"are not supported. Received: roles {sorted(roles)}, this task "
            f"{role!r}. Use 'chief' and 'worker' only."
        )
    workers = list(roles.get("chief", [])) + list(roles.get("worker", []))
    rank = index + (len(roles.get("chief", [])) if role == "worker" else 0)
    cluster.check_rank("TF_CONFIG", rank, len(workers))
    hosts = tuple(address.rpartition(":")[0] for address in workers)
    port = workers[0].rpartition(":")[2]
    return cluster.Environment(
        "tf-config", len(workers), rank, node_rank=rank, coordinator=hosts[0],
        port=int(port) if port.isdigit() else None,
        local_world_size=hosts.count(hosts[rank]), hosts=hosts,
        local_rank=hosts[:rank].count(hosts[rank]),
    )


def worker_addresses(environ):
    """Every task's address, the chief first: MultiWorkerMirroredStrategy's
    worker list."""
    roles = json.loads(environ["TF_CONFIG"])["cluster"]
    return list(roles.get("chief", [])) + list(roles.get("worker", []))
