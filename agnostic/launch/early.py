"""The shim's workers, started before they are needed: as a torch program
that names agnostic imports torch, the process that will be rank 0 starts
one process per other device (the CPU split's count, else the GPUs torch
sees; agnostic/_startup.py decides). Each imports Keras and torch beside
rank 0, then waits, running none of the program, until
backend_agnostic_compile hands it its rank's variables; then it runs the
script as a worker started there would (agnostic/_waiting.py). Without this the
workers would begin importing only once rank 0 reached the compile line.

What was started and is not needed (the plan wants fewer processes, or none,
or the program never compiles) is stopped before it runs any of the program.
Where a variable the engines read as they are imported differs between the
waiting process and what rank 0 hands over (the program set KERAS_BACKEND
after importing torch, say), the waiting process starts the script afresh,
as a worker started at the compile line. AGNOSTIC_START_EARLY=0 turns it off.
"""
import atexit
import json
import logging
import os
import subprocess
import sys

from agnostic import cluster, devices
from agnostic.launch import output, processes, stalls

logger = logging.getLogger("agnostic")
VARIABLE = "AGNOSTIC_START_EARLY"
# The pipe a waiting process reads its rank's variables from (agnostic/_waiting.py).
PIPE_VARIABLE = "AGNOSTIC_WAITING_PIPE"
# Variables that the engines (and Python) read as they are imported: where
# one differs from what rank 0 hands over, the waiting process imported with
# another value, and starts again (agnostic/_waiting.py).
READ_AT_IMPORT = ("KERAS_", "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_", "OMP_", "MKL_", "KMP_",
                  "OPENBLAS_", "LD_", "PYTHON", "TF_", "XLA_", "JAX_", "AGNOSTIC_CPU_DEVICES",
                  "AGNOSTIC_JOIN", "AGNOSTIC_WARNINGS")

_started = []  # this process's Waiting group, until it is taken or dismissed
_tried = []  # once per process


def setting(environ=None):
    """AGNOSTIC_START_EARLY as a bool (default True); a LaunchError for any
    value but 0 or 1."""
    environ = os.environ if environ is None else environ
    return cluster.switch(
        environ, VARIABLE, "start the other processes of a torch job as torch is "
        "imported, the default", "start them at backend_agnostic_compile") != "0"


def tried():
    """Whether this process has started its workers early already (once)."""
    return bool(_tried)


def start(count):
    """Starts the processes of ranks 1..count-1 to wait, once per process."""
    if _tried or count < 2:
        return
    _tried.append(count)
    _started.append(Waiting(count))


def take(world_size):
    """The waiting processes, handed over to the launcher of a job of
    `world_size` processes (None: none wait, or too few: they are stopped)."""
    if not _started:
        return None
    waiting = _started.pop()
    if world_size > waiting.count:
        logger.debug("agnostic: %d worker processes were started early, %d are needed: "
                     "they are started again.", waiting.count - 1, world_size - 1)
        waiting.dismiss()
        return None
    atexit.unregister(waiting.dismiss)  # the workers' launcher owns them now
    return waiting


def dismiss():
    """Stops the waiting processes, if any: the plan starts none."""
    if _started:
        _started.pop().dismiss()


class Waiting:
    """Ranks 1..count-1 of a job on this machine, each waiting for its rank's
    variables; their output is routed as the workers' (launch/output.py)."""

    def __init__(self, count):
        self.count = count
        # Rank 0's standard error, for a worker that ends a stalled rank 0
        # (launch/stalls.py); the fd's number holds in the workers.
        self.launcher_stderr = processes.duplicate(2) if stalls.stall_seconds() else None
        self.output = output.Output()  # torchrun's default: the shim takes no flags
        self.logs = output.Folder(self.output)
        self.streams = output.Streams(self.output, self.logs.path)
        self.pipes = {}  # rank -> the write end of its pipe
        self.by_rank = {}
        command = [sys.executable, "-m", "agnostic._waiting"]
        for rank in range(1, count):
            read, write = os.pipe()
            environment = dict(os.environ, AGNOSTIC_WARNINGS="log")
            environment.update(devices.thread_variables(count))
            environment[PIPE_VARIABLE] = str(read)
            kept = (read,) if self.launcher_stderr is None else (read, self.launcher_stderr)
            try:
                self.by_rank[rank] = self.streams.popen(
                    rank, rank, command, env=environment, stdin=subprocess.DEVNULL,
                    preexec_fn=processes.die_with_parent, pass_fds=kept)
            finally:
                os.close(read)
            self.pipes[rank] = write
        if self.launcher_stderr is not None:
            os.close(self.launcher_stderr)
        atexit.register(self.dismiss)
        logger.debug("agnostic: started %d worker process(es) early: %s", count - 1,
                     ", ".join(str(p.pid) for p in self.by_rank.values()))

    def go(self, rank, environment, command):
        """Rank `rank`'s process, told to run `command` (the script's, as a
        worker starts) with `environment`."""
        write = self.pipes.pop(rank)
        message = {"command": command, "environment": environment, "directory": os.getcwd()}
        try:
            with os.fdopen(write, "wb") as pipe:
                pipe.write(json.dumps(message).encode() + b"\n")  # one line
        except OSError:  # it ended meanwhile: its status says why, as a worker's
            pass
        return self.by_rank[rank]

    def stop_unused(self, used):
        """Stops the processes that still wait, except those of ranks `used`:
        they ran none of the program."""
        for rank in sorted(set(self.pipes) - set(used)):
            os.close(self.pipes.pop(rank))
            process = self.by_rank.pop(rank)
            process.kill()
            process.wait()

    def dismiss(self):
        """Stops every process that still waits, closes their output and
        removes their log folder (empty: they ran nothing); once."""
        atexit.unregister(self.dismiss)
        self.stop_unused(())
        self.streams.close()
        self.logs.finish()
