"""torchrun (TorchElastic): it starts the processes and sets RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and
MASTER_PORT. Its agent's store listens on MASTER_PORT (torch joins it there);
JAX's coordinator and TensorFlow's workers take the ports after it.

torchrun does not say where the other nodes' processes run: TensorFlow's
workers, which need every address, learn them through the agent's store.
"""
import os
import socket

from agnostic import cluster, errors

HOSTS_KEY = "agnostic/hosts/{restart}/{rank}"


def detect(environ):
    if "TORCHELASTIC_RUN_ID" not in environ:
        return None
    world_size, rank = cluster.size_and_rank(environ, "WORLD_SIZE", "RANK")
    local_world_size = cluster.whole_number(environ, "LOCAL_WORLD_SIZE", default=1, least=1)
    local_rank = cluster.whole_number(environ, "LOCAL_RANK", default=0)
    if "LOCAL_WORLD_SIZE" in environ:
        cluster.check_rank("LOCAL_RANK", local_rank, local_world_size)
    coordinator = cluster.text(environ, "MASTER_ADDR", default="127.0.0.1")
    return cluster.Environment(
        "torchrun", world_size, rank, local_rank=local_rank,
        node_rank=cluster.whole_number(environ, "GROUP_RANK", default=0),
        coordinator=coordinator,
        # The agent's store; JAX's coordinator takes the port after it.
        port=cluster.port_number(environ, "MASTER_PORT", default=29500, after=1),
        local_world_size=local_world_size,
        hosts=(coordinator,) * world_size if local_world_size == world_size else None,
        port_taken=True,
    )


def exchange_hosts(environment, seconds):
    """Every process's host, in rank order, through torchrun's store: each
    process writes the address it reaches the coordinator from and reads the
    others'. Needs torch, which torchrun comes with."""
    import datetime

    import torch.distributed as dist

    # The agent's store, when the workers share it; else rank 0 hosts one.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    try:
        store = dist.TCPStore(environment.coordinator, environment.port,
                              is_master=environment.rank == 0 and not agent_store,
                              timeout=datetime.timedelta(seconds=seconds))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        keys = [HOSTS_KEY.format(restart=restart, rank=r) for r in range(environment.world_size)]
        store.set(keys[environment.rank], own_address(environment.coordinator, environment.port))
        store.wait(keys)
        return tuple(store.get(key).decode() for key in keys)
    except (RuntimeError, OSError) as error:  # torch raises its DistStoreError (a RuntimeError)
        raise errors.LaunchError(
            f"TensorFlow worker {environment.rank} of {environment.world_size} could not "
            f"learn the other workers' addresses through torchrun's store at "
            f"{environment.coordinator}:{environment.port} within {seconds} s: {error}"
        ) from error


def own_address(coordinator, port):
    """This machine's address as the coordinator sees it: the one its route
    to the coordinator leaves from (no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((coordinator, port))
        return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()
    finally:
        probe.close()
