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
agnostic alone. The workers torch's launcher starts for agnostic's run
are forks too, of a second warm interpreter that imported torch with the
thread variables a worker gets (see _server); the child's sys.executable is
the client that asks for them. The child ends as Python ends a process (an
uncaught exception through the program's excepthook, its threads joined,
then its exit handlers, where torch's launcher waits for its workers), and
the exit status comes back. tests/test_programs.py checks that a warm run
through agnostic gives a fresh process's weights and logs bit for bit on
every engine (a plain run comes from the same fork).

Only a run whose variables are the program's own (PROGRAM_*) or the
harness's (read as the program runs) comes from here, in a test process
whose own variables are still those the warm interpreter started with: a
variable the engine, Keras or agnostic's start-up hook reads at import needs
a fresh process. A script that names agnostic comes from here too: in a
fresh process the start-up hook imports agnostic as the engine is imported,
here the script's own import line does, after Keras, as the harness imports
it for every program, and agnostic sets the engine up the same either way
(tests/test_programs.py checks both bit for bit). Not on torch where
the shim's workers start as torch is imported (AGNOSTIC_START_EARLY): that
needs the import to come after the start-up hook, in a fresh process.
"""
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The warm interpreter: it reads one request per line on stdin, forks, and
# answers with the child's pid, then its exit status. A worker comes through
# its socket: the client (_CLIENT) sends the worker's command, variables,
# folder and standard streams, and gets the same answers there.
_SERVE = r"""
import atexit, json, os, runpy, selectors, signal, socket, sys, threading
import keras, numpy

folder = sys.argv[1]
listener = socket.socket(socket.AF_UNIX)
listener.bind(os.path.join(folder, "socket"))
listener.listen(16)
selector = selectors.DefaultSelector()
selector.register(0, selectors.EVENT_READ, "request")
selector.register(listener, selectors.EVENT_READ, "worker")
print(json.dumps({"ready": True}), flush=True)


def run(request, streams=None, client=None):
    # The child: the run `python script ARGUMENTS` makes, from its first line.
    code = 1
    try:
        os.setpgid(0, 0)
        selector.close(), listener.close()
        if streams:
            for target, stream in enumerate(streams):
                os.dup2(stream, target)
                os.close(stream)
            os.environ.clear()
            os.chdir(request["cwd"])
        else:
            with open(request["stdout"], "w") as out, open(request["stderr"], "w") as err:
                os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        os.environ.update(request["env"])
        if client:  # torch's launcher starts its workers through the client
            sys.executable = client
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


def status(pid):
    ended, code = os.waitpid(pid, os.WNOHANG)
    if not ended:
        return None
    return -os.WTERMSIG(code) if os.WIFSIGNALED(code) else os.WEXITSTATUS(code)


def answer(connection, message):
    try:
        connection.sendall((json.dumps(message) + "\n").encode())
    except OSError:  # the client has gone
        pass


buffer, program, workers = b"", None, {}
while True:
    for key, _ in selector.select(0.05):
        if key.data == "request":
            chunk = os.read(0, 65536)
            if not chunk:
                sys.exit(0)
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    run(request, client=request["client"])
                program = pid
                print(json.dumps({"pid": pid}), flush=True)
        elif key.data == "worker":
            connection, _ = listener.accept()
            connection.settimeout(30)
            _, streams, _, _ = socket.recv_fds(connection, 1, 3)
            data = chunk = b"-"
            while chunk and not data.endswith(b"\n"):
                chunk = connection.recv(65536)
                data += chunk
            if not chunk:  # the client has gone
                connection.close(), [os.close(stream) for stream in streams]
                continue
            pid = os.fork()
            if pid == 0:
                run(json.loads(data[1:]), streams)
            for stream in streams:
                os.close(stream)
            workers[pid] = connection
            with open(os.path.join(folder, "served"), "a") as served:
                served.write(f"{pid}\n")
            selector.register(connection, selectors.EVENT_READ, pid)
            answer(connection, {"pid": pid})
        elif not key.fileobj.recv(1):
            # The client ended before its worker: as at its parent's death
            # (the launcher's PDEATHSIG), the worker is killed.
            selector.unregister(key.fileobj)
            try:
                os.killpg(key.data, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for pid in list(workers):
        code = status(pid)
        if code is not None:
            connection = workers.pop(pid)
            if connection in (key.fileobj for key in selector.get_map().values()):
                selector.unregister(connection)
            answer(connection, {"status": code})
            connection.close()
    if program is not None:
        code = status(program)
        if code is not None:
            print(json.dumps({"status": code}), flush=True)
            program = None
"""

# A worker of torch's launcher (agnostic/launch/local.py starts `sys.executable
# script ARGUMENTS` in the environment it made), or a process of a job a test
# starts by hand (python()): its run comes from the warm interpreter as the
# program's did, where only the variables the client allows changed.
# Anything else, the interpreter itself.
_CLIENT = r"""#!{python} -IS
import json, os, signal, socket, sys
PYTHON, FOLDER, RUNTIME = {python!r}, {folder!r}, {runtime!r}
arguments = sys.argv[1:]
with open(os.path.join(FOLDER, "variables.json")) as handle:
    warm = json.load(handle)
changed = {{key for key in set(warm) | set(os.environ) if warm.get(key) != os.environ.get(key)}}
if (not arguments or arguments[0].startswith("-") or not os.path.isfile(arguments[0])
        or not all(key in RUNTIME or key.startswith("PROGRAM_") for key in changed)):
    os.execv(PYTHON, [PYTHON] + arguments)
connection = socket.socket(socket.AF_UNIX)
connection.connect(os.path.join(FOLDER, "socket"))
request = {{"script": arguments[0], "arguments": arguments[1:], "env": dict(os.environ),
            "cwd": os.getcwd()}}
socket.send_fds(connection, [b"r"], [0, 1, 2])
connection.sendall((json.dumps(request) + "\n").encode())
answers = connection.makefile()
pid = json.loads(answers.readline())["pid"]
for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
               signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(number, lambda number, frame: os.kill(pid, number))
code = json.loads(answers.readline())["status"]
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""

_SERVERS = {}  # this test process's warm interpreters by kind, started at first use
# The engines whose runs come from here (keras-mxnet's, on Python 3.8, start
# fresh).
KERAS_3_ENGINES = ("tensorflow", "jax", "torch")
# The test process's variables as this module is imported, before any test
# sets its own.
_SESSION = dict(os.environ)
_BUFFER = {}  # what it wrote past its last answer, by pid
_FOLDERS = {}  # their sockets and the workers' client, by kind
LAST = {"workers": 0}  # the workers forked for the last run


# The harness's variables for agnostic's runs (tests/programs/harness.py), read
# as the program runs: a plain run is the same whatever they say.
HARNESS = ("AGNOSTIC_TEST_REPLICAS", "AGNOSTIC_TEST_SYNC_BATCH_NORM",
           "AGNOSTIC_TEST_GLOBAL_VIEW")
# Read as the program runs too, but a plain run reports more where it is set
# (what each device holds): a run may come from here with it, and the plain
# runs shared between tests are told apart by it (tests/conftest.py).
READ_AS_IT_RUNS = HARNESS + ("AGNOSTIC_TEST_SHARD",)
# The test process's own variables that may differ from those the warm
# interpreters started with (pytest sets this one for each test).
PER_TEST = ("PYTEST_CURRENT_TEST",)
# What torch's launcher (agnostic/launch/local.py) adds to a worker's
# variables that is read as the program runs, not as Python starts or the
# engine is imported: a worker with these changed comes from a fork. (The
# heartbeat's variables are read as the engine is imported, which a fork of
# the warm interpreter has done already: its workers do not beat, and rank 0
# watches only the workers that do.)
RUNTIME = READ_AS_IT_RUNS + PER_TEST + (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "AGNOSTIC_WARNINGS", "AGNOSTIC_FAILURE_REPORTS", "AGNOSTIC_FINISHED",
    "AGNOSTIC_HEARTBEATS", "AGNOSTIC_LAUNCHER_STDERR")
# What a job gives a TensorFlow worker started by hand (TF_CONFIG, and no
# CPU split: tests/engines/tensorflow/test_multi_worker.py), read as agnostic
# is imported: by the harness, after Keras, in a fresh process as in a fork.
# A process of such a job comes from a fork of the programs' interpreter
# through its client (python()).
JOB = RUNTIME + ("TF_CONFIG", "AGNOSTIC_CPU_DEVICES")


def serves(script, env):
    """Whether a run of `script` with these variables may come from the warm
    interpreter (see above)."""
    from agnostic import _agnostic_hook

    if os.environ.get("KERAS_BACKEND") not in KERAS_3_ENGINES:  # keras-mxnet: fresh
        return False
    if not all(key.startswith("PROGRAM_") or key in READ_AS_IT_RUNS for key in env):
        return False
    if _changed(_SESSION, os.environ):
        return False
    if os.environ.get("KERAS_BACKEND") == "torch" \
            and os.environ.get("AGNOSTIC_START_EARLY", "1").strip() != "0":
        with open(script, encoding="utf-8") as handle:
            return re.search(_agnostic_hook._IMPORTS_AGNOSTIC, handle.read()) is None
    return True


def _changed(started, now):
    """Whether a test changed the variables `now` from `started` (beyond
    PER_TEST): one changed or removed, or one of agnostic's or Keras's added.
    (An engine's import adds variables of its own, TensorFlow's TF2_BEHAVIOR
    among them, which every process started after it inherits.)"""
    for key in set(started) | set(now):
        if key in PER_TEST:
            continue
        if key in started:
            if now.get(key) != started[key]:
                return True
        elif key.startswith(("AGNOSTIC_", "KERAS_")):
            return True
    return False


def run(script, arguments, env, outputs, timeout=600, workers=False):
    """Runs `script arguments` in a fork of the warm interpreter, with `env`
    added to its variables; stdout and stderr go to `outputs` + .out/.err.
    `workers`: the workers torch's launcher starts come from forks too.
    Returns (exit status, stdout, stderr); LAST says how many workers came."""
    server = _server()
    client, before = None, _served()
    if workers:
        _server("workers")
        client = os.path.join(_FOLDERS["workers"], "python")
    request = {"script": script, "arguments": [str(a) for a in arguments], "env": env,
               "stdout": outputs + ".out", "stderr": outputs + ".err", "client": client}
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()
    pid = _answer(server, 60)["pid"]
    try:
        ended = _answer(server, timeout)
    except TimeoutError:
        os.killpg(pid, signal.SIGKILL)
        _answer(server, 60)
        raise
    LAST["workers"] = _served() - before
    with open(outputs + ".out") as out, open(outputs + ".err") as err:
        return ended["status"], out.read(), err.read()


def _server(kind="programs"):
    """The warm interpreter of one kind: "programs", or "workers", which
    imported Keras with the variables torch's launcher gives a worker of two
    (OMP_NUM_THREADS: OpenMP reads it as it loads) and forks the workers
    whose other variables are read as the program runs (RUNTIME)."""
    if kind in _SERVERS and _SERVERS[kind].poll() is None:
        return _SERVERS[kind]
    from agnostic import devices

    stop(kind)
    variables = dict(os.environ)
    folder = tempfile.mkdtemp(prefix=f"agnostic-tests-warm-{kind}-")  # this user's alone
    if kind == "workers":
        variables.update(devices.thread_variables(2))
    # What the launcher's workers, or a job's processes, start through (_CLIENT).
    with open(os.path.join(folder, "variables.json"), "w") as handle:
        json.dump(variables, handle)
    client = os.path.join(folder, "python")
    with open(client, "w") as handle:
        handle.write(_CLIENT.format(python=sys.executable, folder=folder,
                                    runtime=sorted(RUNTIME if kind == "workers" else JOB)))
    os.chmod(client, 0o700)
    server = subprocess.Popen([sys.executable, "-c", _SERVE, folder], cwd=ROOT, text=True,
                              bufsize=1, env=variables, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    _SERVERS[kind], _FOLDERS[kind] = server, folder
    _answer(server, 300)
    return server


def python():
    """The command that starts a process of a job as `python` does, from a
    fork of the programs' interpreter where its variables allow (JOB), else
    as a fresh interpreter."""
    _server()
    return os.path.join(_FOLDERS["programs"], "python")


def _served():
    """How many workers the warm interpreter of workers has forked."""
    try:
        with open(os.path.join(_FOLDERS["workers"], "served")) as handle:
            return len(handle.readlines())
    except (KeyError, FileNotFoundError):
        return 0


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


def stop(*kinds):
    """Ends the warm interpreters (those of `kinds`, else every one): their
    stdin closes."""
    for kind in kinds or list(_SERVERS):
        server = _SERVERS.pop(kind, None)
        if server is not None:
            server.stdin.close()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(_FOLDERS.pop(kind, ""), ignore_errors=True)
