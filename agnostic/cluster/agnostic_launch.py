"""`agnostic launch`: it sets torch's variables (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), TensorFlow's
TF_CONFIG and Keras's KERAS_DISTRIBUTION_* in every process it starts, and
AGNOSTIC_LAUNCH_NODE_RANK, by which its processes are known (first: the
others describe the same job in part, Keras's without the local rank).

Ports: the launch's PORT is its own rendezvous, torch's store takes PORT+1
(MASTER_PORT), JAX's coordinator PORT+2; TensorFlow's workers take the ports
TF_CONFIG lists."""
from agnostic import cluster
from agnostic.cluster import tf_config

NODE_RANK = "AGNOSTIC_LAUNCH_NODE_RANK"


def detect(environ):
    if NODE_RANK not in environ:
        return None
    world_size, rank = cluster.size_and_rank(environ, "WORLD_SIZE", "RANK")
    local_world_size = cluster.whole_number(environ, "LOCAL_WORLD_SIZE", least=1)
    local_rank = cluster.whole_number(environ, "LOCAL_RANK")
    cluster.check_rank("LOCAL_RANK", local_rank, local_world_size)
    workers = tf_config.read(environ) if environ.get("TF_CONFIG") else None
    return cluster.Environment(
        "agnostic-launch", world_size, rank, local_rank=local_rank,
        node_rank=cluster.whole_number(environ, NODE_RANK),
        coordinator=cluster.text(environ, "MASTER_ADDR"),
        # torch's store; JAX's coordinator takes the port after it.
        port=cluster.port_number(environ, "MASTER_PORT", after=1),
        started_by_scheduler=False, local_world_size=local_world_size,
        hosts=workers.hosts if workers and len(workers.hosts) == world_size else None,
        port_taken=True,
    )
