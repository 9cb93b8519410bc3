"""The compat registry's own rules, without an engine (this file runs in the
core environment, Python 3.8, and imports no keras): one entry per compat
module, well-formed ranges, `applies` keeping to them, and `check` naming
the entry and the Keras version in what it raises."""
import dataclasses
import pkgutil
import sys
import types

import pytest

import agnostic
from agnostic import errors
from agnostic.compat import registry, versions

NOT_ENTRIES = {"versions", "registry", "scoped"}  # the helpers the entries share
KNOWN_ENGINES = {"tensorflow", "jax", "torch", "mxnet"}


def fake_keras(version="3.99.0"):
    keras = types.ModuleType("keras")
    keras.__version__ = version
    return keras


def entry(probe, engines=("jax",), keras=((3, 13), (3, 15))):
    return registry.Entry("planted", "Plants a probe.", engines, keras, probe)


def test_every_compat_module_has_exactly_one_entry():
    import agnostic.compat

    modules = sorted(m.name for m in pkgutil.iter_modules(agnostic.compat.__path__)
                     if m.name not in NOT_ENTRIES)
    names = [e.name for e in registry.ENTRIES]
    assert sorted(names) == modules
    assert len(set(names)) == len(names)


def test_every_entry_is_well_formed_and_its_probe_lives_with_its_module():
    for e in registry.ENTRIES:
        first, last = e.keras
        for version in (first, last):
            assert isinstance(version, tuple) and len(version) == 2, e.name
            assert all(isinstance(part, int) and part >= 0 for part in version), e.name
        assert first <= last, e.name
        assert e.engines and isinstance(e.engines, tuple), e.name
        assert set(e.engines) <= KNOWN_ENGINES, e.name
        assert (e.engines == ("mxnet",)) == (e.keras == ((2, 2), (2, 2))), e.name
        assert e.fixes.strip() and e.fixes.endswith("."), e.name  # one sentence
        module = sys.modules[f"agnostic.compat.{e.name}"]
        assert e.probe is module.probe, e.name


def test_entries_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        registry.ENTRIES[0].name = "other"
    assert registry.ENTRIES[0].name != "other"


def test_applies_keeps_to_the_engines_and_versions():
    planted = entry(lambda keras: None)
    assert registry.applies(planted, "jax", "3.13.0")
    assert registry.applies(planted, "jax", "3.15.1")
    assert registry.applies(planted, "jax", "3.14.0rc1")
    assert not registry.applies(planted, "jax", "3.12.9")
    assert not registry.applies(planted, "jax", "3.16.0.dev2026102704")
    assert not registry.applies(planted, "jax", "4.13.0")
    assert not registry.applies(planted, "torch", "3.14.1")
    assert not registry.applies(planted, "jax", "nightly")
    assert not registry.applies(planted, "jax", None)


def test_applies_on_the_registrys_own_entries():
    by_name = {e.name: e for e in registry.ENTRIES}
    assert registry.applies(by_name["jax_on_batch"], "jax", "3.14.1")
    assert not registry.applies(by_name["jax_on_batch"], "jax", "3.15.1")
    assert registry.applies(by_name["shuffle_order"], "torch", "3.16.0.dev2026102704")
    assert registry.applies(by_name["mxnet_kvstore"], "mxnet", "2.2.4.3")
    assert not registry.applies(by_name["mxnet_kvstore"], "tensorflow", "3.15.1")
    assert not registry.applies(by_name["tf_loss_scaling"], "mxnet", "2.2.4.3")


@pytest.mark.parametrize("raised", [AttributeError("type object 'Trainer' has no attribute "
                                                   "'_initial_epoch'"),
                                    ImportError("No module named 'keras.src.ops.node'"),
                                    TypeError("takes 1 positional argument but 2 were given"),
                                    AssertionError("not the same order")],
                         ids=lambda error: type(error).__name__)
def test_a_failed_reach_surfaces_as_compat_error_naming_entry_and_version(raised):
    def probe(keras):
        raise raised

    with pytest.raises(errors.CompatError) as caught:
        registry.check(entry(probe), fake_keras("3.99.0"))
    message = str(caught.value)
    assert "planted" in message and "3.99.0" in message and str(raised) in message
    assert caught.value.__cause__ is raised


def test_a_probes_compat_error_gains_the_entry_and_version():
    def probe(keras):
        raise errors.CompatError("Layer._flatten_layers has moved")

    with pytest.raises(errors.CompatError, match=r"planted.*_flatten_layers.*Keras 3\.99\.0"):
        registry.check(entry(probe), fake_keras("3.99.0"))


def test_other_errors_of_a_probe_pass_through():
    def probe(keras):
        raise ValueError("a bug of the probe's own")

    with pytest.raises(ValueError, match="a bug of the probe's own"):
        registry.check(entry(probe), fake_keras())


def test_a_probe_that_finds_everything_passes():
    assert registry.check(entry(lambda keras: None), fake_keras()) is None


def test_moved_is_a_compat_error_and_a_runtime_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras", fake_keras("3.99.0"))
    error = versions.moved("Layer._flatten_layers")
    assert isinstance(error, errors.CompatError)
    assert isinstance(error, RuntimeError) and isinstance(error, errors.AgnosticError)
    assert "Layer._flatten_layers" in str(error) and "3.99.0" in str(error)


def test_compat_error_is_exported():
    assert agnostic.CompatError is errors.CompatError
    assert "CompatError" in agnostic.__all__
