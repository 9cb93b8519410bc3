"""What every strategy shares: the interface and the replica-model helpers."""
import contextlib
import functools
import random

from agnostic import errors
from agnostic.compat import keras_fit


class Strategy:
    """Executes a Plan: turns a template model into a compiled model."""

    name = ""

    def __init__(self, plan, cpu_merge=True, cpu_relocation=False, sync_batch_norm=True):
        self.plan = plan
        self.cpu_merge = cpu_merge
        self.cpu_relocation = cpu_relocation
        self.sync_batch_norm = sync_batch_norm

    def compile(self, template, compile_kwargs):
        raise NotImplementedError


def build_replica_model(template, scope, compile_kwargs, clone_function=None,
                        call_function=None):
    """Clones `template` inside `scope` with its weights, and compiles it
    (`clone_function`, `call_function`: as for keras.models.clone_model).

    Engines create per-device variables only inside their scope, so the
    template (built anywhere) is rebuilt there; the optimizer and metric
    objects are rebuilt too, since their variables are created with them.
    """
    import keras

    with scope, _random_state_kept():
        try:
            model = keras.models.clone_model(template, clone_function=clone_function,
                                             call_function=call_function)
        except Exception as error:  # clone_model raises many types
            raise errors.ModelCopyError(
                "agnostic rebuilds the model inside the strategy's scope with "
                "keras.models.clone_model, which failed for "
                f"{type(template).__name__}: {error}. Build the model with the "
                "functional API or Sequential, or give your subclass "
                "get_config() and from_config()."
            ) from error
        model.set_weights(template.get_weights())
        _same_random_seeds(template, model)
        model.compile(**fresh_compile_objects(compile_kwargs))
        if keras.backend.backend() == "tensorflow":
            from agnostic.compat import tf_loss_scaling

            tf_loss_scaling.keep_losses_unscaled(model, scope_replicas())
    return model


def scope_replicas():
    """The number of replicas of the tf.distribute strategy in scope."""
    import tensorflow as tf

    return tf.distribute.get_strategy().num_replicas_in_sync


def _same_random_seeds(template, model):
    """The copy's random layers (Dropout, augmentation) start from the
    template's seeds: their states are variables but not weights, and the
    clone drew new ones."""
    import keras

    copies, originals = _states(model), _states(template)
    if len(copies) == len(originals):
        for copy, original in zip(copies, originals):
            # A copy of the value: JAX may otherwise share the template's
            # buffer with the copy's, and training (which donates the
            # copy's) would delete the template's.
            copy.assign(keras.ops.convert_to_numpy(original.value))


def _states(model):
    """The model's variables that are not weights (random layers' seeds)."""
    weights = {id(weight) for weight in model.weights}
    return [v for v in model.variables if id(v) not in weights]


@contextlib.contextmanager
def _random_state_kept():
    """Cloning draws seeds for the new layers' initializers from Python's and
    NumPy's generators; what the script draws next (a PyDataset's shuffled
    order, say) must be what it draws on one device, where no clone is made."""
    import numpy as np

    kept = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(kept[0])
        np.random.set_state(kept[1])


def fresh_compile_objects(compile_kwargs):
    """Copies of the optimizer and metric objects, made in the current scope."""
    import keras

    def renew(value):
        if isinstance(value, (keras.optimizers.Optimizer, keras.metrics.Metric)):
            return type(value).from_config(value.get_config())
        if isinstance(value, (list, tuple)):
            return type(value)(renew(v) for v in value)
        if isinstance(value, dict):
            return {k: renew(v) for k, v in value.items()}
        return value

    return {key: renew(value) for key, value in compile_kwargs.items()}


def wrap_method(model, name, wrapper):
    """Replaces `model.name` on this instance by `wrapper(original)`;
    `unwrap(model)` puts back what was there before agnostic."""
    original = getattr(model, name)
    originals = model.__dict__.setdefault("_agnostic_originals", {})
    originals.setdefault(name, model.__dict__.get(name))  # None: the class's
    setattr(model, name, functools.wraps(original)(wrapper(original)))


def unwrap(model):
    """Undoes every wrap_method on `model` (compiling again starts clean)."""
    for name, original in model.__dict__.pop("_agnostic_originals", {}).items():
        if original is None:
            model.__dict__.pop(name, None)
        else:
            setattr(model, name, original)
    model.__dict__.pop("_agnostic_files_guarded", None)


def start_again(model):
    """The model to compile when `model` went through backend_agnostic_compile
    before (fine-tuning: freeze layers, compile again): its template, with the
    returned model's weights and trainable flags, without the wrappers of the
    first compile, which would otherwise apply twice."""
    from agnostic import pipeline

    template = pipeline.template_of(model)
    if template is not None:
        for copy, layer in zip(keras_fit.every_layer(model), keras_fit.every_layer(template)):
            layer.trainable = copy.trainable
        template.set_weights(model.get_weights())
        model = template
    unwrap(model)
    if getattr(model, "optimizer", None) is not None:
        unwrap(model.optimizer)
    return model
