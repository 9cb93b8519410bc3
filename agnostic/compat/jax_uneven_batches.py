"""JAX, Keras 3.13-3.16: a batch whose rows do not divide over the devices of
one process's DataParallel (a batch_size of 33 on 2 devices, the short last
batch of an epoch, a PyDataset's odd batch) runs whole on every device.

Keras lays every batch out split along the batch axis
(`backend.jax.distribution_lib.distribute_data_input`, looked up at each
call by the trainer), and JAX refuses a split that does not divide
(IndivisibleError), whereas one device takes any batch. Such a batch is laid
out copied on every device instead: the compiled step then computes one
device's arithmetic on the whole batch, BatchNormalization and every loss
included (the work is not shared for that batch). Only the distributions
agnostic made are changed: under any other, or none, Keras's function runs
as it is; and Keras's function is replaced only while a call of such a
model runs (compat/scoped.py). With several processes each process feeds its
own part of the batch, which cannot be copied whole: there the batches are
checked instead (pipeline.wrap).
"""
import contextlib

from agnostic.compat import scoped, versions

MARK = "_agnostic_uneven_batches"


def allow(distribution):
    """Makes `distribution` (a keras.distribution agnostic made, one process)
    take batches of any size in its scope; returns the factory of that scope
    (what the model's fit, evaluate and predict run in)."""
    _module()  # a CompatError now, not in fit
    setattr(distribution, MARK, True)

    @contextlib.contextmanager
    def scope():
        with distribution.scope(), _PATCHES.active():
            yield

    return scope


def _replacements():
    module = _module()
    yield module, "distribute_data_input", _copied_when_uneven


_PATCHES = scoped.Patches(_replacements)


def _module():
    try:
        from keras.src.backend.jax import distribution_lib
    except ImportError:
        distribution_lib = None
    if not callable(getattr(distribution_lib, "distribute_data_input", None)):
        raise versions.moved("backend.jax.distribution_lib.distribute_data_input")
    return distribution_lib


def probe(keras):
    """What the replaced function relies on (agnostic/compat/registry.py):
    `distribute_data_input(per_process_batch, layout, batch_dim_name)`,
    which the JAX trainer looks up in its module at each call (it holds the
    module, not the function), and a layout's sharding with the `mesh` and
    `spec` that say which axis is split (a 1-device mesh here)."""
    import jax
    from keras.src.backend.jax import trainer

    module = _module()
    versions.expect(versions.takes(module.distribute_data_input, "per_process_batch",
                                   "layout", "batch_dim_name"),
                    "backend.jax.distribution_lib.distribute_data_input(per_process_batch, "
                    "layout, batch_dim_name)")
    versions.expect(any(value is module for value in vars(trainer).values())
                    and "distribute_data_input" not in vars(trainer),
                    "the JAX trainer calling distribution_lib.distribute_data_input "
                    "through its module")
    mesh = keras.distribution.DeviceMesh((1,), ["batch"], devices=jax.devices()[:1])
    layout = keras.distribution.TensorLayout(["batch", None], mesh)
    sharding = getattr(layout, "backend_layout", layout)
    versions.expect(_batch_axis(sharding, "batch") == 0
                    and dict(sharding.mesh.shape) == {"batch": 1},
                    "TensorLayout.backend_layout (a jax NamedSharding with mesh and spec)")


def _copied_when_uneven(original):
    def distribute_data_input(per_process_batch, layout, batch_dim_name):
        import jax
        import keras

        sharding = getattr(layout, "backend_layout", layout)
        mesh = getattr(sharding, "mesh", None)
        axis = _batch_axis(sharding, batch_dim_name)
        if mesh is None or axis is None or axis >= getattr(per_process_batch, "ndim", 0) \
                or not getattr(keras.distribution.distribution(), MARK, False):
            return original(per_process_batch, layout, batch_dim_name)
        if per_process_batch.shape[axis] % dict(mesh.shape)[batch_dim_name] == 0:
            return original(per_process_batch, layout, batch_dim_name)
        copied = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        return jax.device_put(per_process_batch, copied)

    return distribute_data_input


def _batch_axis(sharding, batch_dim_name):
    """The axis of the data split over the devices of `batch_dim_name` (the
    first; with Keras 3.16's steps_per_execution, batches of several steps
    are split along the second)."""
    for axis, names in enumerate(tuple(getattr(sharding, "spec", ()))):
        if names == batch_dim_name or isinstance(names, tuple) and batch_dim_name in names:
            return axis
    return None
