"""RANK and WORLD_SIZE set by hand, by Kubeflow's PyTorchJob (one process
per pod, RANK the pod's), by Ray Train's torch workers (with LOCAL_RANK,
LOCAL_WORLD_SIZE and NODE_RANK), or by agnostic for the processes it starts
(with LOCAL_RANK, the device index, and LOCAL_WORLD_SIZE)."""
from agnostic import cluster


def detect(environ):
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(environ, "WORLD_SIZE", "RANK")
    if "LOCAL_RANK" not in environ:  # one process per pod (PyTorchJob) or by hand
        local_rank, local_world_size, node_rank = 0, 1, rank
    else:
        local_rank = cluster.whole_number(environ, "LOCAL_RANK")
        local_world_size = cluster.whole_number(environ, "LOCAL_WORLD_SIZE", default=1,
                                                least=1)
        node = "NODE_RANK" if "NODE_RANK" in environ else "GROUP_RANK"
        node_rank = cluster.whole_number(environ, node, default=0)
    return cluster.Environment(
        "rank-variables", world_size, rank, local_rank=local_rank, node_rank=node_rank,
        coordinator=cluster.text(environ, "MASTER_ADDR", default="127.0.0.1"),
        port=cluster.port_number(environ, "MASTER_PORT", default=29500),
        local_world_size=local_world_size,
    )
