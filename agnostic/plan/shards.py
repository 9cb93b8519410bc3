"""shard=True and shard="auto": the plan that splits each large weight and
its optimizer state over the devices, where the engine can, and "auto"'s
choice of it.

"auto" splits only where copying would not fit a device. Copied on every
device, training holds the weights, their gradients and the optimizer's
slots (SLOTS, per Keras optimizer: Adam's two moments, a momentum, an
average). "auto" splits them (the plan of shard=True) where those bytes
come to more than SHARE of the smallest device's memory (the rest is left
to the activations), and copies them otherwise. The model must be built to
be measured; an unbuilt one is copied, and the plan line says why. Every
process makes the same choice, from the same model and devices of the same
kind.
"""
import dataclasses
import os
import warnings

from agnostic import errors

# The strategy that splits weights and optimizer state over the devices, and
# what it splits.
SHARDED = {"jax-data-parallel": "jax-sharded", "torch-ddp": "torch-sharded"}
SPLIT = {
    "jax-sharded": "each large weight and its optimizer state split over the {n} devices",
    "torch-sharded": "each process holds 1/{n} of each large weight and its optimizer "
                     "state between steps, gathered per layer (ZeRO stage 3); gradients "
                     "are averaged whole",
}


def sharded(plan):
    """`plan` with its weights and optimizer state split over its devices
    (shard=True), or a NotSupportedError saying where that is possible."""
    if plan.num_replicas < 2 and not plan.placements:
        return plan  # one device holds everything either way
    why = unsplittable(plan)
    if why is None:
        strategy = SHARDED[plan.strategy]
        split = SPLIT[strategy].format(n=plan.num_replicas)
        return dataclasses.replace(
            plan, strategy=strategy, reason=f"{plan.reason.rstrip('.')}; shard=True: {split}.")
    raise errors.NotSupportedError(
        f"shard=True splits the weights and optimizer state over the devices on JAX "
        f"(jax-sharded) and over torch's processes (torch-sharded); this plan is "
        f"{plan.strategy} on {plan.backend} over {plan.num_replicas} devices, where {why}. "
        "Train with shard=False (every device holds the whole model), or with "
        "KERAS_BACKEND=jax or torch. Received: shard=True")


def unsplittable(plan):
    """Why shard=True cannot split `plan` (of several devices), or None."""
    if plan.placements:
        return "layers placed with agnostic.device() keep their weights on their devices"
    if plan.strategy in SHARDED:
        return None
    return f"{plan.backend} does not shard yet"


# The part of a device's memory the copied weights, gradients and optimizer
# slots may take; beyond it, "auto" splits them.
SHARE = 0.5
# The slots a Keras optimizer keeps per weight (before its options).
SLOTS = {"SGD": 0, "Adam": 2, "AdamW": 2, "Adamax": 2, "Nadam": 2, "RMSprop": 1,
         "Adagrad": 1, "Adadelta": 2, "Ftrl": 2, "Lion": 1, "Lamb": 2, "Adafactor": 2}
UNKNOWN_SLOTS = 2  # an optimizer of the program's own: as many as Adam


def auto(plan, model, optimizers, memory=None):
    """`plan`, split (sharded) where the model copied on every device would
    not fit (see above), else as it is; its reason says which and why.
    `optimizers`: the compile call's, instances or names; `memory(plan)`:
    the bytes of the plan's smallest device, or None (device_bytes)."""
    if plan.num_replicas < 2 and not plan.placements:
        return plan  # one device holds everything either way
    if plan.backend == "mxnet":  # Keras 2's variables: copied, not measured
        return _noted(plan, f"not split ({unsplittable(plan)})")
    need = needed_bytes(model, optimizers)
    have = (memory or device_bytes)(plan)
    if need is None:
        return _noted(plan, "not split: the model is not built yet, so its size is "
                            "unknown (build it first, or pass shard=True)")
    if have is None:
        return _noted(plan, f"not split: {_mb(need)} of weights, gradients and optimizer "
                            f"state copied on each device, and the devices' memory is "
                            "unknown (pass shard=True to split them)")
    sizes = (f"{_mb(need)} of weights, gradients and optimizer state copied on each "
             f"device, against {SHARE:.0%} of the {_mb(have)} of one")
    if need <= SHARE * have:
        return _noted(plan, f"not split: {sizes}")
    why = unsplittable(plan)
    if why is not None:
        warnings.warn(
            f"shard='auto': the model would take {sizes}, and it cannot be split here: "
            f"{plan.strategy} on {plan.backend}, where {why}. It is copied on each device "
            "and may not fit. Train with KERAS_BACKEND=jax or torch to split it.",
            errors.ShardWarning, stacklevel=3)
        return _noted(plan, f"not split ({why}): {sizes}")
    return sharded(_noted(plan, f"split: {sizes}"))


def _noted(plan, text):
    return dataclasses.replace(plan, reason=f"{plan.reason.rstrip('.')}; shard='auto': {text}.")


def _mb(size):
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size / 1e3:,.1f} KB"


def needed_bytes(model, optimizers):
    """The bytes of `model`'s weights, their gradients (the trainable ones)
    and the optimizer's slots, copied on one device; None if unbuilt."""
    variables = list(getattr(model, "weights", []))
    if not variables or not model.built:
        return None
    weights = sum(_bytes(v) for v in variables)
    trainable = sum(_bytes(v) for v in model.trainable_weights)
    return weights + trainable * (1 + max([slots(o) for o in optimizers] or [0]))


def _bytes(variable):
    import numpy as np

    size = 1
    for dimension in variable.shape:
        size *= int(dimension)
    return size * np.dtype(variable.dtype).itemsize


def slots(optimizer):
    """The slots `optimizer` (an instance or a name compile takes) keeps
    per weight: its kind's, a momentum's, a moving average's, gradient
    accumulation's."""
    import keras

    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None:  # a loss-scale optimizer: its inner one's
        return slots(inner)
    name = type(optimizer).__name__
    count = SLOTS.get(name, UNKNOWN_SLOTS) if type(optimizer).__module__.startswith(
        "keras.") else UNKNOWN_SLOTS
    if name == "SGD" and getattr(optimizer, "momentum", 0):
        count += 1
    if name == "RMSprop":
        count += bool(getattr(optimizer, "momentum", 0)) + bool(getattr(optimizer,
                                                                         "centered", False))
    count += bool(getattr(optimizer, "use_ema", False))
    count += bool(getattr(optimizer, "gradient_accumulation_steps", None))
    return count


def device_bytes(plan):
    """The memory of the plan's smallest device: a GPU's, as its engine
    reports it; a CPU device's, the machine's memory over the CPU devices
    this process simulates. None where the engine does not say."""
    if all(device.startswith("cpu") for device in plan.devices):
        total = _machine_bytes()
        local = max(1, len(plan.devices) // max(1, plan.num_processes))
        return None if total is None else total // local
    if plan.backend == "torch":
        import torch

        indexes = [int(device.split(":")[1]) for device in plan.devices
                   if device.startswith("cuda:")]
        return min(torch.cuda.get_device_properties(index).total_memory
                   for index in indexes) if indexes else None
    if plan.backend == "jax":
        import jax

        named = {f"{d.platform}:{d.id}": d for d in jax.local_devices()}
        limits = [(named[device].memory_stats() or {}).get("bytes_limit")
                  for device in plan.devices if device in named]
        limits = [limit for limit in limits if limit]
        return min(limits) if limits else None
    return None


def _machine_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
