"""A watchdog for a join that holds the interpreter: a forked process that
ends this one after a bound, saying why, unless stopped first."""
import os
import signal
import time


def start(seconds, message):
    """A process that ends this one after `seconds`, saying why, unless
    stopped first. The engine waits inside its runtime holding the
    interpreter, where no thread or signal handler of ours would run.
    `message`: text, or a function giving it then (it may probe peers)."""
    if not hasattr(os, "fork"):
        return None
    parent = os.getpid()
    child = os.fork()
    if child:
        return child
    try:  # the child: only calls that need no lock another thread may hold
        time.sleep(seconds)
        if os.getppid() == parent:
            if callable(message):
                try:
                    message = message()
                except Exception as error:  # the process ends all the same
                    message = f"agnostic: the join timed out ({error})"
            os.write(2, message.encode() + b"\n")
            os.kill(parent, signal.SIGKILL)
    finally:
        os._exit(0)


def stop(watchdog):
    if watchdog:
        os.kill(watchdog, signal.SIGKILL)
        os.waitpid(watchdog, 0)
