"""Kubeflow's JAXJob: COORDINATOR_ADDRESS, COORDINATOR_PORT, NUM_PROCESSES,
PROCESS_ID, one process per pod."""
from agnostic import cluster


def detect(environ):
    if "COORDINATOR_ADDRESS" not in environ or "NUM_PROCESSES" not in environ:
        return None
    world_size = cluster.whole_number(environ, "NUM_PROCESSES", least=1)
    rank = cluster.whole_number(environ, "PROCESS_ID")
    cluster.check_rank("PROCESS_ID", rank, world_size)
    return cluster.Environment(
        "kubeflow-jaxjob", world_size, rank, node_rank=rank,
        coordinator=environ["COORDINATOR_ADDRESS"],
        port=cluster.whole_number(environ, "COORDINATOR_PORT", default=6666, least=1),
    )
