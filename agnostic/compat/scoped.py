"""Module functions of an engine replaced only while agnostic's steps run.

Some internals agnostic changes are module functions, which no model
instance owns (Keras's loss scaling for distribution, its `reduce_values`,
TensorFlow's `maybe_merge_call`). They are replaced when the first step of a
model agnostic compiled begins (TensorFlow: is traced) and put back when the
last one running ends, so that outside them, and in a program that never
compiles with agnostic, the engine's own functions are in place. Replicas
run their steps on threads of their own: the replacements still look at the
calling thread's state, and one lock counts the steps inside.

Two sets of patches may wrap the same function (none of today's do: each
module of compat/ replaces its own functions). Each function's wrappers are
kept as layers over the engine's own function, rebuilt whenever one set
opens or closes, so that the sets may close in any order and the engine's
function comes back when the last does.
"""
import contextlib
import threading

_LOCK = threading.Lock()
# (id(owner), name) -> (owner, the engine's own function, [(patches, wrap), ...])
_LAYERS = {}


class Patches:
    """`replacements()` gives (owner, attribute name, wrap) triples, where
    `wrap(function)` returns what replaces `function`; asked for when the
    first scope opens."""

    def __init__(self, replacements):
        self._replacements = replacements
        self._inside = 0
        self._keys = []

    @contextlib.contextmanager
    def active(self):
        with _LOCK:
            if self._inside == 0:
                for owner, name, wrap in self._replacements():
                    key = (id(owner), name)
                    _LAYERS.setdefault(key, (owner, getattr(owner, name), []))[2].append(
                        (self, wrap))
                    self._keys.append(key)
                    _install(key)
            self._inside += 1
        try:
            yield
        finally:
            with _LOCK:
                self._inside -= 1
                if self._inside == 0:
                    for key in self._keys:
                        layers = _LAYERS[key][2]
                        layers[:] = [layer for layer in layers if layer[0] is not self]
                        _install(key)
                    self._keys = []


def _install(key):
    """Sets the function at `key` to its layers' wrappers over the engine's
    own, in the order they opened (the engine's own once none is left)."""
    owner, function, layers = _LAYERS[key]
    for _, wrap in layers:
        function = wrap(function)
    setattr(owner, key[1], function)
    if not layers:
        del _LAYERS[key]
