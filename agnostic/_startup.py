"""AGNOSTIC_CPU_DEVICES=N: split the host CPU into N devices for each engine.

The split must happen after the engine is imported and before it starts its
runtime, and a user's script may import the engine first; so `install()` puts a
hook on the import of each engine. The package's .pth file calls it at
interpreter start when the variable is set; `import agnostic` calls it too.
"""
import importlib.abc
import sys
import warnings

from agnostic import devices as devices_lib
from agnostic import errors


def _split_tensorflow(tf, count):
    cpus = tf.config.list_physical_devices("CPU")
    if len(tf.config.get_logical_device_configuration(cpus[0]) or ()) == count:
        return
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * count
    )


def _split_jax(jax, count):
    if jax.config.jax_num_cpu_devices != count:
        jax.config.update("jax_num_cpu_devices", count)


SPLITTERS = {"tensorflow": _split_tensorflow, "jax": _split_jax}


def _apply(name, module, count):
    try:
        SPLITTERS[name](module, count)
    except (RuntimeError, ValueError) as error:
        warnings.warn(
            f"{devices_lib.CPU_DEVICES_VARIABLE}={count} could not split the "
            f"CPU for {name}: its runtime had already started ({error}). Set "
            "the variable before Python starts, with agnostic installed, so "
            "the split happens as the engine is imported.",
            errors.CpuDevicesWarning,
            stacklevel=2,
        )


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a splitter right after its engine's top module has executed."""

    def __init__(self, count):
        self.count = count
        self.pending = set(SPLITTERS)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        self.pending.discard(name)
        spec = None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _apply(name, module, self.count)

        spec.loader.exec_module = exec_module
        return spec


def install():
    """Arranges the split for every engine; safe to call more than once."""
    try:
        count = devices_lib.requested_cpu_devices()
    except errors.DeviceRequestError:
        return  # resolve() raises it with the full message
    if count < 2 or any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    hook = _AfterImport(count)
    for name in SPLITTERS:
        if name in sys.modules:
            hook.pending.discard(name)
            _apply(name, sys.modules[name], count)
    sys.meta_path.insert(0, hook)
