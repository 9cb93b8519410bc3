"""jax-sharded: each large weight and its optimizer state split over the
devices (shard=True), as FSDP and ZeRO-3 do: XLA's partitioner
gathers a weight where a step computes with it and reduce-scatters its
gradient, so each device keeps about 1/N of the weights and of the optimizer
state.

keras.distribution.ModelParallel over a mesh of one axis, which splits both
every batch (data parallelism) and each weight along its largest dimension
that the device count divides; weights smaller than SMALLEST values, or with
no such dimension, are copied on every device. The layout is derived from
each variable's shape as it is made, so a model built later (a subclassed
model's first call, the optimizer's slots in fit) is made split, never whole
first; a model built before the call is split when agnostic makes its
variables again on the mesh.

Over several processes (agnostic launch, a scheduler) the mesh is every
process's devices, each process feeding its part of every batch; a save
and a prediction gather each variable whole in every process for their
time (data_parallel.fit_under, compat/keras_variables.py).
"""
import math

from agnostic.fit import in_place, pipeline
from agnostic.compat import keras_variables
from agnostic.engines.jax import data_parallel
from agnostic.strategies import base

AXIS = "batch"
# Fewer values than this: copied on every device (biases, scales, counters).
SMALLEST = 1024


def split_axes(shape, devices):
    """The layout of a weight of `shape` over `devices`: its largest axis that
    `devices` divides is split (AXIS), the others copied (None)."""
    axes = [None] * len(shape)
    if math.prod(shape) < SMALLEST:
        return tuple(axes)
    divisible = [(size, -axis) for axis, size in enumerate(shape) if size % devices == 0]
    if divisible:  # the largest; of equal ones, the first
        axes[-max(divisible)[1]] = AXIS
    return tuple(axes)


class JaxShardedStrategy(base.Strategy):
    name = "jax-sharded"

    def compile(self, model, call):
        import keras

        plan = self.plan
        data_parallel.users_distribution(plan)  # a ModelParallel of its own: refused
        if plan.num_processes > 1:
            data_parallel.same_weights_everywhere(model)
        devices = list(plan.devices)
        mesh = keras.distribution.DeviceMesh((len(devices),), (AXIS,), devices=devices)
        distribution = _distribution(keras, mesh)
        # agnostic gives each process its own part of the data (as jax-data-parallel).
        distribution.auto_shard_dataset = plan.num_processes == 1
        wraps = data_parallel.made_again_when_frozen(model)
        in_place.compile_in(model, distribution.scope(), call)
        pipeline.wrap(model, plan.num_replicas, **data_parallel.fit_under(
            model, plan, distribution, wraps, saves=lambda: _gathered(model)))
        return model


def _gathered(model):
    """For a save of a model split over several processes: every process
    gathers each variable whole (the chief writes it), then holds its part
    again."""
    optimizer = getattr(model, "optimizer", None)
    variables = list(model.variables) + list(getattr(optimizer, "variables", []))
    return keras_variables.local_values(variables, on_host=True)


def _distribution(keras, mesh):
    """Keras's ModelParallel, each variable's layout derived from its shape
    (an empty LayoutMap: the program names no path)."""

    class Sharded(keras.distribution.ModelParallel):
        # Asked for a variable as it is made (Keras keeps a layout it has).
        def get_variable_layout(self, variable):
            return keras.distribution.TensorLayout(
                split_axes(tuple(variable.shape), mesh.shape[0]), self.device_mesh)

    return Sharded(layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name=AXIS)
