"""backend_agnostic_compile(): resolve a plan, pick its strategy, hand over."""
import dataclasses
import difflib
import inspect
import sys
import warnings
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from agnostic import plan as plan_lib, strategies
from agnostic.plan import log, shards
from agnostic import methods
from agnostic.fit import in_place
from agnostic.compat import versions

if TYPE_CHECKING:  # for type checkers only: importing agnostic imports no engine
    import keras


def backend_agnostic_compile(
    model: "keras.Model",
    *args: Any,
    gpus: Optional[Union[int, Sequence[int]]] = None,
    cpu_merge: bool = True,
    cpu_relocation: bool = False,
    sync_batch_norm: bool = True,
    global_view: bool = True,
    shard: Union[bool, str] = False,
    **kwargs: Any
) -> "keras.Model":
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
        global_view: TensorFlow and torch: True (default): every replica's
            step sees the whole global batch, as one device's does: losses
            of any form, metrics, a `train_step` of the program's own and
            random draws in it are one device's, while the model's layers
            compute on each replica's part of the rows. False: each replica
            computes its losses and metrics on its own share (no gather of
            the batch; one device's only for means over rows). JAX's one
            program always sees the global batch.
        shard: JAX: split each large weight and its optimizer
            state over the devices (each holds about 1/N of them) instead of
            copying them on every device, for a model larger than one
            device. torch: each process holds 1/N of each large weight and
            of its optimizer state between steps, each weight gathered
            while a layer computes with it (ZeRO stage 3), with Keras's
            elementwise optimizers. On other plans of several
            devices, a NotSupportedError. "auto": split them only where,
            copied, the weights, their gradients and the optimizer's
            slots would take more than half of a device's memory (the
            model built; the plan line says which and why).

    Returns:
        `model`, compiled. A later `model.compile(...)` of the program's
        compiles it through agnostic again, with the same options.

    Example:
        >>> backend_agnostic_compile(
        ...     model, loss="sparse_categorical_crossentropy",
        ...     optimizer="sgd", metrics=["accuracy"])
        >>> model.fit(x, y, batch_size=64, epochs=2)
    """
    _check_arguments(model, cpu_merge, cpu_relocation, sync_batch_norm, global_view, shard)
    _check_keywords(model, kwargs)
    call = in_place.CompileCall(args, kwargs)
    plan = plan_lib.resolve(gpus, cpu_relocation=cpu_relocation, model=model,
                            shard=shard is True)
    if shard == "auto":
        plan = shards.auto(plan, model, call.optimizers())
    versions.warn_if_untested(sys.modules.get("keras"), plan.backend)
    log.announce(plan)
    if plan.relocation_unused:
        warnings.warn(
            f"cpu_relocation=True changes nothing with the {plan.strategy} "
            f"strategy: {plan.relocation_unused}. It applies to TensorFlow on "
            "several devices of one machine.",
            UserWarning, stacklevel=2,
        )
    chosen = strategies.get(plan.strategy)
    chosen.refuse(model, call)  # before any process starts
    if plan.starts_processes:  # this process becomes rank 0 of the plan's job
        from agnostic.launch import local  # not at `import agnostic`

        plan = dataclasses.replace(plan, job=local.launch(plan.num_processes,
                                                          plan.device_indexes))
    else:  # those started early wait for nothing
        from agnostic.launch import early

        early.dismiss()
    strategy = chosen(
        plan, cpu_merge=cpu_merge, cpu_relocation=cpu_relocation,
        sync_batch_norm=sync_batch_norm, global_view=global_view,
    )
    # A later `model.compile(...)` of the program's (fine-tuning: freeze
    # layers, compile again with a new optimizer) compiles through agnostic
    # with this call's options: the model trains on as before, on every
    # device, rather than half in agnostic's plan and half in Keras's.
    options = dict(gpus=gpus, cpu_merge=cpu_merge, cpu_relocation=cpu_relocation,
                   sync_batch_norm=sync_batch_norm, global_view=global_view, shard=shard)

    def again(model, *args, **kwargs):
        return backend_agnostic_compile(model, *args, **options, **kwargs)

    try:
        return strategy.compile(methods.start_again(model, again), call)
    except BaseException:
        methods.start_again(model)  # nothing of agnostic's is left on a model it did not compile
        raise


# The keywords backend_agnostic_compile takes itself (the rest go to compile).
OWN_KEYWORDS = ("gpus", "cpu_merge", "cpu_relocation", "sync_batch_norm", "global_view",
                "shard")


def _check_keywords(model, kwargs):
    """A keyword neither agnostic nor the model's `compile` takes: a TypeError
    now, naming the keyword meant where one is close, before any work (Keras
    would say "unexpected keyword argument", keras-mxnet nothing at all)."""
    try:
        parameters = inspect.signature(model.compile).parameters
    except (TypeError, ValueError):  # a compile without a signature: it decides
        return
    # A compile that takes any keyword (Keras 2's passes them to the engine)
    # is told apart from a typo only by a name close to one it knows.
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    known = [name for name, p in parameters.items()
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for name in kwargs:
        if name in known:
            continue
        close = difflib.get_close_matches(name, list(OWN_KEYWORDS) + known, n=1, cutoff=0.6)
        if open_ended and not close:
            continue
        meant = f" Did you mean {close[0]}=...?" if close else ""
        raise TypeError(
            f"backend_agnostic_compile got an unexpected keyword argument {name!r}.{meant} "
            f"It takes {', '.join(OWN_KEYWORDS)} itself and passes the rest to "
            f"{type(model).__name__}.compile, which takes: {', '.join(known)}. "
            f"Received: {name}={kwargs[name]!r}"
        )


def _check_arguments(model, cpu_merge, cpu_relocation, sync_batch_norm, global_view,
                     shard=False):
    if isinstance(model, type):
        raise TypeError(
            "backend_agnostic_compile expects a Keras model object, not a class. Received: "
            f"model={model.__module__}.{model.__qualname__} (the class itself). Make the "
            f"model first, e.g. model = {model.__qualname__}(...), then pass model."
        )
    missing = [name for name in ("compile", "fit", "get_weights") if not hasattr(model, name)]
    if missing:
        raise TypeError(
            "backend_agnostic_compile expects a Keras model (a keras.Model, "
            "Sequential or functional model). Received: "
            f"model={model!r} (of type {type(model).__name__})"
        )
    if not isinstance(shard, bool) and shard != "auto":
        raise TypeError(f"`shard` must be True, False or 'auto'. Received: shard={shard!r}")
    for name, value in (("cpu_merge", cpu_merge), ("cpu_relocation", cpu_relocation),
                        ("sync_batch_norm", sync_batch_norm), ("global_view", global_view)):
        if not isinstance(value, bool):
            raise TypeError(
                f"`{name}` must be True or False. Received: {name}={value!r}"
            )
