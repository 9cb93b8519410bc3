"""Every reach into an engine's private internals lives in agnostic/compat/:
a search of the rest of the package for engine underscore names, private
engine modules (keras.src, tensorflow.python, torch._*, jax._src) and
underscore names in strings finds nothing but agnostic's own names."""
import ast
import os
import re

from tests.conftest import ROOT

PACKAGE = os.path.join(ROOT, "agnostic")
PRIVATE_MODULES = re.compile(r"(keras\.src|tensorflow\.python|torch\._|jax\._src)")
# Python's own (os._exit, sys._getframe), and a method-name suffix.
NOT_ENGINES = {"_exit", "_getframe", "_on_batch"}


def sources(package):
    for folder, _, names in os.walk(package):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path) as handle:
                    yield path, ast.parse(handle.read())


def agnostics_own_names(package):
    """Every name agnostic defines: functions, classes, variables, its own
    attributes (self._x), imported names."""
    own = set()
    for _, tree in sources(package):
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                own.add(node.attr)
            elif isinstance(node, ast.alias):
                own.add(node.asname or node.name.split(".")[0])
    return own


def is_private(name, own):
    return (name.startswith("_") and not name.startswith("__") and name not in own
            and name not in NOT_ENGINES and not name.startswith("_agnostic"))


def engine_internals_outside_compat(package=PACKAGE):
    own = agnostics_own_names(package)
    compat = os.path.join(package, "compat")
    found = []
    for path, tree in sources(package):
        if path.startswith(compat + os.sep):
            continue
        where = os.path.relpath(path, package)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and is_private(node.attr, own):
                found.append(f"{where}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"_\w+", node.value) and is_private(node.value, own):
                found.append(f"{where}:{node.lineno} {node.value!r}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [node.module] if isinstance(node, ast.ImportFrom) else \
                    [alias.name for alias in node.names]
                found += [f"{where}:{node.lineno} import {m}" for m in modules
                          if m and PRIVATE_MODULES.match(m)]
    return found


def test_engine_internals_are_reached_only_from_the_compat_package():
    assert engine_internals_outside_compat() == []


def test_the_search_finds_an_engine_internal(tmp_path):
    # The search itself, on a package whose strategy reaches into Keras,
    # and whose compat package may.
    (tmp_path / "strategies").mkdir()
    (tmp_path / "compat").mkdir()
    (tmp_path / "strategies" / "planted.py").write_text(
        "from keras.src.trainers import trainer\n"
        "def f(model):\n    return model._symbolic_build, '_use_cached_x'\n")
    (tmp_path / "compat" / "allowed.py").write_text(
        "def f(model):\n    return model._symbolic_build\n")
    found = engine_internals_outside_compat(str(tmp_path))
    assert [line.split(" ", 1)[1] for line in found] == [
        "import keras.src.trainers", "._symbolic_build", "'_use_cached_x'"]
    assert all(line.startswith(os.path.join("strategies", "planted.py")) for line in found)
