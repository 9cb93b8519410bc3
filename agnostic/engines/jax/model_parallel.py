"""jax-model-parallel: the placements of agnostic.device() as
keras.distribution layouts.

JAX compiles one program over all its devices, so a layer cannot stay on
one device of it. The nearest layout that keeps each placed layer on the
devices its placements name: a DeviceMesh of (replicas, placed devices),
each placed layer's kernel split along its last axis over the placed
devices (copied where that axis does not divide), and each batch split
over the replicas (ModelParallel).
"""
import re

from agnostic.plan import placement
from agnostic.fit import in_place, pipeline
from agnostic.compat import jax_uneven_batches, keras_nodes
from agnostic.strategies import base

BATCH, MODEL = "batch", "model"


class JaxModelParallelStrategy(base.Strategy):
    name = "jax-model-parallel"

    def compile(self, model, call):
        import keras

        plan = self.plan
        size = len(plan.devices) // plan.num_replicas
        mesh = keras.distribution.DeviceMesh((plan.num_replicas, size), (BATCH, MODEL),
                                             devices=list(plan.devices))
        layout_map = keras.distribution.LayoutMap(mesh)
        placed = placement.first_devices(keras_nodes.ordered_calls(model), plan.placements)
        for layer in model.layers:
            if layer.name not in placed:
                continue
            for variable in layer.variables:
                layout_map["^" + re.escape(variable.path) + "$"] = _split_last(variable.shape,
                                                                              size)
        distribution = keras.distribution.ModelParallel(layout_map=layout_map,
                                                        batch_dim_name=BATCH)
        in_place.compile_in(model, distribution.scope(), call)
        pipeline.wrap(model, plan.num_replicas, scope=jax_uneven_batches.allow(distribution),
                      even_shares=False)
        return model


def _split_last(shape, size):
    """The layout of a placed variable: its last axis over the placed
    devices where it divides (kernels), else copied on each."""
    axes = [None] * len(shape)
    if len(shape) >= 2 and shape[-1] % size == 0:
        axes[-1] = MODEL
    return tuple(axes)
