"""The exceptions and warnings agnostic raises: part of the public API."""


class AgnosticError(Exception):
    """Base class of every error agnostic raises."""


class DeviceRequestError(AgnosticError, ValueError):
    """`gpus` asks for devices that do not exist or is not a valid request."""


class BatchSplitError(AgnosticError, ValueError):
    """A batch cannot be split evenly over the replicas of a strategy that
    splits every batch in equal parts."""


class EngineUnavailableError(AgnosticError, ImportError):
    """Keras or the engine it names is not installed."""


class ModelCopyError(AgnosticError, ValueError):
    """Kept for programs that catch it: agnostic no longer copies models
    (the program's model trains in place), so nothing raises it."""


class SingleDeviceWarning(UserWarning):
    """Training falls back to one device."""


class CpuDevicesWarning(UserWarning):
    """AGNOSTIC_CPU_DEVICES could not be applied to the engine."""


class UnaveragedGradientsWarning(UserWarning):
    """A torch training step neither called the model itself nor gave its
    gradients to the model's optimizer, where agnostic averages them: it
    trains differently from one device."""


class CompatError(AgnosticError, RuntimeError):
    """A Keras or engine internal that agnostic relies on has moved or
    behaves differently in this version."""


class LaunchError(AgnosticError, RuntimeError):
    """The processes of a multi-process strategy cannot be started or joined."""


class UnsupportedInputError(AgnosticError, ValueError):
    """A strategy cannot split this kind of input over its processes."""


class CheckpointError(AgnosticError, OSError):
    """A checkpoint file is missing, truncated or corrupt, or could not be
    written (the previous one is then left as it was)."""


class NotSupportedError(AgnosticError, NotImplementedError):
    """The engine cannot do what was asked; nothing was started."""


class UntestedVersionWarning(UserWarning):
    """The installed Keras is outside the versions agnostic is tested on."""


class PlacementWarning(UserWarning):
    """The model's agnostic.device() placements do not run exactly as
    written on this engine (said with what runs instead)."""


class PreemptionSettingError(AgnosticError, ValueError):
    """AGNOSTIC_PREEMPT_SIGNAL or AGNOSTIC_EXIT_SECONDS holds a value agnostic
    cannot use."""


class StepsPerExecutionWarning(UserWarning):
    """The strategy runs one step per call into the engine instead of the
    compiled `steps_per_execution`: the same training, with batch-level
    callbacks after every step."""


class ShardWarning(UserWarning):
    """shard="auto" found a model that would not fit a device copied, on an
    engine that does not split it: it trains copied, and may not fit."""


class PreemptedWarning(UserWarning):
    """Training stopped on a preempting signal with nothing saved to resume from."""


class EngineMissingWarning(UserWarning):
    """At `import agnostic`: the engine Keras will pick is not installed, so
    Keras's own import is about to fail (said with where the name came from
    and the fix)."""
