"""Starts the other processes of a group on this machine by re-running the
user's script, as `python train.py` was started, with rank variables set.

The starting process becomes rank 0. It watches its workers: when one fails,
the others are stopped and rank 0 exits with the failing status; when rank 0
ends, it waits for them (AGNOSTIC_EXIT_SECONDS at most, then stops them, which
is no failure) and exits with the first failing status. Workers are killed by
the kernel if rank 0 dies, so none is left behind. A process that stops
answering (rank 0 watches the workers' heartbeats, the workers rank 0's) is
ended and named within AGNOSTIC_STALL_SECONDS (launch/stalls.py). SIGTERM (and
AGNOSTIC_PREEMPT_SIGNAL) reaching rank 0 is passed on to the workers, and the
run is preempted (agnostic/resume/preemption.py): no worker's end counts as a failure.

Output, as torchrun's: rank 0 is this process, its output untouched; each
worker's standard error reaches this process's, every line prefixed with its
rank ([rank1]: ...), and its standard output is written to a log folder made
in the temp dir, named at the end where a worker wrote there (launch/output.py).
"""
import atexit
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from agnostic import cluster, devices, errors
from agnostic.resume import preemption
from agnostic.launch import early, failures, heartbeat, output, processes, stalls

logger = logging.getLogger("agnostic")
# After rank 0 ends, how long the workers (which run the same script in step
# with it, and may still be writing) may take to end before they are stopped.
EXIT_WAIT_SECONDS = 120
EXIT_VARIABLE = "AGNOSTIC_EXIT_SECONDS"
# After a failure, how long to wait for the others' reports, and how long
# for an earlier one once a process's own failure is known.
SETTLE_SECONDS = 15
OWN_FAILURE_WAIT = 1.0

_launched = []  # the Workers this process started: one group per process


def launch(world_size, local_ranks=None):
    """Starts ranks 1..N-1 once per process; a second model joins that group.

    `local_ranks[r]` is the device index rank r uses (its LOCAL_RANK)."""
    if _launched:
        group = _launched[0].group
        if group.world_size != world_size:
            raise errors.LaunchError(
                f"This process already leads a group of {group.world_size} processes, "
                f"and a process can belong to one group; this call asks for "
                f"{world_size}. Use the same number of devices for every model "
                "of a script."
            )
        return group
    _launched.append(Workers(world_size, local_ranks))
    return _launched[0].group


def report_failures(rank):
    """Uncaught errors of this process go to its group's launcher, which
    shows the first in cause once. Call after the engine's own hook is set
    (torch's prefixes every line of a traceback with the rank)."""
    if _launched:
        failures.install(rank, _launched[0].record)
    elif os.environ.get(failures.REPORTS_VARIABLE):
        folder = os.environ[failures.REPORTS_VARIABLE]
        failures.install(rank, lambda failure: failures.write(folder, failure))


def exit_seconds():
    """How long rank 0 waits for its workers after it ended: AGNOSTIC_EXIT_SECONDS,
    else EXIT_WAIT_SECONDS; a clear error for a value that is not a number >= 0."""
    return cluster.seconds(
        os.environ, EXIT_VARIABLE, EXIT_WAIT_SECONDS,
        f"how long rank 0 waits for its workers after it ended (default {EXIT_WAIT_SECONDS})",
        error=errors.PreemptionSettingError)


def forward(signum, send=True):
    """The run is preempted by `signum`: the workers this process started
    are told (`send`: the signal is passed on to them)."""
    if _launched:
        _launched[0].preempt(signum, send)


class Workers:
    """Ranks 1..N-1, started and watched by rank 0."""

    def __init__(self, world_size, local_ranks=None):
        local_ranks = local_ranks or list(range(world_size))
        self.group = cluster.Environment(
            "agnostic", world_size, 0, local_rank=local_ranks[0], coordinator="127.0.0.1",
            port=processes.free_port(), started_by_scheduler=False, local_world_size=world_size)
        command = processes.script_command()
        self.exit_seconds = exit_seconds()
        self.stall_seconds = stalls.stall_seconds()
        preemption.signals()  # a bad AGNOSTIC_PREEMPT_SIGNAL: said before any start
        self.preempted = 0  # the signal that preempted the run, once one did
        self._exiting = False  # rank 0 has ended: wait() runs
        self.reports = tempfile.mkdtemp(prefix="agnostic-failures-")
        ranks = [(rank, local_ranks[rank]) for rank in range(1, world_size)]
        # Started as torch was imported, where they were (launch/early.py).
        waiting = early.take(world_size)
        if waiting is not None:
            waiting.stop_unused(range(1, world_size))
            self.logs, self.streams = waiting.logs, waiting.streams
            launcher_stderr = waiting.launcher_stderr
        else:
            chosen = output.Output()  # torchrun's default: the shim takes no flags
            self.logs = output.Folder(chosen)  # named at the end, if kept
            self.streams = output.Streams(chosen, self.logs.path)
            # Rank 0's standard error, for a worker to say why it ended a
            # stalled rank 0, whose own output is stopped with it (launch/stalls.py).
            launcher_stderr = processes.duplicate(2) if self.stall_seconds else None
        self.processes = processes.Processes(self.reports, self.stall_seconds)
        for rank, local_rank in ranks:
            environment = dict(os.environ)
            environment.update(
                RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                LOCAL_WORLD_SIZE=str(world_size),
                MASTER_ADDR=self.group.coordinator, MASTER_PORT=str(self.group.port),
                # Every process runs the same script in step, so the workers'
                # warnings (Keras's, agnostic's) repeat rank 0's, once more per
                # worker: rank 0 says them; the workers' go to their log files
                # (_agnostic_hook.warnings_to_log). Their errors reach stderr.
                AGNOSTIC_WARNINGS="log",
            )
            environment.update(devices.thread_variables(world_size))
            environment[failures.REPORTS_VARIABLE] = self.reports
            environment[processes.FINISHED_VARIABLE] = self.reports
            if self.stall_seconds:
                environment[stalls.FOLDER_VARIABLE] = self.reports
            if launcher_stderr is not None:
                environment[stalls.LAUNCHER_STDERR] = str(launcher_stderr)
            if waiting is not None:
                self.processes.add(rank, waiting.go(rank, environment, command))
                continue
            self.processes.add(rank, self.streams.popen(
                rank, local_rank, command, env=environment, stdin=subprocess.DEVNULL,
                preexec_fn=processes.die_with_parent,
                pass_fds=() if launcher_stderr is None else (launcher_stderr,)))
        if launcher_stderr is not None and waiting is None:
            os.close(launcher_stderr)
        if self.stall_seconds:  # rank 0's beats, for the workers to watch
            heartbeat.Beat(self.reports, 0, self.stall_seconds)  # its folder is new: no error
        self._own_failure = None  # rank 0's uncaught exception
        self._ended = threading.Lock()  # one thread ends the group
        self._done = False  # every worker ended well: nothing left to watch
        atexit.register(self.wait)
        # Outside fit (whose own handler stops at a step), a preempting
        # signal ends rank 0 through its exit hooks: the workers are told
        # and waited for, and the reports folder removed.
        if all(h in (signal.SIG_DFL, None) for h in map(signal.getsignal, preemption.signals())):
            preemption.handle(self._signalled)
        threading.Thread(target=self._watch, name="agnostic-workers", daemon=True).start()

    def preempt(self, signum, send=True):
        """The run is preempted by `signum`; `send`: pass it on to the workers."""
        self.preempted = self.preempted or signum
        if send:
            self.processes.send(signum)

    def _signalled(self, signum, frame):
        self.preempt(signum)
        if not self._exiting:  # else wait() is waiting for the workers already
            raise SystemExit(preemption.status(signum))

    def record(self, failure):
        """Rank 0's uncaught exception, shown with the others' at exit."""
        self._own_failure = failure

    def _failures(self):
        """Every failure known now: reports, and workers ended without one."""
        reported = failures.read(self.reports)
        found = [self._own_failure] if self._own_failure else []
        for rank in self.processes.by_rank:
            code = self.processes.code(rank)
            if rank in reported:
                found.append(reported[rank])
            elif code not in (None, 0):
                found.append(failures.from_status(rank, code))
        return found

    def _settle(self):
        """Waits until the failure that came first in cause is known: every
        process has ended or reported, or one failure of its own was seen a
        moment ago, or SETTLE_SECONDS passed."""
        began = time.monotonic()
        own_seen = None
        while time.monotonic() - began < SETTLE_SECONDS:
            found = self._failures()
            if own_seen is None and any(f.own for f in found):
                own_seen = time.monotonic()
            settled = len(found) == len(self.processes) + 1
            if settled or (own_seen and time.monotonic() - own_seen > OWN_FAILURE_WAIT):
                return found
            time.sleep(processes.POLL_SECONDS / 4)
        return self._failures()

    def _end_in_failure(self):
        """Names the first failure, shows its traceback, stops the group, and
        ends this process with that failure's status."""
        found = self._settle()
        first = failures.first_in_cause(found)
        if first.details:
            sys.stderr.write(first.details)
        code = self._status(first.rank)
        logger.error("agnostic: %s: %s. Stopping the others.",
                     self._describe(first.rank, code), first.summary.rstrip("."))
        for other in found:
            if other is not first:
                cause = "after a peer had ended" if not other.own else "also"
                logger.error("agnostic: %s %s: %s", self._describe(other.rank),
                             cause, other.summary)
        self.processes.stop()
        self._close_output()
        sys.stderr.flush()
        shutil.rmtree(self.reports, ignore_errors=True)
        os._exit(processes.exit_status(code) if code else 1)

    def _status(self, rank):
        """A worker's exit status, once it has exited (it reports first)."""
        if rank not in self.processes.by_rank:
            return None
        try:
            return self.processes.by_rank[rank].wait(timeout=processes.GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            return None

    def _describe(self, rank, code=None):
        size = len(self.processes) + 1
        if rank == 0:
            return f"rank 0 of {size} (process {os.getpid()}, the launcher) failed"
        who = f"worker process {self.processes.by_rank[rank].pid} (rank {rank} of {size})"
        return f"{who} exited with status {code}" if code is not None else f"{who} failed"

    def _watch(self):
        # A worker preempted ends after the step every process stops at:
        # rank 0 stops there too (it may still be writing the backup).
        outcome = self.processes.supervise(lambda: self.preempted, self._report_silent)
        if outcome.kind == "ended":
            return
        with self._ended:
            if self._done:  # wait() found every worker ended well
                return
            self._end_in_failure()

    def _report_silent(self, silent):
        """A worker that stopped answering is ended, its report saying why."""
        failures.write(self.reports, failures.Failure(
            silent.rank, True, silent.summary(self.stall_seconds), time=time.time()))

    def wait(self):
        """At rank 0's exit: wait for the workers, exit with their status."""
        self._exiting = True
        if self._own_failure is not None:
            with self._ended:
                self._end_in_failure()
        deadline = time.monotonic() + self.exit_seconds
        stopped = False
        while not self.processes.ended():
            if time.monotonic() > deadline:
                # Rank 0 ended well: the workers' late end is no failure.
                logger.warning(
                    "agnostic: rank 0 has ended; worker processes %s still running "
                    "%g s later (%s) are stopped now.",
                    ", ".join(str(p.pid) for p in self.processes if p.poll() is None),
                    self.exit_seconds, EXIT_VARIABLE)
                stopped = True
                break
            time.sleep(processes.POLL_SECONDS)
        with self._ended:
            if self.processes.failed(self.preempted) is not None:
                self._end_in_failure()
            self._done = True
        if stopped:
            self.processes.stop()
        self._close_output()
        shutil.rmtree(self.reports, ignore_errors=True)

    def _close_output(self):
        """The workers' last lines, once they have ended; the log folder's
        empty files removed (the folder too, when nothing is left)."""
        self.streams.close()
        self.logs.finish()
        kept = self.logs.kept()
        if kept:
            logger.warning("agnostic: %s.", kept)
