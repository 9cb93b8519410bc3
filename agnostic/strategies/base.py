"""What every strategy shares: the interface and the replica-model helpers."""
import contextlib
import functools
import random

from agnostic import backup, batching, checkpoints, collectives, errors
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


def build_replica_model(template, scope, compile_kwargs, clone_function=None):
    """Clones `template` inside `scope` with its weights, and compiles it.

    Engines create per-device variables only inside their scope, so the
    template (built anywhere) is rebuilt there; the optimizer and metric
    objects are rebuilt too, since their variables are created with them.
    """
    import keras

    with scope, _random_state_kept():
        try:
            model = keras.models.clone_model(template, clone_function=clone_function)
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
    copies, originals = _states(model), _states(template)
    if len(copies) == len(originals):
        for copy, original in zip(copies, originals):
            copy.assign(original)


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
    template = template_of(model)
    if template is not None:
        for copy, layer in zip(keras_fit.every_layer(model), keras_fit.every_layer(template)):
            layer.trainable = copy.trainable
        template.set_weights(model.get_weights())
        model = template
    unwrap(model)
    if getattr(model, "optimizer", None) is not None:
        unwrap(model.optimizer)
    return model


def wrap_returned_model(model, template, num_replicas, scope_factory=None, is_chief=True,
                        barrier=None, share=None):
    """What every returned model does around Keras's own methods.

    Checks batch splits before each call; `fit` leaves the trained weights in
    the template too, as the legacy `multi_gpu_model` did, even when fit is
    interrupted, and swaps BackupAndRestore for the atomic one; files are
    written atomically and loads name a broken file. `barrier` and `share`
    (see guard_files) are the strategy's, with several processes.
    """
    enter = scope_factory or _no_scope

    def fit(original):
        def run(*args, **kwargs):
            batching.check_call("fit", original, num_replicas, args, kwargs)
            given = batching.named_arguments(original, args, kwargs)
            if given is not None and given.get("callbacks"):
                given["callbacks"] = backup.swap_callbacks(given["callbacks"], is_chief)
                args, kwargs = (), given
            try:
                with enter():
                    return original(*args, **kwargs)
            finally:
                if model is not template:
                    template.set_weights(model.get_weights())

        return run

    def checked(method_name):
        def wrapper(original):
            def run(*args, **kwargs):
                batching.check_call(method_name, original, num_replicas, args, kwargs)
                with enter():
                    return original(*args, **kwargs)

            return run

        return wrapper

    if template is not model:
        model.__dict__["_agnostic_template"] = _TemplateLink(template)
    wrap_method(model, "fit", fit)
    for method_name in ("evaluate", "predict", "train_on_batch", "test_on_batch",
                        "predict_on_batch"):
        wrap_method(model, method_name, checked(method_name))
    guard_files(model, is_chief, barrier, share)
    if template is not model:
        # The template receives the weights: the script may save it instead.
        guard_files(template, is_chief, barrier, share)


class _TemplateLink:
    """Holds the returned model's template out of Keras's sight: Keras saves
    every layer it finds among a model's attributes, and a file would hold
    the template's weights a second time."""

    def __init__(self, template):
        self.template = template


def template_of(model):
    """The model passed to backend_agnostic_compile, for a returned model."""
    link = model.__dict__.get("_agnostic_template")
    return link.template if link is not None else None


def guard_files(model, is_chief=True, barrier=None, share=None):
    """Atomic saves on the chief, none elsewhere; loads that name bad files.

    With several processes, `barrier()` follows every save on every process,
    so that a file any process opens afterwards is the one just written, and
    `share(value)` returns the chief's value on every process (see
    agnostic/collectives.py): BackupAndRestore restores the chief's backup
    everywhere with it, so that only the chief's disk needs one."""
    collectives.attach(model, share)
    if model.__dict__.get("_agnostic_files_guarded"):
        return  # the returned model's template, guarded already
    model.__dict__["_agnostic_files_guarded"] = True
    for name in ("save", "save_weights", "export"):
        if hasattr(model, name):
            if is_chief:
                if name != "export":  # export writes a folder
                    wrap_method(model, name, checkpoints.atomic)
            else:
                wrap_method(model, name, lambda original: _skip)
            if barrier is not None:
                wrap_method(model, name, _followed_by(barrier))
    if hasattr(model, "load_weights"):
        wrap_method(model, "load_weights", checkpoints.checked_load)


def _skip(*args, **kwargs):
    return None


def _followed_by(barrier):
    def wrapper(original):
        def run(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:  # the chief's failed save must not leave the others waiting
                barrier()

        return run

    return wrapper


class _no_scope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
