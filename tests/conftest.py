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

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Keras 2.2 on MXNet has no multi-machine path (docs/machines.md), no
# BackupAndRestore and no preemption at a step, and the programs of
# tests/programs/ are written in Keras 3's API. (Paths from this folder.)
collect_ignore = ([os.path.join("launch", "test_nodes.py"), "test_programs.py",
                   "test_keras_io.py", "test_preemption.py", "test_backup_disks.py",
                   os.path.join("cluster", "test_join.py")]
                  if os.environ.get("KERAS_BACKEND") == "mxnet" else [])


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


def run_script(path, *arguments, env=None, timeout=600, check=True):
    """Runs a script as users do (`python path args`); returns the JSON of its
    last stdout line, the whole stdout and stderr (`check`: a failure raises)."""
    environ = dict(os.environ, **(env or {}))
    environ = {key: value for key, value in environ.items() if value is not None}
    result = subprocess.run(
        [sys.executable, path] + [str(a) for a in arguments], env=environ,
        capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{path} failed ({result.returncode}):\n{result.stdout[-5000:]}\n{result.stderr[-5000:]}"
        )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None, result.stdout, result.stderr


def alive(pid):
    """Whether process `pid` still runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
