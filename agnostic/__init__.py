"""One Keras training script on every device, whatever KERAS_BACKEND names.

Example:
    >>> from agnostic import backend_agnostic_compile
    >>> model = backend_agnostic_compile(model, loss="mse", optimizer="sgd")
    >>> model.fit(x, y, batch_size=64)

Importing this package imports no engine.
"""
from agnostic import _startup
from agnostic.resume.checkpoints import load_model
from agnostic.compile import backend_agnostic_compile
from agnostic.errors import (
    AgnosticError,
    BatchSplitError,
    CheckpointError,
    CompatError,
    CpuDevicesWarning,
    DeviceRequestError,
    EngineMissingWarning,
    EngineUnavailableError,
    LaunchError,
    ModelCopyError,
    NotSupportedError,
    PlacementWarning,
    PreemptedWarning,
    ShardWarning,
    PreemptionSettingError,
    SingleDeviceWarning,
    StepsPerExecutionWarning,
    UnaveragedGradientsWarning,
    UnsupportedInputError,
    UntestedVersionWarning,
)
from agnostic.plan.placement import device
from agnostic.plan import Plan, resolve

__version__ = "0.1.0"

__all__ = [
    "AgnosticError",
    "BatchSplitError",
    "CheckpointError",
    "CompatError",
    "CpuDevicesWarning",
    "DeviceRequestError",
    "EngineMissingWarning",
    "EngineUnavailableError",
    "LaunchError",
    "ModelCopyError",
    "NotSupportedError",
    "Plan",
    "PlacementWarning",
    "PreemptedWarning",
    "ShardWarning",
    "PreemptionSettingError",
    "SingleDeviceWarning",
    "StepsPerExecutionWarning",
    "UnaveragedGradientsWarning",
    "UnsupportedInputError",
    "UntestedVersionWarning",
    "backend_agnostic_compile",
    "device",
    "load_model",
    "resolve",
]


def _say_a_missing_engine():
    """Names a missing engine before Keras's import fails on it: where a
    program imports agnostic first, its first line of output says the fix
    (not for `agnostic info`, which says it in its report)."""
    import warnings

    from agnostic import devices

    if _startup.agnostic_itself():
        return
    missing = devices.missing_engine()
    if missing:
        warnings.warn(missing, EngineMissingWarning, stacklevel=2)


if _startup.started_by_hook():
    # The start-up hook imports agnostic as the engine is imported, in a
    # program that names agnostic. The program's own use is its first name
    # taken from agnostic, which may come after it has set a job's variables
    # (as Ray sets TF_CONFIG in a running worker): install again then.
    _PUBLIC = {name: globals().pop(name) for name in __all__}

    def __getattr__(name):
        if name not in _PUBLIC:
            raise AttributeError(f"module 'agnostic' has no attribute {name!r}")
        globals().update(_PUBLIC)
        _startup.install(imported=True)
        return _PUBLIC[name]

    _startup.install()
else:
    _startup.install(imported=True)
    _say_a_missing_engine()
