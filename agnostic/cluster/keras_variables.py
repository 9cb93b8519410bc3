"""Keras's own multi-process variables (keras.distribution.initialize):
KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES, _PROCESS_ID."""
from agnostic import cluster, errors


def detect(environ):
    if "KERAS_DISTRIBUTION_NUM_PROCESSES" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(
        environ, "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID", 0)
    addresses = environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "")
    host, _, port = addresses.split(",")[0].rpartition(":")
    if world_size > 1 and (not host or not port.isdigit()):
        raise errors.LaunchError(
            "KERAS_DISTRIBUTION_JOB_ADDRESSES must start with the coordinator's "
            f"HOST:PORT, such as 10.0.0.1:1234. Received: {addresses!r}"
        )
    return cluster.Environment(
        "keras-distribution", world_size, rank, node_rank=rank,
        coordinator=host or None, port=int(port) if port.isdigit() else None,
    )
