"""backend_agnostic_compile(): resolve a plan, pick its strategy, hand over."""
import sys
import warnings

from agnostic import in_place, plan as plan_lib, strategies
from agnostic.compat import versions
from agnostic.strategies import base

def backend_agnostic_compile(
    model,
    *args,
    gpus=None,
    cpu_merge=True,
    cpu_relocation=False,
    sync_batch_norm=True,
    **kwargs
):
    """Compiles `model` to train on every available device, in place.

    Call it where you would call `model.compile(...)`, with the same
    arguments, then call `model.fit(...)` as before: the model you passed is
    the one that trains on every device (it is also returned).

    Args:
        model: A Keras model, built or not, made anywhere (no scope needed):
            functional, Sequential, subclassed, with its own `compile`.
        *args, **kwargs: Passed to `model.compile` as given (a model with its
            own `compile`, such as a GAN's, gets its own arguments).
        gpus: None for every visible accelerator, an int for that many, or a
            list of device ids such as [0, 2].
        cpu_merge: TensorFlow: reduce gradients on the CPU (the legacy
            `multi_gpu_model` merge); False uses the engine's fastest
            all-reduce (NCCL on GPUs).
        cpu_relocation: TensorFlow: keep one copy of the variables on the
            CPU while the devices compute (the legacy `multi_gpu_model`
            option); elsewhere it warns and changes nothing.
        sync_batch_norm: True (default): BatchNormalization layers normalise
            with the statistics of the whole global batch, as on one device.
            False: each replica uses its own share's statistics (faster, and
            not what one device computes); the moving statistics are still
            averaged over the replicas.

    Returns:
        `model`, compiled.

    Example:
        >>> backend_agnostic_compile(
        ...     model, loss="sparse_categorical_crossentropy",
        ...     optimizer="sgd", metrics=["accuracy"])
        >>> model.fit(x, y, batch_size=64, epochs=2)
    """
    _check_arguments(model, cpu_merge, cpu_relocation, sync_batch_norm)
    plan = plan_lib.resolve(gpus, cpu_relocation=cpu_relocation, model=model)
    versions.warn_if_untested(sys.modules.get("keras"), plan.backend)
    plan_lib.announce(plan)
    if plan.relocation_unused:
        warnings.warn(
            f"cpu_relocation=True changes nothing with the {plan.strategy} "
            f"strategy: {plan.relocation_unused}. It applies to TensorFlow on "
            "several devices of one machine.",
            UserWarning, stacklevel=2,
        )
    strategy = strategies.get(plan.strategy)(
        plan, cpu_merge=cpu_merge, cpu_relocation=cpu_relocation,
        sync_batch_norm=sync_batch_norm,
    )
    return strategy.compile(base.start_again(model), in_place.CompileCall(args, kwargs))


def _check_arguments(model, cpu_merge, cpu_relocation, sync_batch_norm):
    missing = [name for name in ("compile", "fit", "get_weights") if not hasattr(model, name)]
    if missing:
        raise TypeError(
            "backend_agnostic_compile expects a Keras model (a keras.Model, "
            "Sequential or functional model). Received: "
            f"model={model!r} (of type {type(model).__name__})"
        )
    for name, value in (("cpu_merge", cpu_merge), ("cpu_relocation", cpu_relocation),
                        ("sync_batch_norm", sync_batch_norm)):
        if not isinstance(value, bool):
            raise TypeError(
                f"`{name}` must be True or False. Received: {name}={value!r}"
            )
