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
