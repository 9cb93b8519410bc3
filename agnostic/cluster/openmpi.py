"""Open MPI's `mpirun`: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK. It names
no coordinator: rank 0's address has to be shared once the job has started
(coordinator None)."""
from agnostic import cluster


def detect(environ):
    if "OMPI_COMM_WORLD_SIZE" not in environ:
        return None
    world_size = cluster.whole_number(environ, "OMPI_COMM_WORLD_SIZE", least=1)
    if world_size < 2:
        return None
    rank = cluster.whole_number(environ, "OMPI_COMM_WORLD_RANK")
    cluster.check_rank("OMPI_COMM_WORLD_RANK", rank, world_size)
    return cluster.Environment(
        "openmpi", world_size, rank,
        local_rank=cluster.whole_number(environ, "OMPI_COMM_WORLD_LOCAL_RANK", default=0),
        node_rank=cluster.whole_number(environ, "OMPI_COMM_WORLD_NODE_RANK", default=0),
    )
