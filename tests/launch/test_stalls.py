"""A stalled process (SIGSTOP, as a hung host or a swapping machine looks) is
ended and named within AGNOSTIC_STALL_SECONDS, with the environment's engine,
under `agnostic launch` (torch's shim and torchrun: tests/engines/
test_torch_ddp.py). Before, torch ended after gloo's 600 s naming rank 0,
and JAX after 96 s with a fatal error."""
import sys

import pytest

from tests.conftest import engine_or_skip
from tests.stalls import BOUND_SECONDS, SCRIPT, STALL_SECONDS, run_and_stop

engine_or_skip()


@pytest.mark.parametrize("rank", [0, 1])
def test_agnostic_launch_names_the_process_that_stopped(rank, tmp_path):
    command = [sys.executable, "-m", "agnostic", "launch", "--nproc-per-node", "2", SCRIPT,
               str(tmp_path)]
    code, stderr, elapsed, left, pids = run_and_stop(command, tmp_path, rank)
    assert code == 1, stderr[-3000:]
    # Silent since its last beat, up to a tenth of the bound before the stop.
    assert STALL_SECONDS * 0.9 <= elapsed < BOUND_SECONDS, (elapsed, stderr[-3000:])
    named = (f"agnostic launch: worker process {pids[rank]} (rank {rank}, node 0) stopped "
             f"answering on host ")
    assert named in stderr and "AGNOSTIC_STALL_SECONDS=5" in stderr, stderr[-3000:]
    assert f"(rank {1 - rank}, node 0) stopped" not in stderr
    assert left == []
