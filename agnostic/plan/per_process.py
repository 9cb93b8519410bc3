"""What the plan decides per process: the engine's threads where several
processes share a machine's cores, the processes per node a scheduler may
start beside the node's accelerators, the device index of each process
agnostic starts, and how a job's process joins its engine (`Joining`)."""
import dataclasses
import os
from typing import Optional, Tuple

from agnostic import cluster
from agnostic import devices as devices_lib
from agnostic import errors
from agnostic.cluster import listen

# Strategies that run one process per device.
PROCESS_PER_DEVICE = {"torch-ddp"}


def threads(plan, listing, environment):
    """How many intra-op threads each process gets, and why. Several torch
    processes on one machine share its cores (as torchrun does), unless the
    user chose (OMP_NUM_THREADS); simulated CPU devices past the cores take
    turns, which the plan says."""
    chosen = devices_lib.chosen_threads()
    local = plan.num_processes
    if environment is not None:
        local = environment.local_world_size or environment.world_size
    if chosen:
        return dataclasses.replace(plan, threads_reason=f"{chosen} (set before start)")
    cores = devices_lib.cores()
    turns = ""
    if listing.simulated and len(listing.devices) > cores:
        turns = (f"; {len(listing.devices)} simulated CPU devices on {cores} core(s) take "
                 "turns, so they test a many-device program but train no faster")
    if plan.strategy not in PROCESS_PER_DEVICE or local < 2:
        return dataclasses.replace(plan, threads_reason=f"engine default{turns}")
    # A scheduler's process pinned to some cores has its share already; the
    # processes agnostic starts inherit this one's cores, and share them.
    own = environment is not None and devices_lib.pinned()
    threads = cores if own else devices_lib.threads_per_process(local)
    why = (f"the {cores} core(s) this process is pinned to" if own else
           f"{cores} core(s) shared by {local} processes on this machine")
    return dataclasses.replace(plan, threads=threads, threads_reason=(
        f"{threads} per process ({why}; set OMP_NUM_THREADS to choose){turns}"))


def check_tasks_per_node(backend, listing, environment):
    """Processes per node that cannot share the node's accelerators: an
    error now, not a hang or a crash inside the engine later."""
    per_node = environment.local_world_size
    if not listing.accelerators or per_node < 2 or backend not in ("torch", "tensorflow"):
        return
    local = len(listing.devices) if backend == "torch" else (
        len(listing.devices) // max(1, listing.num_processes))
    if local == 1 or (backend == "torch" and local == per_node):
        return
    wanted = ("one process per accelerator" if backend == "torch"
              else "one process per node, which drives all of the node's accelerators")
    raise errors.DeviceRequestError(
        f"{environment.name} started {per_node} processes on this node, which "
        f"has {local} accelerators visible to each of them; {backend} trains with "
        f"{wanted}. Start {local if backend == 'torch' else 1} process(es) per node "
        "(SLURM: --ntasks-per-node; mpirun: -npernode), or give each process its own "
        "accelerator (SLURM: --gpus-per-task=1, or CUDA_VISIBLE_DEVICES)."
    )


def device_indexes(plan):
    """The device index (LOCAL_RANK) of each process the plan starts: the
    CUDA index of each rank's (first) device; the rank itself on CPU."""
    if not plan.devices[0].startswith("cuda"):
        return list(range(plan.num_processes))
    per_process = len(plan.devices) // plan.num_processes
    indexes = [int(device.split(":")[1]) for device in plan.devices[::per_process]]
    if indexes[0] != 0:
        # This process is rank 0 and its model is already on cuda:0.
        raise errors.LaunchError(
            f"torch-ddp on {', '.join(plan.devices)}: the process that calls "
            "backend_agnostic_compile becomes rank 0, and its model was built on "
            "cuda:0 before the call. Include device 0 first in `gpus`, or choose "
            "the GPUs with CUDA_VISIBLE_DEVICES (e.g. CUDA_VISIBLE_DEVICES=2,3) "
            "and pass gpus=None."
        )
    return indexes


@dataclasses.dataclass(frozen=True)
class Joining:
    """How this process of a job joins its engine's runtime, as the engine
    is imported (engines/<engine>/start.py carries it out; Plan.joining
    says the same)."""

    backend: str
    # JAX: the coordinator every process reaches (HOST:PORT), and this
    # process's devices among its node's (None: all of them).
    coordinator: Optional[str] = None
    local_device_ids: Optional[Tuple[int, ...]] = None
    # TensorFlow: every worker's HOST:PORT, in rank order; None where
    # torchrun's store shares the hosts as the workers join.
    workers: Optional[Tuple[str, ...]] = None


def joining(backend, environment, environ=None):
    """The Joining of this process of `environment` (a cluster.Environment)
    on `backend`. LaunchError where TensorFlow's workers cannot be addressed."""
    if backend == "jax":
        # Several processes per node: each drives its own device (JAX's own
        # detection would give each every device of the node, or one).
        local = (environment.local_rank,) if environment.local_world_size > 1 else None
        return Joining(backend, coordinator=listen.host_port(
            environment.coordinator, environment.engine_port), local_device_ids=local)
    if backend == "tensorflow":
        return Joining(backend, workers=_tf_workers(
            environment, os.environ if environ is None else environ))
    return Joining(backend)


def _tf_workers(environment, environ):
    """Each process's HOST:PORT for TensorFlow's workers, in rank order: as
    TF_CONFIG lists them (TensorFlow's own variable, which `agnostic launch`
    sets beside the others), else each host with its own port (the
    coordinator's port plus the rank, so that tasks sharing a host differ)."""
    from agnostic.cluster import tf_config

    if tf_config.detect(environ) is not None:
        return tuple(tf_config.worker_addresses(environ))
    hosts = environment.hosts
    if hosts is None and environment.name == "torchrun" and environment.port is not None:
        return None  # torchrun's store shares them at the join
    if hosts is None or environment.port is None:
        raise errors.LaunchError(
            f"TensorFlow's workers need every process's address, and {environment.name} "
            "does not say where each process runs. Set TF_CONFIG in each process, or "
            "start the processes with `agnostic launch`, torchrun or srun."
        )
    return addressed(hosts, environment)


def addressed(hosts, environment):
    """`hosts` (one per rank) each with its TensorFlow worker's port: the
    job's engine port plus the rank."""
    port = environment.engine_port
    if port + len(hosts) - 1 > cluster.HIGHEST_PORT:
        raise errors.LaunchError(
            f"TensorFlow's {len(hosts)} workers take one port each from {port}, which "
            f"runs past {cluster.HIGHEST_PORT}. Choose a lower MASTER_PORT. Received: "
            f"MASTER_PORT={environment.port} ({environment.name})")
    return tuple(listen.host_port(host, port + rank) for rank, host in enumerate(hosts))
