"""torch, Keras 3.13-3.16: an optimizer that updates this process's slice of
each large weight (torch-sharded, engines/torch/optimizer_shards.py) does
what it would do on the whole weights.

Two things an optimizer computes are not per value: clipping by a norm
(`clipnorm`, each weight's; `global_clipnorm`, all of them) and the weights it
leaves out of weight decay by identity (`exclude_from_weight_decay(var_list=
...)`). The optimizer's own clipping runs here on the whole gradients before
they are sliced, and a slice inherits its weight's exclusion.
"""
from agnostic.compat import versions


def clip(optimizer, gradients):
    """The optimizer's clipping of the whole `gradients` (Keras's
    `_clip_gradients`: clipnorm, global_clipnorm or clipvalue)."""
    return optimizer._clip_gradients(gradients)


def exclude_like(optimizer, pairs):
    """Each slice in `pairs` ((weight, slice)) left out of weight decay where
    its weight is (Keras keeps the excluded weights' ids)."""
    excluded = getattr(optimizer, "_exclude_from_weight_decay", None)
    if excluded:
        excluded.update(optimizer._var_key(part) for weight, part in pairs
                        if optimizer._var_key(weight) in excluded)


def probe(keras):
    """What this module relies on (agnostic/compat/registry.py)."""
    optimizer = keras.optimizers.AdamW(clipnorm=1.0)
    if not callable(getattr(optimizer, "_clip_gradients", None)):
        raise versions.moved("Optimizer._clip_gradients")
    if not callable(getattr(optimizer, "_var_key", None)):
        raise versions.moved("Optimizer._var_key")
    weight = keras.Variable([3.0, 4.0])
    clipped = clip(optimizer, [keras.ops.convert_to_tensor([3.0, 4.0])])[0]
    if abs(float(keras.ops.sum(clipped * clipped)) - 1.0) > 1e-5:
        raise versions.moved("Optimizer._clip_gradients (clipnorm=1 left a norm other than 1)")
    optimizer.exclude_from_weight_decay(var_list=[weight])
    if optimizer._var_key(weight) not in getattr(optimizer, "_exclude_from_weight_decay", ()):
        raise versions.moved("Optimizer._exclude_from_weight_decay (a set of _var_key)")
