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
