"""Each compat module's probe on the installed Keras and engine: the
internals it relies on are there and behave as it expects, or the test
fails naming the module and the Keras version. And a moved internal makes
the probe say so."""
import importlib
import os

import pytest

from agnostic import errors
from agnostic.compat import registry  # before the engine: agnostic sets it up as it imports
from tests.conftest import engine_or_skip

keras = engine_or_skip()
pytestmark = pytest.mark.keras_versions  # every tested Keras version runs these
BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")


def described(entry):
    (first, last) = entry.keras
    return (f"{', '.join(entry.engines)} with Keras {first[0]}.{first[1]} to "
            f"{last[0]}.{last[1]}")


@pytest.mark.parametrize("entry", registry.ENTRIES, ids=lambda entry: entry.name)
def test_the_internals_each_module_relies_on_are_there(entry):
    if not registry.applies(entry, BACKEND, keras.__version__):
        pytest.skip(f"{entry.name} applies to {described(entry)}; this is {BACKEND} with "
                    f"Keras {keras.__version__}")
    try:
        registry.check(entry, keras)
    except errors.CompatError as error:
        pytest.fail(f"{entry.name} on Keras {keras.__version__} ({BACKEND}): {error}",
                    pytrace=False)


# (entry, module, attribute): an internal the entry's probe checks, per engine.
MOVED = {
    "tensorflow": [("tf_loss_scaling", "keras.src.losses.loss", "scale_loss_for_distribution"),
                   ("tf_collective_server", "tensorflow.python.eager.context",
                    "Context.enable_collective_ops")],
    "jax": [("jax_uneven_batches", "keras.src.backend.jax.distribution_lib",
             "distribute_data_input"),
            ("jax_joined", "jax.distributed", "is_initialized")],
    "torch": [("torch_empty_share", "keras.src.losses.loss", "reduce_values")],
}
EVERY_ENGINE = [("keras_nodes", "keras.src.ops.function", "Function._get_operation_for_node")]


@pytest.mark.parametrize("name, module, attribute", MOVED.get(BACKEND, []) + EVERY_ENGINE,
                         ids=lambda value: str(value))
def test_a_moved_internal_fails_the_probe_naming_entry_and_version(monkeypatch, name,
                                                                   module, attribute):
    if BACKEND == "mxnet":
        pytest.skip("keras-mxnet has none of these internals")
    owner = importlib.import_module(module)
    *path, last = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    monkeypatch.delattr(owner, last)
    entry = next(e for e in registry.ENTRIES if e.name == name)
    with pytest.raises(errors.CompatError) as raised:
        registry.check(entry, keras)
    assert name in str(raised.value) and keras.__version__ in str(raised.value)
    assert last in str(raised.value)
