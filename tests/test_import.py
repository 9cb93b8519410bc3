"""`import agnostic` imports no engine, and the package stays Python 3.8 code."""
import ast
import pathlib

from tests.conftest import run_python

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "agnostic"


def test_import_loads_no_engine():
    result = run_python(
        "import json, sys, agnostic\n"
        "engines = ['keras', 'tensorflow', 'jax', 'torch', 'mxnet']\n"
        "print(json.dumps(sorted(e for e in engines if e in sys.modules)))",
        env={"AGNOSTIC_CPU_DEVICES": "2"},
    )
    assert result == []


def test_package_parses_as_python_3_8():
    for path in PACKAGE.rglob("*.py"):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))


def test_the_public_api_is_typed():
    # Type checkers read the hints (py.typed ships with the package); every
    # parameter and return value of the public functions has one.
    import inspect

    import agnostic

    assert (PACKAGE / "py.typed").exists()
    for function in (agnostic.backend_agnostic_compile, agnostic.resolve,
                     agnostic.load_model, agnostic.device):
        signature = inspect.signature(function)
        untyped = [name for name, parameter in signature.parameters.items()
                   if parameter.annotation is inspect.Parameter.empty]
        assert not untyped, (function.__name__, untyped)
        assert signature.return_annotation is not inspect.Signature.empty, function.__name__


def test_the_test_environments_engines_are_compiled_to_bytecode():
    # tox.ini keeps bytecode in each environment's folder (PYTHONPYCACHEPREFIX:
    # the checkout stays clean), written as a module is first imported, and
    # imports the engines as the environment is prepared. Without it every
    # test's processes would compile Keras and its engine from source at each
    # import (PYTHONDONTWRITEBYTECODE with an installer that compiles nothing,
    # as uv): tens of seconds of CI per minute.
    import importlib.util
    import os
    import sys

    import pytest

    if not os.environ.get("TOX_ENV_NAME"):
        pytest.skip("checks tox's environments (TOX_ENV_NAME is not set)")
    prefix = sys.pycache_prefix
    assert prefix and os.path.commonpath([prefix, sys.prefix]) == sys.prefix, (
        f"bytecode goes to {prefix!r}, not inside the environment's folder {sys.prefix}: "
        "tox.ini's PYTHONPYCACHEPREFIX")
    sources = [name for name in ("keras", os.environ.get("KERAS_BACKEND"), "numpy")
               if name and importlib.util.find_spec(name) is not None]
    if not sources:
        pytest.skip("no engine in this environment")
    missing = []
    for name in sources:
        origin = pathlib.Path(importlib.util.find_spec(name).origin)
        if not pathlib.Path(importlib.util.cache_from_source(str(origin))).exists():
            missing.append(f"{name} ({origin})")
    assert not missing, (f"no bytecode for {missing} under {prefix}: the environment "
                         "imports its engines as it is prepared (tox.ini's [bytecode])")


def test_a_missing_engine_is_named_at_import_before_keras_fails(tmp_path):
    # The engine Keras would pick is one this environment lacks (each engine's
    # environment lacks the others): `import agnostic` first says so, with
    # the fix, before Keras's own import fails on it.
    import importlib.util

    import pytest

    if importlib.util.find_spec("keras") is None:
        pytest.skip("Keras is not installed here: its own import says what is missing")
    absent = [e for e in ("tensorflow", "jax", "torch") if importlib.util.find_spec(e) is None]
    if not absent:
        pytest.skip("every engine is installed here: none can be missing")
    code = ("import json, warnings\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import agnostic\n"
            "print(json.dumps([(type(w.message).__name__, str(w.message)) for w in caught]))")
    said = run_python(code, env={"KERAS_BACKEND": absent[0], "KERAS_HOME": str(tmp_path)})
    (kind, message), = said
    assert kind == "EngineMissingWarning"
    assert (f"Keras's engine is {absent[0]} (from KERAS_BACKEND), which is not installed, "
            f"so importing Keras will fail with \"No module named '{absent[0]}'\"") in message
    installed = [e for e in ("tensorflow", "jax", "torch", "mxnet")
                 if importlib.util.find_spec(e) is not None]
    if installed:
        assert f"e.g. KERAS_BACKEND={installed[0]}" in message
    # An installed engine says nothing.
    if installed and installed[0] != "mxnet":
        quiet = run_python(code, env={"KERAS_BACKEND": installed[0],
                                      "KERAS_HOME": str(tmp_path)})
        assert quiet == []
