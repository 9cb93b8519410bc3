"""A worker started early (launch/early.py), run as `python -m
agnostic._waiting`: it imports Keras and its engine beside rank 0,
then waits for its rank's variables, running none of the program. Told, it
takes them, the working folder and the command line rank 0 would have
started it with, and runs the script (or `-m` module) as `python train.py`
runs it: as __main__, with its arguments and its folder first on sys.path.
Told nothing (its pipe closed: not needed), it ends with status 0.
"""
import json
import os
import runpy
import signal
import sys

from agnostic.launch import early


def _message(descriptor):
    """Rank 0's message: one line (not to the pipe's end, which a process
    rank 0 forked meanwhile, a data loader's worker, may hold open too);
    None once the pipe is closed without one."""
    with os.fdopen(descriptor, "rb") as pipe:
        line = pipe.readline()
    return json.loads(line.decode()) if line.endswith(b"\n") else None


def _imported_otherwise(environment):
    """Whether a variable read at import has another value in `environment`
    than in this process, whose imports (the engines set some) are done."""
    names = set(environment) | set(os.environ)
    return any(name.startswith(early.READ_AT_IMPORT) and
               environment.get(name) != os.environ.get(name) for name in names)


def _run(arguments):
    """Runs `python <arguments>`'s program in this interpreter."""
    if arguments[0] == "-m":
        sys.argv = arguments[1:]  # runpy puts the module's file first
        sys.path[0] = os.getcwd()
        runpy.run_module(arguments[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(arguments)
        sys.path[0] = os.path.dirname(arguments[0])
        runpy.run_path(arguments[0], run_name="__main__")


def _program_frames(trace):
    """The traceback from the program's first frame on (not this module's
    or runpy's), as Python shows a script's."""
    skipped = {_run.__code__.co_filename, runpy.run_path.__code__.co_filename}
    while trace.tb_next is not None and trace.tb_frame.f_code.co_filename in skipped:
        trace = trace.tb_next
    return trace


def main():
    descriptor = int(os.environ.pop(early.PIPE_VARIABLE))
    # Ctrl-C while waiting is rank 0's to act on: it ends this process with it.
    interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import keras  # noqa: F401  (the import this process starts early for)
    except Exception:  # the program's own import says what is wrong
        pass
    message = _message(descriptor)
    if message is None:
        return 0
    os.chdir(message["directory"])
    environment, command = message["environment"], message["command"]
    if _imported_otherwise(environment):
        # As a worker started at the compile line: this process, afresh.
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # an ignored one would stay so
        os.execve(command[0], command, environment)
    signal.signal(signal.SIGINT, interrupt)
    os.environ.clear()
    os.environ.update(environment)
    from agnostic import _startup

    # What the start-up does as a worker imports its engine: join the job.
    _startup.install(imported=True)
    try:
        _run(command[1:])
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:
        kind, value, trace = sys.exc_info()
        trace = _program_frames(trace)
        value.__traceback__ = trace
        sys.last_type, sys.last_value, sys.last_traceback = kind, value, trace
        sys.excepthook(kind, value, trace)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
