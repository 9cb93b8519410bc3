"""Stops one process of a running group with SIGSTOP (as a hung host or a
swapping machine looks) and times the group's end: for the tests of each
launcher's stall watch (tests/launch/test_stalls.py, and torch's
tests/engines/torch/test_ddp.py)."""
import os
import signal
import subprocess
import time

from tests.conftest import ROOT, alive

SCRIPT = os.path.join(ROOT, "tests", "scripts", "stall.py")
STALL_SECONDS = 5
# Seen, then the others stopped (SIGTERM, SIGKILL 10 s later), with room
# for a loaded machine; gloo's own timeout is 600 s.
BOUND_SECONDS = STALL_SECONDS + 25


def run_and_stop(command, folder, rank, ranks=2):
    """Starts `command`, stops rank `rank` with SIGSTOP once every process
    has trained a step, and waits for the end: (status, stderr, seconds
    from the stop to the end, processes left, every process's pid)."""
    # Its temporary folders in `folder` (TMPDIR), where the tests look for leftovers.
    env = dict(os.environ, AGNOSTIC_STALL_SECONDS=str(STALL_SECONDS), TMPDIR=str(folder),
               AGNOSTIC_CPU_DEVICES=str(ranks),
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "TF_CONFIG"):
        env.pop(name, None)
    process = subprocess.Popen(command, cwd=str(folder), env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    paths = [os.path.join(str(folder), f"pid_{r}") for r in range(ranks)]
    pids = []
    try:
        deadline = time.monotonic() + 240
        while not all(map(os.path.exists, paths)):
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the processes never trained a step"
            time.sleep(0.1)
        pids = [int(open(path).read()) for path in paths]
        os.kill(pids[rank], signal.SIGSTOP)
        stopped = time.monotonic()
        _, stderr = process.communicate(timeout=BOUND_SECONDS + 60)
        elapsed = time.monotonic() - stopped
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for pid in pids:  # never leave a stopped process behind
            if alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return process.returncode, stderr, elapsed, [pid for pid in pids if alive(pid)], pids
