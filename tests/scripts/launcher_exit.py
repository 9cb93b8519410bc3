"""The shim's own launcher without an engine, run as
`python launcher_exit.py FOLDER MODE [SECONDS]`: rank 0 starts a second
process running this script (agnostic.launch.local) and ends at once, or,
for MODE "term", waits for SIGTERM.

Rank 1, by MODE: "slow" sleeps SECONDS then writes FOLDER/worker-done;
"fail-late" exits with status 3 after a second; "term" writes
FOLDER/worker-ready, then on SIGTERM writes FOLDER/worker-signalled and exits
with status 143.

MODE "launched" runs under `agnostic launch` (every process has RANK): each
process writes FOLDER/ready-RANK, then on SIGTERM or SIGUSR1 writes
FOLDER/signalled-RANK and exits with status 128 + the signal's number.
"""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agnostic.launch import local  # noqa: E402

FOLDER, MODE = sys.argv[1], sys.argv[2]


def touch(name):
    with open(os.path.join(FOLDER, name), "w"):
        pass


def worker():
    if MODE == "slow":
        time.sleep(float(sys.argv[3]))
        touch("worker-done")
    elif MODE == "fail-late":
        time.sleep(1)
        sys.exit(3)
    elif MODE == "term":
        def stop(signum, frame):
            touch("worker-signalled")
            sys.exit(128 + signum)

        signal.signal(signal.SIGTERM, stop)
        touch("worker-ready")
        time.sleep(60)


def launched():
    rank = os.environ["RANK"]

    def stop(signum, frame):
        touch(f"signalled-{rank}")
        sys.exit(128 + signum)

    for number in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(number, stop)
    touch(f"ready-{rank}")
    time.sleep(60)


if MODE == "launched":
    launched()
elif "RANK" in os.environ:
    worker()
else:
    local.launch(2)
    if MODE == "term":
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
