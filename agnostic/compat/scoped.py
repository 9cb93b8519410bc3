"""Module functions of an engine replaced only while agnostic's steps run.

Some internals agnostic changes are module functions, which no model
instance owns (Keras's loss scaling for distribution, its `reduce_values`,
TensorFlow's `maybe_merge_call`). They are replaced when the first step of a
model agnostic compiled begins (TensorFlow: is traced) and put back when the
last one running ends, so that outside them, and in a program that never
compiles with agnostic, the engine's own functions are in place. Replicas
run their steps on threads of their own: the replacements still look at the
calling thread's state, and one lock counts the steps inside.
"""
import contextlib
import threading


class Patches:
    """`replacements()` gives (owner, attribute name, replacement) triples,
    made when the first scope opens (each replacement wraps what is there)."""

    def __init__(self, replacements):
        self._replacements = replacements
        self._lock = threading.Lock()
        self._inside = 0
        self._saved = []

    @contextlib.contextmanager
    def active(self):
        with self._lock:
            if self._inside == 0:
                for owner, name, replacement in self._replacements():
                    self._saved.append((owner, name, getattr(owner, name)))
                    setattr(owner, name, replacement)
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0:
                    while self._saved:
                        owner, name, original = self._saved.pop()
                        setattr(owner, name, original)
