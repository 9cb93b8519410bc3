"""Open MPI's `mpirun`: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK. It names
no coordinator: rank 0's address has to be shared once the job has started
(coordinator None)."""
from agnostic import cluster


def detect(environ):
    if "OMPI_COMM_WORLD_SIZE" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(
        environ, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK")
    if world_size < 2:
        return None
    return cluster.Environment(
        "openmpi", world_size, rank,
        local_rank=cluster.whole_number(environ, "OMPI_COMM_WORLD_LOCAL_RANK", default=0),
        node_rank=cluster.whole_number(environ, "OMPI_COMM_WORLD_NODE_RANK", default=0),
    )
