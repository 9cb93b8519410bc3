"""jax-data-parallel: keras.distribution.DataParallel over the plan's devices.

With several processes (agnostic launch, or Keras's distribution variables),
the devices are every process's: each process feeds its own part of every
global batch, and JAX's one program computes on the whole batch.
"""
import contextlib

from agnostic import collectives, devices, errors, methods
from agnostic.fit import in_place, pipeline
from agnostic.compat import jax_uneven_batches, keras_variables
from agnostic.strategies import base


class JaxDataParallelStrategy(base.Strategy):
    name = "jax-data-parallel"

    def compile(self, model, call):
        import keras

        plan = self.plan
        users_distribution(plan)
        if plan.num_processes > 1:
            same_weights_everywhere(model)
        # agnostic gives each process its own shard (Keras would shard only
        # tf.data datasets), so Keras is told the data is already sharded.
        distribution = keras.distribution.DataParallel(
            devices=list(plan.devices), auto_shard_dataset=plan.num_processes == 1
        )
        wraps = made_again_when_frozen(model)
        in_place.compile_in(model, distribution.scope(), call)
        pipeline.wrap(model, plan.num_replicas, **fit_under(model, plan, distribution, wraps))
        return model


def fit_under(model, plan, distribution, wraps, saves=None):
    """pipeline.wrap's arguments for a model under `distribution`, which
    Keras shards each batch by at call time (each call runs under this
    model's own: several may coexist). One process: batches of any size
    (compat.jax_uneven_batches). Several: each process feeds its part of
    every batch, predicts on its own devices, and only the chief writes
    files, saving outside the mesh (`saves`: a context every process saves
    in, a split model's)."""
    if plan.num_processes == 1:
        return dict(scope=jax_uneven_batches.allow(distribution), even_shares=False,
                    wraps=wraps)
    processes = pipeline.Processes(plan.process_id, plan.num_processes,
                                   barrier=_barrier, share=collectives.jax_share)
    wraps = wraps + _save_outside_the_mesh(model)
    if saves is not None:
        wraps += methods.around_saves(model, saves)
    return dict(scope=distribution.scope, processes=processes,
                predict_scope=lambda: _locally(model), wraps=wraps)


def made_again_when_frozen(model):
    """Keras makes a model's train, test and predict functions once, their
    outputs' layouts (out_shardings) fixed for the trainable and
    non-trainable variables of that time. A layer frozen or unfrozen later
    (an encoder shared with a second model, frozen to fine-tune it) changes
    how many there are of each, and the next call failed in JAX ("pjit
    out_shardings has a subtree ... of length 0, but the full pytree ...
    of length 2"); Keras's own DataParallel fails the same way. Each
    function is made again when the variables it was made for changed.
    Returns the wraps that do it (for methods.wrap_all)."""
    made_for = {}

    def partition():
        return ([id(v) for v in model.trainable_variables],
                [id(v) for v in model.non_trainable_variables])

    def wrapper(name):
        def wrap(make):
            def run(force=False):
                now = partition()
                force = force or made_for.get(name, now) != now
                made_for[name] = now
                return make(force=force)

            return run

        return wrap

    return [(model, name, wrapper(name))
            for name in ("make_train_function", "make_test_function", "make_predict_function")]


def users_distribution(plan):
    """The program's own keras.distribution (set_distribution, or its
    scope), as Keras's guide to distribution sets it before building: a
    DataParallel over the plan's devices is what agnostic makes anyway; any
    other (ModelParallel's layouts, other devices) would be dropped for
    agnostic's, so it is refused before agnostic changes anything."""
    import keras

    users = keras.distribution.distribution()
    if users is None:
        return
    mesh = getattr(users, "device_mesh", None)
    meshed = [] if mesh is None else [_name(d) for d in mesh.devices.flatten()]
    if type(users) is keras.distribution.DataParallel and \
            sorted(meshed) == sorted(_name(d) for d in plan.devices):
        return
    raise errors.NotSupportedError(
        "backend_agnostic_compile was called under the program's own "
        f"keras.distribution.{type(users).__name__} over {len(meshed)} device(s), and "
        f"this process's plan is {plan.strategy} over {len(plan.devices)} devices "
        f"({plan.reason.rstrip('.')}). "
        "agnostic makes the distribution itself and would drop that one's layouts. "
        "Remove the set_distribution call (or its scope) to train with agnostic's "
        "DataParallel, or compile with model.compile to train under your own "
        "distribution."
    )


def _name(device):
    """"cpu:0" for a JAX device or its Keras name (Keras's meshes hold either)."""
    if hasattr(device, "platform") and hasattr(device, "id"):
        return devices.jax_name(device)
    return str(device).lower()


def _save_outside_the_mesh(model):
    """The chief saves alone, so nothing in a save may wait for the others.

    Keras's save makes a throwaway optimizer, whose variable, made under the
    active distribution, is placed on every process's devices: a step all
    processes must take together. Callbacks (ModelCheckpoint,
    BackupAndRestore) save inside fit, under the model's distribution, so
    saves run with no distribution active; the weights read the same.
    """
    import keras

    def wrap(original):
        def run(*args, **kwargs):
            active = keras.distribution.distribution()
            keras.distribution.set_distribution(None)
            try:
                return original(*args, **kwargs)
            finally:
                keras.distribution.set_distribution(active)

        return run

    return [(model, name, wrap) for name in ("save", "save_weights", "export")
            if hasattr(model, name)]


@contextlib.contextmanager
def _locally(model):
    """Each process predicts every sample on its own devices: a prediction
    spread over several processes' devices cannot be read back as one
    array. The model's variables hold this process's whole copy meanwhile
    (a variable split over the processes gathered: every process predicts)."""
    import keras

    active = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        with keras_variables.local_values(model.variables):
            yield
    finally:
        keras.distribution.set_distribution(active)


def _barrier():
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("agnostic: a file was saved")


def same_weights_everywhere(model):
    from jax.experimental import multihost_utils

    weights = multihost_utils.broadcast_one_to_all(model.get_weights())
    model.set_weights([w for w in weights])
