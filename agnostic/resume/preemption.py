"""Preemption: SIGTERM (and AGNOSTIC_PREEMPT_SIGNAL) ends `fit` at a step
every process agrees on, with the backup written at that step.

SLURM, Kubernetes and spot machines send SIGTERM (SLURM's `--signal=USR1@90`
another signal) some time before they kill. While a returned model's `fit`
runs, agnostic catches those signals (only there: a program that never calls
it gets no handler, and the program's own handlers are back after fit). The
step being trained finishes; after each step the processes combine their
"stop requested" flags with the engine's collectives (one small all-reduce:
a signal may reach them at different steps; torch's runs during the next
step, so that it costs no time; JAX's and TensorFlow's, which block, run
every BLOCKING_EVERY steps), so all stop after the same step: on one
process the one that ends as the signal arrives, on several a few later.
BackupAndRestore, where the script uses it, writes its backup at that step
(epoch and step), and the process exits with status 128 + the signal's
number (143 for SIGTERM), as a shell reports a process ended by it: SLURM,
Kubernetes and torchrun read it as a failure to restart from. The rerun
resumes at that step (see agnostic/compat/fit_resume.py).
"""
import logging
import os
import signal
import threading
import warnings

from agnostic import errors, methods

logger = logging.getLogger("agnostic")

VARIABLE = "AGNOSTIC_PREEMPT_SIGNAL"
_UNCATCHABLE = ("SIGKILL", "SIGSTOP")
# Where the agreement blocks (JAX's allgather, TensorFlow's reduce), the
# processes agree once every this many train-function calls, so that a
# collective's latency is not added to every step; torch's runs during the
# next step and agrees after each.
BLOCKING_EVERY = 10
_active = []  # the Watch of the fit running in this process, if any


def chosen_signal():
    """The signal AGNOSTIC_PREEMPT_SIGNAL names (None when unset); a clear
    error for a value that is not a signal agnostic can catch."""
    value = os.environ.get(VARIABLE, "").strip()
    if not value:
        return None
    name = value.upper()
    try:
        number = signal.Signals(int(name)) if name.isdigit() else None
    except ValueError:
        number = None
    if number is None and not name.isdigit():
        name = name if name.startswith("SIG") else "SIG" + name
        number = getattr(signal.Signals, name, None) if hasattr(signal, name) else None
    if number is None or number.name in _UNCATCHABLE:
        raise errors.PreemptionSettingError(
            f"{VARIABLE} must name a signal a process can catch, such as USR1 "
            "(SLURM's --signal=USR1@90), SIGUSR2, TERM or a number; KILL and STOP "
            f"cannot be caught. Received: {VARIABLE}={value!r}"
        )
    return number


def signals():
    """The signals that preempt a run: SIGTERM and the chosen one."""
    chosen = chosen_signal()
    return [signal.SIGTERM] + ([chosen] if chosen not in (None, signal.SIGTERM) else [])


def status(signum):
    """The exit status of a process preempted by `signum`: 128 + its number."""
    return 128 + int(signum)


def is_preempted_status(code, forwarded=None):
    """Whether exit status `code` (as Popen gives it) is a preempted process's:
    128 + a preempting signal's number, or killed by `forwarded`, a signal its
    launcher forwarded to it (before its fit caught signals)."""
    if code is None:
        return False
    if forwarded and code == -int(forwarded):
        return True
    return any(code == status(s) for s in signals())


def handle(handler):
    """Installs `handler` for the preempting signals; returns the previous
    handlers, for `restore`. Nothing outside the main thread (Python allows
    handlers only there)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {s: signal.signal(s, handler) for s in signals()}


def restore(previous):
    for number, handler in previous.items():
        signal.signal(number, handler if handler is not None else signal.SIG_DFL)


class Watch:
    """One fit's preemption: the signals it caught, the step it stopped at.

    `world`: the number of processes; with several, `agree(flag)` (the
    engine's all-reduce, see `_agreement`) makes every process stop after the
    same step. `forward(signum)`: passes a caught signal on to processes this
    one started (the shim's own launcher)."""

    def __init__(self, world=1, is_chief=True, forward=None, barrier=None):
        self.world, self.is_chief, self.forward = world, is_chief, forward
        self.barrier = barrier  # every process waits there before it exits
        self.requested = 0  # the signal caught here, if any
        self.stopped = 0  # the signal every process stopped for, if any
        self.saved = False  # BackupAndRestore wrote the stopping step
        self.skip = 0  # batches of the first epoch already trained (resume)
        self.skipped = False  # the last train-function call skipped its batches
        self._quieted = []  # the program's callbacks, told only of trained batches
        self._previous = {}
        self._agree = None
        self._every = 1  # train-function calls between two agreements
        self._calls = 0
        self._unwrap = None

    def __enter__(self):
        signals()  # a bad AGNOSTIC_PREEMPT_SIGNAL: said before any work
        self._previous = handle(self._caught)
        _active.append(self)
        return self

    def callbacks(self, callbacks):
        """fit's `callbacks` with the one that wraps its train function first;
        the program's own hear only of the batches this fit trains (not of a
        resumed epoch's batches that a backup had trained, which fit takes
        from the data and skips)."""
        given = list(callbacks or [])
        programs = [c for c in given if not type(c).__module__.startswith("agnostic.")]
        return [_stepper(self)] + given + [_quieter(self, programs)]

    def _quiet_while_skipping(self, callback):
        def before(hook):  # the call about to run skips while batches are left
            def run(*args, **kwargs):
                return None if self.skip > 0 else hook(*args, **kwargs)

            return run

        def after(hook):
            def run(*args, **kwargs):
                return None if self.skipped else hook(*args, **kwargs)

            return run

        methods.wrap_method(callback, "on_train_batch_begin", before)
        methods.wrap_method(callback, "on_train_batch_end", after)
        self._quieted.append(callback)

    def __exit__(self, kind, value, trace):
        _active.remove(self)
        restore(self._previous)
        for callback in self._quieted:
            methods.unwrap(callback)
        if self._unwrap is not None:
            self._unwrap()
        if kind is None and self._agree is not None:
            self._agree(None)  # no collective left running after fit
        if kind is None:
            self._finish()
        return False

    def _caught(self, signum, frame):
        # Only a flag here: the step running ends first, then every process
        # stops after the same one (after_step).
        if not self.requested:
            self.requested = signum
        if self.forward is not None:
            self.forward(signum, send=True)

    def after_step(self, model):
        """Called after each training step (by the wrapped train function)."""
        flag = self.requested
        if self.world > 1:
            if self._agree is None:
                self._agree, self._every = _agreement()
            self._calls += 1
            if self._calls % self._every:
                return  # every process agrees after the same calls only
            flag = self._agree(flag)
        if flag and not self.stopped:
            self.stopped = flag
            model.stop_training = True
            if self.forward is not None:  # its workers stop too: none failed
                self.forward(flag, send=False)

    def _finish(self):
        """After fit: a process preempted exits; a signal that came as fit
        ended goes to the handler the program had."""
        if self.stopped:
            name = signal.Signals(self.stopped).name
            if self.is_chief:
                if self.saved:
                    logger.warning("agnostic: %s: training stopped after the same step on "
                                   "every process, backup written; exiting with status %d. "
                                   "Run the same command again to resume.",
                                   name, status(self.stopped))
                else:
                    warnings.warn(
                        f"agnostic: {name}: training stopped after the same step on every "
                        "process, but nothing was saved: the script uses no "
                        "keras.callbacks.BackupAndRestore. Add one to fit's callbacks to "
                        f"resume where it stopped. Exiting with status {status(self.stopped)}.",
                        errors.PreemptedWarning, stacklevel=3)
            # Already ending as preempted: another preempting signal (a
            # scheduler ending the other tasks once the first has exited,
            # as srun --kill-on-bad-exit does) changes nothing now.
            handle(signal.SIG_IGN)
            if self.barrier is not None and self.world > 1:
                # None exits before the chief has written the backup: a
                # scheduler ends the others at the first task's exit
                # (srun --kill-on-bad-exit, a TFJob's failed pod).
                self.barrier()
            raise SystemExit(status(self.stopped))
        if self.requested:
            handler = self._previous.get(self.requested, signal.SIG_DFL)
            if handler in (signal.SIG_DFL, None):
                raise SystemExit(status(self.requested))
            if callable(handler):
                handler(self.requested, None)


def _quieter(watch, callbacks):
    """The callback that, last to begin, quiets the program's `callbacks`
    for the batches fit skips, where a backup restored inside an epoch (its
    on_train_begin, before this one's, set `watch.skip`)."""
    import keras

    class Quieter(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            if watch.skip > 0:
                for callback in callbacks:
                    watch._quiet_while_skipping(callback)

    return Quieter()


def _stepper(watch):
    """The callback that wraps fit's train function as training begins
    (fit has made it by then: agnostic/compat/fit_resume.py)."""
    import keras

    from agnostic.compat import fit_resume

    class Stepper(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            watch._unwrap = fit_resume.wrap(self.model, watch)

    return Stepper()


def supported():
    """Whether fit can stop at a step here: Keras 3 on TensorFlow, JAX or
    torch (compat/fit_resume.py); keras-mxnet's fit keeps its own loop."""
    import keras

    return keras.backend.backend() in ("tensorflow", "jax", "torch") and \
        not keras.__version__.startswith("2.")


def current():
    """The Watch of the fit running in this process, or None."""
    return _active[-1] if _active else None


def stopping():
    watch = current()
    return bool(watch and watch.stopped)


def _agreement():
    """(`agree`, the calls between two agreements). `agree(flag)` is the
    engine's all-reduce of one small integer over every process: the
    largest (a signal's number) where any process caught one, else 0.
    torch's runs during the next step and answers then (for the previous
    step's flags); `agree(None)` only ends the one running."""
    import keras

    backend = keras.backend.backend()
    if backend == "torch":
        import torch
        import torch.distributed as dist

        pending = []  # the all-reduce started after the previous step

        def agree(flag):
            # Started now, read after the next step: its time hides behind
            # that step's (all processes read it after the same step).
            agreed = 0
            if pending:
                value, work = pending.pop()
                work.wait()
                agreed = int(value.item())
            if flag is not None and not agreed:
                value = torch.tensor([int(flag)], dtype=torch.int64)
                pending.append((value, dist.all_reduce(value, op=dist.ReduceOp.MAX,
                                                       async_op=True)))
            return agreed

        return agree, 1
    if backend == "jax":
        import numpy as np
        from jax.experimental import multihost_utils

        def agree(flag):
            if flag is None:  # nothing left running
                return 0
            flags = multihost_utils.process_allgather(np.array([int(flag)], np.int32))
            return int(np.max(flags))

        return agree, BLOCKING_EVERY
    if backend == "tensorflow":
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()  # fit runs in the workers' scope

        def agree(flag):
            if flag is None:  # nothing left running
                return 0
            # The strategy sums (no maximum): every replica adds (caught, signal).
            values = strategy.experimental_distribute_values_from_function(
                lambda context: tf.constant([int(flag > 0), int(flag)], tf.int32))
            caught, total = strategy.reduce("SUM", values, axis=None).numpy().tolist()
            agreed = round(total / caught) if caught else 0
            return agreed if agreed in signals() else (int(signal.SIGTERM) if caught else 0)

        return agree, BLOCKING_EVERY
    return (lambda flag: flag), 1
