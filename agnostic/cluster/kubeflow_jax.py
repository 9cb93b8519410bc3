"""Kubeflow's JAXJob: COORDINATOR_ADDRESS, COORDINATOR_PORT, NUM_PROCESSES,
PROCESS_ID, one process per pod."""
from agnostic import cluster


def detect(environ):
    if "COORDINATOR_ADDRESS" not in environ or "NUM_PROCESSES" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(environ, "NUM_PROCESSES", "PROCESS_ID")
    return cluster.Environment(
        "kubeflow-jaxjob", world_size, rank, node_rank=rank,
        coordinator=cluster.text(environ, "COORDINATOR_ADDRESS"),
        port=cluster.port_number(environ, "COORDINATOR_PORT", default=6666),
    )
