"""torchrun (TorchElastic): it starts the processes and sets RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and
MASTER_PORT."""
from agnostic import cluster


def detect(environ):
    if "TORCHELASTIC_RUN_ID" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(environ, "WORLD_SIZE", "RANK")
    return cluster.Environment(
        "torchrun", world_size, rank,
        local_rank=cluster.whole_number(environ, "LOCAL_RANK", default=0),
        node_rank=cluster.whole_number(environ, "GROUP_RANK", default=0),
        coordinator=environ.get("MASTER_ADDR", "127.0.0.1"),
        port=cluster.whole_number(environ, "MASTER_PORT", default=29500, least=1),
        local_world_size=cluster.whole_number(environ, "LOCAL_WORLD_SIZE", default=1, least=1),
    )
