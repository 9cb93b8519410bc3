"""Shared test setup.

Engine tests need the engine KERAS_BACKEND names. In the `core` tox
environment (no engine) they skip with a reason; in an engine's own
environment (AGNOSTIC_REQUIRE_ENGINE=1) a missing engine is a failure.
"""
import importlib
import os
import subprocess
import sys
import json
import warnings

import pytest
from tests import warm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Keras 2.2 on MXNet has no multi-machine path (docs/machines.md), no
# BackupAndRestore and no preemption at a step, and the programs of
# tests/programs/ are written in Keras 3's API. (Paths from this folder.)
collect_ignore = ([os.path.join("launch", "test_nodes.py"),
                   os.path.join("launch", "test_stalls.py"), "test_programs.py",
                   "test_keras_io.py", os.path.join("resume", "test_preemption.py"),
                   os.path.join("resume", "test_backup_disks.py"), "test_shard.py",
                   os.path.join("cluster", "test_join.py")]
                  if os.environ.get("KERAS_BACKEND") == "mxnet" else [])


def pytest_collection_modifyitems(config, items):
    """Tests marked `engine_free` start no engine in any process (the launcher's
    own supervision, output and rendezvous, run with tiny scripts): what an
    engine environment would add to them is nothing but time. tox.ini runs
    them in `core` (Python 3.8) and sets AGNOSTIC_ENGINE_FREE_TESTS=0 in the
    engines' environments, where they are deselected (counted so in pytest's
    summary, never as passed)."""
    if os.environ.get("AGNOSTIC_ENGINE_FREE_TESTS", "1") != "0":
        return
    elsewhere = [item for item in items if item.get_closest_marker("engine_free")]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if not item.get_closest_marker("engine_free")]


def engine_or_skip():
    """Imports keras on the configured engine, or skips (core env only)."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    try:
        keras = importlib.import_module("keras")
        importlib.import_module(backend)
    except ImportError as error:
        if os.environ.get("AGNOSTIC_REQUIRE_ENGINE") == "1":
            raise
        pytest.skip(f"engine {backend} is not installed in this environment: {error}",
                    allow_module_level=True)
    return keras


def cpu_devices():
    return int(os.environ.get("AGNOSTIC_CPU_DEVICES", "0") or 0)


def scikit_learn_beside():
    """The folder beside the environment where tox installs scikit-learn and
    its dependencies (AGNOSTIC_TEST_SCIKIT_LEARN; tox.ini's [digits] and
    [example]), when it holds them; else "" (scikit-learn, if any, is
    installed in the environment)."""
    folder = os.environ.get("AGNOSTIC_TEST_SCIKIT_LEARN", "")
    return folder if os.path.isdir(os.path.join(folder, "sklearn")) else ""


def with_scikit_learn(environ):
    """`environ` for a user's script that imports scikit-learn: the folder
    beside the environment first on its path, where there is one."""
    beside = scikit_learn_beside()
    if beside:
        environ["PYTHONPATH"] = os.pathsep.join(filter(None, [beside,
                                                             environ.get("PYTHONPATH")]))
    return environ


def run_python(code, env=None, timeout=300):
    """Runs `code` in a fresh interpreter; returns the JSON its last line prints."""
    environ = dict(os.environ)
    environ.update(env or {})
    for key, value in list(environ.items()):
        if value is None:
            del environ[key]
    result = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True,
        text=True, timeout=timeout, cwd=ROOT,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"subprocess failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


RENDEZVOUS_RETRY = ("{path}: XLA's in-process collectives on simulated CPU devices "
                    "aborted (a rendezvous timed out); run again once. See "
                    "docs/guarantees.md.")


def run_script(path, *arguments, env=None, timeout=600, check=True, fresh=False):
    """Runs a script as users do (`python path args`): from the warm
    interpreter (tests/warm.py) where the script and its variables allow,
    else (or where `fresh`) in a fresh process. Returns the JSON of its last
    stdout line, the whole stdout and stderr (`check`: a failure raises)."""
    env = env or {}
    if not fresh and None not in env.values() and warm.serves(path, env):
        return _warm_run(path, arguments, env, timeout, check)
    environ = dict(os.environ, **env)
    environ = {key: value for key, value in environ.items() if value is not None}
    command = [sys.executable, path] + [str(a) for a in arguments]

    def once():
        result = subprocess.run(command, env=environ, capture_output=True, text=True,
                                timeout=timeout, cwd=ROOT)
        return result.returncode, result.stdout, result.stderr

    return _ended(path, again_after_rendezvous_abort(path, once), check)


def _warm_run(path, arguments, env, timeout, check):
    """run_script's run from the warm interpreter; on torch the processes
    its launcher starts are forks too."""
    import shutil
    import tempfile

    workers = os.environ.get("KERAS_BACKEND") == "torch"
    folder = tempfile.mkdtemp(prefix="agnostic-tests-run-")
    try:
        outputs = os.path.join(folder, "run")
        ended = again_after_rendezvous_abort(path, lambda: warm.run(
            path, arguments, env, outputs, timeout=timeout, workers=workers))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return _ended(path, ended, check)


def _ended(path, ended, check):
    status, stdout, stderr = ended
    if check and status != 0:
        raise failed(path, status, stdout, stderr)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None, stdout, stderr


def again_after_rendezvous_abort(path, run):
    """`run()`'s (exit status, stdout, stderr), run once more, with a warning,
    where XLA:CPU aborted a collective (xla_cpu_rendezvous_abort)."""
    status, stdout, stderr = run()
    if status != 0 and xla_cpu_rendezvous_abort(stderr):
        warnings.warn(RENDEZVOUS_RETRY.format(path=path), RuntimeWarning)
        status, stdout, stderr = run()
    return status, stdout, stderr


# Where runs made once are kept for the session (the `kept_runs` fixture): one
# folder shared by the run's workers (pytest-xdist), under pytest's own
# temporary folder, which pytest removes in later sessions.
KEPT_RUNS = []


@pytest.fixture(scope="session", autouse=True)
def kept_runs(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    KEPT_RUNS[:] = [shared / "kept-runs"]
    KEPT_RUNS[0].mkdir(exist_ok=True)
    yield KEPT_RUNS[0]
    warm.stop()


def run_plain(script, folder, env=None):
    """A program's plain run (`model.compile` on one device) into `folder`.
    Programs are deterministic, so a run with the same program and variables
    is made once per session and its files copied: several tests compare
    agnostic's runs (2 or 4 replicas, other settings of agnostic's) with the
    same plain run."""
    env = {key: value for key, value in (env or {}).items() if key not in warm.HARNESS}
    if not KEPT_RUNS:
        return run_script(script, "plain", folder, env=env)
    made_once([script, sorted(env.items())], folder,
              lambda kept: run_program(script, "plain", kept, env))


def made_once(key, folder, make):
    """Copies into `folder` the files `make(kept)` writes into a folder of
    its own, made once per session for a `key` (anything JSON can write):
    for a deterministic run several tests compare with, the first test that
    needs it makes it (another worker that needs it meanwhile waits)."""
    import fcntl
    import hashlib
    import shutil

    key = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]
    kept = KEPT_RUNS[0] / key
    with open(KEPT_RUNS[0] / (key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be making it
        if not (kept / "done").exists():
            shutil.rmtree(kept, ignore_errors=True)
            kept.mkdir()
            make(kept)
            (kept / "done").touch()
    shutil.copytree(kept, folder, ignore=shutil.ignore_patterns("done"), dirs_exist_ok=True)


def run_program(script, mode, folder, env=None):
    """A program's run (`python script MODE FOLDER`), as run_script runs it."""
    run_script(script, mode, folder, env=env)


def failed(path, status, stdout, stderr):
    """The error of a script that ended with `status`, with its output's ends."""
    return AssertionError(f"{path} failed ({status}):\n{stdout[-5000:]}\n{stderr[-5000:]}")


def xla_cpu_rendezvous_abort(stderr):
    """Whether a JAX process ended in XLA:CPU's own abort of an in-process
    collective whose participants never all arrived (rendezvous.cc's
    "Termination timeout"). Seen once in CI (Keras 3.15, jax 0.10, 4 simulated
    devices on 2 busy cores) and never in 22 runs here: an engine fault of
    simulated devices, not a difference agnostic makes; the run is repeated
    once, with a warning, and must then pass as any other."""
    return "rendezvous" in stderr and "Termination timeout for" in stderr


def alive(pid):
    """Whether process `pid` still runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
