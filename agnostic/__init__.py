"""One Keras training script on every device, whatever KERAS_BACKEND names.

Example:
    >>> from agnostic import backend_agnostic_compile
    >>> model = backend_agnostic_compile(model, loss="mse", optimizer="sgd")
    >>> model.fit(x, y, batch_size=64)

Importing this package imports no engine.
"""
from agnostic import _startup
from agnostic.checkpoints import load_model
from agnostic.compile import backend_agnostic_compile
from agnostic.errors import (
    AgnosticError,
    BatchSplitError,
    CheckpointError,
    CpuDevicesWarning,
    DeviceRequestError,
    EngineUnavailableError,
    LaunchError,
    ModelCopyError,
    NotSupportedError,
    SingleDeviceWarning,
    UnaveragedGradientsWarning,
    UnsupportedInputError,
)
from agnostic.plan import Plan, resolve

__version__ = "0.1.0"

__all__ = [
    "AgnosticError",
    "BatchSplitError",
    "CheckpointError",
    "CpuDevicesWarning",
    "DeviceRequestError",
    "EngineUnavailableError",
    "LaunchError",
    "ModelCopyError",
    "NotSupportedError",
    "Plan",
    "SingleDeviceWarning",
    "UnaveragedGradientsWarning",
    "UnsupportedInputError",
    "backend_agnostic_compile",
    "load_model",
    "resolve",
]

_startup.install(imported=not _startup.started_by_site())
