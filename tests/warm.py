"""Program runs from a warm interpreter: one process per test worker imports
Keras and its engine once, then forks a child per run, which runs the
program's script as `python script MODE FOLDER` would.

Importing Keras with its engine is most of a short run (6-8 s of CPU on 2
cores); the child of a fork starts where a fresh process is once it has
imported Keras, and runs the script from its first line. The engines start
nothing at import (TensorFlow's and JAX's runtimes, torch's thread pools
start at first use, in the child), and agnostic is not imported: the
harness (tests/programs/harness.py) imports it after Keras, as in a fresh
process, where the start-up hook leaves a script that does not name
agnostic alone. torch's other processes are started by the child as by a
fresh one: fresh processes. The child ends as Python ends a process (an
uncaught exception through the program's excepthook, its threads joined,
then its exit handlers, where torch's launcher waits for its workers), and
the exit status comes back. tests/test_programs.py checks that a warm run,
plain and through agnostic, gives a fresh process's weights and logs bit for
bit on every engine.

Only a run whose variables are the program's own (PROGRAM_*) or the
harness's (read as the program runs) comes from here: a variable the engine,
Keras or agnostic's start-up hook reads at import needs a fresh process, as
does a script that names agnostic itself (in a fresh process the start-up
hook imports agnostic as the engine is imported).
"""
import json
import os
import re
import selectors
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The warm interpreter: it reads one request per line, forks, and answers
# with the child's pid, then its exit status.
_SERVE = r"""
import atexit, json, os, runpy, sys, threading
import keras, numpy, sklearn.datasets
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgid(0, 0)
            with open(request["stdout"], "w") as out, open(request["stderr"], "w") as err:
                os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
            os.environ.update(request["env"])
            sys.argv = [request["script"]] + request["arguments"]
            sys.path[0] = os.path.dirname(os.path.abspath(request["script"]))
            atexit._clear()  # this interpreter's; the run's own run at its end
            try:
                runpy.run_path(request["script"], run_name="__main__")
                code = 0
            except SystemExit as end:
                if end.code is None or isinstance(end.code, int):
                    code = end.code or 0
                else:
                    print(end.code, file=sys.stderr)
            except BaseException:
                # As Python ends on an uncaught exception: the program's
                # excepthook (agnostic's failure reports) and sys.last_value.
                sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
                sys.excepthook(*sys.exc_info())
            # As Python ends: its threads joined, then its exit handlers (a
            # launcher's wait for its workers, a process group's end).
            threading._shutdown()
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
    print(json.dumps({"pid": pid}), flush=True)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    print(json.dumps({"status": code}), flush=True)
"""

_SERVER = []  # this test process's warm interpreter, started at first use
_BUFFER = {}  # what it wrote past its last answer, by pid


# The harness's variables for agnostic's runs (tests/programs/harness.py), read
# as the program runs: a plain run is the same whatever they say.
HARNESS = ("AGNOSTIC_TEST_REPLICAS", "AGNOSTIC_TEST_SYNC_BATCH_NORM")


def serves(script, env):
    """Whether a run of `script` with these variables may come from the warm
    interpreter: a script that names agnostic starts fresh (see above)."""
    from agnostic import _agnostic_hook

    if not all(key.startswith("PROGRAM_") or key in HARNESS for key in env):
        return False
    with open(script, encoding="utf-8") as handle:
        return re.search(_agnostic_hook._IMPORTS_AGNOSTIC, handle.read()) is None


def run(script, arguments, env, outputs, timeout=600):
    """Runs `script arguments` in a fork of the warm interpreter, with `env`
    added to its variables; stdout and stderr go to `outputs` + .out/.err.
    Returns (exit status, stdout, stderr)."""
    server = _server()
    request = {"script": script, "arguments": [str(a) for a in arguments], "env": env,
               "stdout": outputs + ".out", "stderr": outputs + ".err"}
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()
    pid = _answer(server, 60)["pid"]
    try:
        status = _answer(server, timeout)["status"]
    except TimeoutError:
        os.killpg(pid, signal.SIGKILL)
        _answer(server, 60)
        raise
    with open(outputs + ".out") as out, open(outputs + ".err") as err:
        return status, out.read(), err.read()


def _server():
    if _SERVER and _SERVER[0].poll() is None:
        return _SERVER[0]
    server = subprocess.Popen([sys.executable, "-c", _SERVE], cwd=ROOT, text=True,
                              bufsize=1, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL)
    _SERVER[:] = [server]
    _answer(server, 300)
    return server


def _answer(server, timeout):
    """The server's next line, read from its pipe's descriptor (a buffered
    reader could hold the next answer where select does not see it)."""
    buffer = _BUFFER.setdefault(server.pid, bytearray())
    with selectors.DefaultSelector() as selector:
        selector.register(server.stdout, selectors.EVENT_READ)
        while b"\n" not in buffer:
            if not selector.select(timeout):
                raise TimeoutError(f"the warm interpreter did not answer in {timeout} s")
            chunk = os.read(server.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError(f"the warm interpreter ended ({server.wait()})")
            buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return json.loads(line)


def stop():
    """Ends the warm interpreter, if one was started (its stdin closes)."""
    for server in _SERVER:
        server.stdin.close()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    _SERVER.clear()
