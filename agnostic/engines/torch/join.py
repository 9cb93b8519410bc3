"""torch's job of several processes, joined once per process for torch-ddp
and the strategies built on it: the scheduler's job, or the processes
backend_agnostic_compile started (the calling process is rank 0), each
one's threads and CUDA device, and torch's process group over the job's
store."""
import atexit
import datetime
import logging
import sys
import time

from agnostic import cluster
from agnostic.cluster import torch_join
from agnostic.engines.torch import start
from agnostic.launch import local, processes

logger = logging.getLogger("agnostic")
# How long the process waits at exit, Python's lock released, before ending
# its group (_leave_group).
SETTLE_SECONDS = 0.1


def join(plan):
    """This process's place in the plan's job (a cluster.Environment), with
    torch's process group made: the scheduler's job (or Ray's group) the
    plan found, else the processes started here; this process's threads and
    CUDA device; every rank present within AGNOSTIC_JOIN_SECONDS, or an error
    naming the missing ones (the store listens on the job's address)."""
    import torch
    import torch.distributed as dist

    group = plan.job  # the scheduler's, or the processes compile started
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
    the interpreter is still whole.

    A thread of torch's group (gloo's) frees the last collective it ran
    after the program has its result, and freeing a tensor the program made
    takes Python's lock: in the interpreter's teardown that thread is ended
    instead, and its end aborts the process ("terminate called without an
    active exception", its status -6 after its work was done: a failed pod,
    a failed job). So the process first waits SETTLE_SECONDS with the lock
    released (the threads finish within microseconds of the collective; the
    rest is for a loaded machine's scheduler).
    Not after an uncaught exception or Ctrl-C: a collective may then be left
    waiting for a peer, and ending the group would wait for it too."""
    import torch.distributed as dist

    if getattr(sys, "last_value", None) is None and dist.is_initialized():
        time.sleep(SETTLE_SECONDS)
        rank = dist.get_rank()
        try:
            dist.destroy_process_group()
        except Exception as error:  # exiting anyway; say so, do not fail
            logger.debug("ending the process group at exit: %s", error)
        else:
            processes.mark_finished(rank)
