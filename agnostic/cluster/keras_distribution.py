"""Keras's own multi-process variables (keras.distribution.initialize):
KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES, _PROCESS_ID."""
from agnostic import cluster, errors


def detect(environ):
    if "KERAS_DISTRIBUTION_NUM_PROCESSES" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(
        environ, "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID", 0)
    addresses = environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES", "")
    host, _, port = addresses.split(",")[0].strip().rpartition(":")
    valid = host and port.isdigit() and 0 < int(port) <= cluster.HIGHEST_PORT
    if world_size > 1 and not valid:
        raise errors.LaunchError(
            "KERAS_DISTRIBUTION_JOB_ADDRESSES must start with the coordinator's "
            "HOST:PORT, a port from 1 to 65535, such as 10.0.0.1:1234. Received: "
            f"KERAS_DISTRIBUTION_JOB_ADDRESSES={addresses!r}"
        )
    return cluster.Environment(
        "keras-distribution", world_size, rank, node_rank=rank,
        coordinator=host if valid else None, port=int(port) if valid else None,
    )
