"""The package's shape, read from its source (no engine): which module may
import which, no circles, and one module per strategy the plan can name.

Every import counts, those inside functions too: a lazy import still ties
two modules together."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "agnostic"

# What each layer may import besides itself. The leaves import nothing of
# the package's but errors; compat (the engines' internals, version-gated)
# and cluster (the schedulers' variables) sit on the leaves alone.
LEAVES = {"agnostic.errors", "agnostic.methods", "agnostic.batching",
          "agnostic.collectives", "agnostic.resume.checkpoints", "agnostic.devices",
          "agnostic.launch.channel",
          "agnostic.launch.failures", "agnostic.strategies.base"}
LAYERS = {
    "agnostic.compat": LEAVES,
    "agnostic.cluster": LEAVES,
}
# Where a program enters: imported by nothing of the package's but the
# package's own __init__ (the public API) and the CLI.
ENTRIES = {"agnostic", "agnostic.compile", "agnostic.cli", "agnostic.report",
           "agnostic.__main__"}
# What executes a plan: the registry and the strategies for every engine,
# and each engine's folder. Imported only by the entries and each other.
EXECUTING = ("agnostic.strategies", "agnostic.engines")
ENGINE_PREFIXES = {"tf": "tensorflow", "torch": "torch", "jax": "jax", "mxnet": "mxnet"}


def modules():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name, path, known):
    """The package's modules `name` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    where = name if is_package else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = where.split(".")[: len(where.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                target = f"{base}.{alias.name}"
                found.add(target if target in known else base)
    return {target for target in found if target in known and target != name}


def graph():
    known = modules()
    edges = {name: imports(name, path, known) for name, path in known.items()}
    return edges


def in_layer(name, layer):
    return name == layer or name.startswith(layer + ".")


def test_no_module_reaches_itself_through_its_imports():
    edges = graph()
    circles = []
    for start in edges:
        path, seen, stack = [], set(), [(start, iter(sorted(edges[start])))]
        path.append(start)
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop(), path.pop()
            elif child == start:
                circles.append(" -> ".join(path + [start]))
                break
            elif child not in seen:
                seen.add(child)
                stack.append((child, iter(sorted(edges[child]))))
                path.append(child)
    assert circles == []


def test_each_layer_imports_only_what_lies_below_it():
    wrong = []
    for name, targets in graph().items():
        for layer, allowed in LAYERS.items():
            if in_layer(name, layer):
                wrong += [f"{name} imports {target}" for target in targets
                          if not in_layer(target, layer) and target not in allowed]
        if name in LEAVES:
            wrong += [f"{name} imports {target}" for target in targets
                      if target != "agnostic.errors"]
        if not any(in_layer(name, layer) for layer in EXECUTING) and name not in ENTRIES:
            wrong += [f"{name} imports {target}" for target in targets
                      if any(in_layer(target, layer) for layer in EXECUTING)
                      and target not in LEAVES]
        if name not in {"agnostic", "agnostic.cli", "agnostic.report", "agnostic.__main__"}:
            wrong += [f"{name} imports {target}" for target in targets if target in ENTRIES]
    assert wrong == []


def test_every_strategy_the_plan_names_has_a_module_of_its_own():
    registry = ast.parse((PACKAGE / "strategies" / "__init__.py").read_text())
    table = next(node.value for node in ast.walk(registry) if isinstance(node, ast.Assign)
                 and getattr(node.targets[0], "id", None) == "STRATEGIES")
    strategies = ast.literal_eval(table)
    assert len(strategies) >= 10
    targets = [target.split(":")[0] for target in strategies.values()]
    assert len(set(targets)) == len(targets)  # no module serves two names
    for name, target in strategies.items():
        module, class_name = target.split(":")
        prefix, _, rest = name.partition("-")
        if prefix in ENGINE_PREFIXES:  # an engine's own: in its folder
            expected = f"agnostic.engines.{ENGINE_PREFIXES[prefix]}.{rest.replace('-', '_')}"
        else:
            expected = "agnostic.strategies." + name.replace("-", "_")
        assert module == expected, name
        source = ast.parse((PACKAGE.parent / (module.replace(".", "/") + ".py")).read_text())
        named = [node for node in source.body
                 if isinstance(node, ast.ClassDef) and node.name == class_name]
        assert len(named) == 1, target
        said = [statement.value.value for statement in named[0].body
                if isinstance(statement, ast.Assign)
                and getattr(statement.targets[0], "id", None) == "name"]
        assert said == [name], target


def room(name):
    """The folder (agnostic.launch) or root module (agnostic._startup) that
    holds module `name`: what the layout shows as one room."""
    parts = name.split(".")
    return ".".join(parts[:2])


def test_no_folder_imports_back_up():
    """Rooms stack: when one room imports another, nothing of the second
    imports the first, lazily or not (a worker's entry point that needs both
    sits above them, as agnostic/_waiting.py does)."""
    rooms = {}
    for name, targets in graph().items():
        for target in targets:
            if room(name) != room(target):
                rooms.setdefault(room(name), {}).setdefault(room(target), []).append(
                    f"{name} imports {target}")
    back = []
    for first, seconds in rooms.items():
        for second in seconds:
            reached, stack = set(), [second]
            while stack:
                here = stack.pop()
                for there in rooms.get(here, {}):
                    if there not in reached:
                        reached.add(there)
                        stack.append(there)
            if first in reached:
                back += seconds[second]
    assert back == [], "\n".join(sorted(back))
