"""One Keras training script on every device, whatever KERAS_BACKEND names.

Example:
    >>> from agnostic import backend_agnostic_compile
    >>> model = backend_agnostic_compile(model, loss="mse", optimizer="sgd")
    >>> model.fit(x, y, batch_size=64)

Importing this package imports no engine.
"""
from agnostic import _startup
from agnostic.compile import backend_agnostic_compile
from agnostic.errors import (
    AgnosticError,
    BatchSplitError,
    CpuDevicesWarning,
    DeviceRequestError,
    EngineUnavailableError,
    ModelCopyError,
    SingleDeviceWarning,
)
from agnostic.plan import Plan, resolve

__version__ = "0.1.0"

__all__ = [
    "AgnosticError",
    "BatchSplitError",
    "CpuDevicesWarning",
    "DeviceRequestError",
    "EngineUnavailableError",
    "ModelCopyError",
    "Plan",
    "SingleDeviceWarning",
    "backend_agnostic_compile",
    "resolve",
]

_startup.install()
