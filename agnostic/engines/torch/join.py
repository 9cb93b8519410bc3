"""torch's job of several processes, joined once per process for torch-ddp
and the strategies built on it: the processes the plan starts (the calling
process becomes rank 0), each one's threads and CUDA device, and torch's
process group over the job's store."""
import atexit
import datetime
import logging
import sys

from agnostic import cluster, errors
from agnostic.cluster import torch_join
from agnostic.engines.torch import start
from agnostic.launch import local, processes

logger = logging.getLogger("agnostic")


def join(plan):
    """This process's place in the plan's job (a cluster.Environment), with
    torch's process group made: the scheduler's job (or Ray's group) the
    plan found, else the processes started here; this process's threads and
    CUDA device; every rank present within AGNOSTIC_JOIN_SECONDS, or an error
    naming the missing ones (the store listens on the job's address)."""
    import torch
    import torch.distributed as dist

    group = plan.job
    if plan.starts_processes:
        group = local.launch(plan.num_processes, device_indexes(plan))
    _share_the_cores(plan.threads)
    if not dist.is_initialized():
        if plan.process_group == "nccl":
            start.pin(torch, group)
        store = torch_join.store(group, cluster.join_seconds_at_start())
        dist.init_process_group(
            plan.process_group, store=store, rank=group.rank, world_size=group.world_size,
            timeout=datetime.timedelta(minutes=10),
        )
        atexit.register(_leave_group)
        local.report_failures(group.rank)
    return group


def _share_the_cores(threads):
    """The plan's intra-op thread count for this process (None: the user's
    OMP_NUM_THREADS or the engine's default stays)."""
    import torch

    if threads and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def _leave_group():
    """Ends the process group this strategy started, at a normal exit, while
    the interpreter is still whole: torch's communication threads may hold
    finished collectives, and freeing them during the interpreter's teardown
    can abort the process ("terminate called without an active exception").
    Not after an uncaught exception or Ctrl-C: a collective may then be left
    waiting for a peer, and ending the group would wait for it too."""
    import torch.distributed as dist

    if getattr(sys, "last_value", None) is None and dist.is_initialized():
        rank = dist.get_rank()
        try:
            dist.destroy_process_group()
        except Exception as error:  # exiting anyway; say so, do not fail
            logger.debug("ending the process group at exit: %s", error)
        else:
            processes.mark_finished(rank)


def device_indexes(plan):
    """The CUDA index of each rank's (first) device; the rank itself on CPU."""
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
