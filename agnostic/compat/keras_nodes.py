"""Functional models' calls, one per graph node (Keras 3.13-3.16).

Keras 3 keeps no device with a layer call: a functional model runs its graph
again at every call, in `Function._run_through_graph`, and the device scope
active while the model was built is forgotten. Device parallelism needs
both ends of that, and both are private:

- recording: each call of a layer or operation on symbolic inputs makes a
  graph node (`keras.src.ops.node.Node`); those made while agnostic.device()
  was active are found, as it ends, among the interpreter's objects;
- running: `_run_through_graph` asks `self._get_operation_for_node(node)`
  for what to call at each node; this model's own override returns the
  operation run in its node's device scope.

`check()` fails naming the Keras version when either moves.
"""
import contextlib
import gc
import threading
import weakref

from agnostic import methods
from agnostic.compat import versions

_LOCK = threading.Lock()
_RECORDED = weakref.WeakSet()  # the nodes a recording has taken


def check():
    """Raises NotSupportedError naming the Keras version when the internals
    this module relies on are not there."""
    import keras

    from agnostic import errors

    missing = _missing()
    if missing:
        raise errors.NotSupportedError(
            f"agnostic.device() relies on Keras's {missing}, which Keras "
            f"{keras.__version__} does not have (tested: 3.13 to 3.16). Build the model "
            "without agnostic.device(), or use a tested Keras version."
        )


def _missing():
    """The first internal of these two that this Keras lacks, or None."""
    try:
        from keras.src.ops import function, node
    except ImportError:
        function = node = None
    if not hasattr(node, "Node"):
        return "keras.src.ops.node.Node"
    if not hasattr(function.Function, "_get_operation_for_node"):
        return "Function._get_operation_for_node"
    return None


def probe(keras):
    """What this module relies on (agnostic/compat/registry.py), on a
    1-layer functional model: a layer called on a symbolic input makes a
    Node while `recording`; the model's `_nodes_by_depth` gives its call;
    and calling the model asks `_get_operation_for_node` (on the instance)
    for what to run."""
    import numpy as np

    missing = _missing()
    if missing:
        raise versions.moved(missing)
    made = []
    inputs = keras.Input((2,))
    layer = keras.layers.Dense(1, kernel_initializer="zeros")
    with recording(made.append):
        outputs = layer(inputs)
    versions.expect([node.operation for node in made] == [layer],
                    "keras.src.ops.node.Node, one for each layer call on symbolic inputs")
    model = keras.Model(inputs, outputs)
    versions.expect([label for label, _ in ordered_calls(model)] == [f"{layer.name}:0"],
                    "Functional._nodes_by_depth (the model's layer calls)")
    ran = []

    def run(operation, args, kwargs):
        ran.append(operation)
        return operation(*args, **kwargs)

    run_nodes_in(model, lambda node: run)
    model(np.ones((1, 2), "float32"))
    versions.expect(ran == [layer], "Function._run_through_graph calling each node's "
                                    "operation from self._get_operation_for_node")


@contextlib.contextmanager
def recording(on_node):
    """Calls `on_node(node)` for every graph node made (by a layer or an
    operation called on symbolic tensors) while this is active, as it ends;
    the innermost recording only. Nothing of Keras's is replaced: the nodes
    are found among the interpreter's objects (`gc`), those there before it
    began left out, and those an inner recording took."""
    from keras.src.ops import node as node_lib

    before = _nodes(node_lib.Node)
    try:
        yield
    finally:
        with _LOCK:
            made = [node for node in _nodes(node_lib.Node)
                    if node not in before and node not in _RECORDED]
            _RECORDED.update(made)
        for node in made:
            on_node(node)


def _nodes(node_class):
    """Every graph node alive now, held weakly."""
    return weakref.WeakSet(filter(node_class.__instancecheck__, gc.get_objects()))


def ordered_calls(model):
    """The model's graph nodes in the order its call runs them, each with
    its label: the operation's name and which of its calls in this model it
    is ("shared_lstm:1" for the second). A clone has the same labels."""
    nodes_by_depth = getattr(model, "_nodes_by_depth", None)
    if nodes_by_depth is None:
        return []
    calls, counts = [], {}
    for depth in sorted(nodes_by_depth, reverse=True):
        for node in nodes_by_depth[depth]:
            if not node.operation or node.is_input:
                continue
            name = node.operation.name
            calls.append((f"{name}:{counts.get(name, 0)}", node))
            counts[name] = counts.get(name, 0) + 1
    return calls


def nodes_outside_the_graph(model):
    """The nodes of the calls of `model`'s layers, when `model` is not a
    functional model (Sequential, subclassed): its own call does not run
    them as a graph."""
    if getattr(model, "_nodes_by_depth", None) is not None:
        return []
    layers = getattr(model, "layers", None) or []
    return [node for layer in layers for node in getattr(layer, "_inbound_nodes", [])]


def run_nodes_in(model, run_of_node):
    """Each call of `model` runs a node through `run_of_node(node)`, a
    function `run(operation, args, kwargs)`, or as Keras does where that is
    None."""
    def wrapper(original):
        def get_operation_for_node(node):
            operation = original(node)
            run = run_of_node(node)
            return operation if run is None else _Run(operation, run)

        return get_operation_for_node

    # On this model only, taken off as it compiles again (methods.start_again).
    methods.wrap_method(model, "_get_operation_for_node", wrapper)


class _Run:
    """An operation called through `run`. Keras passes `training` to the
    operations that list it in `_call_context_args`, so that is read through."""

    def __init__(self, operation, run):
        self.operation, self.run = operation, run

    @property
    def _call_context_args(self):
        return getattr(self.operation, "_call_context_args", {})

    def __call__(self, *args, **kwargs):
        return self.run(self.operation, args, kwargs)
