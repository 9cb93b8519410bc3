"""compat/scoped.py without an engine: a module function is replaced only
while a scope is open, and two sets of patches on the same function close in
any order, leaving the original once both have."""
import threading
import types

from agnostic.compat import scoped


def _module():
    module = types.SimpleNamespace()
    module.scale = lambda value: value * 2
    return module


def _adding(amount):
    def wrap(function):
        return lambda value: function(value) + amount
    return wrap


def test_a_function_is_replaced_only_inside_its_scopes():
    module = _module()
    original = module.scale
    patches = scoped.Patches(lambda: [(module, "scale", _adding(1))])
    with patches.active():
        assert module.scale(10) == 21
        with patches.active():  # a second step inside: still one layer
            assert module.scale(10) == 21
        assert module.scale(10) == 21
    assert module.scale is original


def test_two_sets_on_one_function_close_in_any_order():
    for first_closes_first in (True, False):
        module = _module()
        original = module.scale
        one = scoped.Patches(lambda: [(module, "scale", _adding(1))])
        other = scoped.Patches(lambda: [(module, "scale", _adding(100))])
        first, second = one.active(), other.active()
        first.__enter__()
        second.__enter__()
        assert module.scale(10) == 121
        closing = (first, second) if first_closes_first else (second, first)
        closing[0].__exit__(None, None, None)
        assert module.scale(10) == (120 if first_closes_first else 21)
        closing[1].__exit__(None, None, None)
        assert module.scale is original, first_closes_first


def test_steps_on_several_threads_share_one_count():
    module = _module()
    original = module.scale
    patches = scoped.Patches(lambda: [(module, "scale", _adding(1))])
    inside, leave, seen = threading.Barrier(3), threading.Event(), []

    def step():
        with patches.active():
            inside.wait()
            seen.append(module.scale(1))
            leave.wait()

    threads = [threading.Thread(target=step) for _ in range(2)]
    for thread in threads:
        thread.start()
    inside.wait()
    leave.set()
    for thread in threads:
        thread.join()
    assert seen == [3, 3]
    assert module.scale is original
