"""What the plan decides per process: the engine's threads where several
processes share a machine's cores, and the processes per node a scheduler
may start beside the node's accelerators."""
import dataclasses

from agnostic import devices as devices_lib
from agnostic import errors

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
