"""RANK and WORLD_SIZE set by hand, by Kubeflow's PyTorchJob (one process
per pod, RANK the pod's), by Ray Train's torch workers, or by agnostic for
the processes it starts."""
from agnostic import cluster


def detect(environ):
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(environ, "WORLD_SIZE", "RANK")
    local_rank = cluster.whole_number(environ, "LOCAL_RANK", default=-1, least=-1)
    return cluster.Environment(
        "rank-variables", world_size, rank,
        local_rank=0 if local_rank < 0 else local_rank,
        node_rank=rank if local_rank < 0 else
        cluster.whole_number(environ, "GROUP_RANK", default=0),
        coordinator=environ.get("MASTER_ADDR", "127.0.0.1"),
        port=cluster.whole_number(environ, "MASTER_PORT", default=29500, least=1),
        local_world_size=cluster.whole_number(environ, "LOCAL_WORLD_SIZE", default=1, least=1),
    )
