"""What every returned model does around Keras's own methods, in one place.

A call of the returned model's `fit` runs, top to bottom:

1. check: every batch splits evenly over the replicas (before any work),
   where the strategy needs equal parts (see agnostic/batching.py; the
   others take batches of any size);
2. shard: where each process feeds its own data (torch-ddp, JAX processes),
   `validation_split` is cut as one device cuts it, then this process takes
   its part of every global batch of x, y, sample_weight and validation_data
   (parts of any size where the strategy weights them, see sharding);
3. chief only: the other processes show nothing and skip file-writing
   callbacks (CSVLogger, TensorBoard);
4. backups: BackupAndRestore is swapped for the atomic one (the chief writes,
   every process restores the chief's);
5. scope: Keras's fit runs in the engine's scope (JAX: the model's own
   distribution, as several may coexist);
6. preemption: SIGTERM (or AGNOSTIC_PREEMPT_SIGNAL) stops fit after a step
   every process agrees on, the backup written there (agnostic/resume/preemption.py);

The model is the program's own (agnostic trains it in place, see
agnostic/fit/in_place.py): nothing is copied back after fit.

`evaluate` runs 1, 2, 3 and 5 (not for fit's own validation, sharded
already); `predict` 1, 3 and 5, arrays padded first to split (the padding cut
from the result: every row predicts itself; where each process feeds its
own data, every process predicts everything: no split to check); `train_on_batch` and
`test_on_batch` 1, 2 (this process's part of the batch) and 5;
`predict_on_batch` as `predict`, without 3. Files:
`save`, `save_weights` and `export` write atomically on the chief only, each
followed by a barrier across processes; `load_weights` names a broken file.
"""
from agnostic import batching, collectives, methods
from agnostic.resume import backup, checkpoints, preemption
from agnostic.fit import layer_state, sharding
from agnostic.compat import jax_on_batch, keras_fit
from agnostic.launch import local


class Processes:
    """This process's place among several: `rank` of `world`. `barrier()` and
    `share(value)` (see collectives) are the strategy's; `shards`: each
    process feeds its own part of the data (False where the engine splits
    it, as TensorFlow's workers do)."""

    def __init__(self, rank, world, barrier, share, shards=True):
        self.rank, self.world = rank, world
        self.barrier, self.share, self.shards = barrier, share, shards
        self.is_chief = rank == 0


ONE_PROCESS = Processes(0, 1, None, None, shards=False)


def wrap(model, replicas, scope=None, processes=ONE_PROCESS, predict_scope=None,
         even_shares=True, per_replica_calls=False, wraps=()):
    """Wraps `model` (the program's, which backend_agnostic_compile returns)
    as above; `replicas` the number of devices over all processes, `scope` a
    factory of the engine's scope (`predict_scope`: predict's, if another);
    `even_shares=False`: the engine weights shares of any size itself, so
    no batch is checked; `per_replica_calls`: each replica runs the layers'
    calls on its own share (TensorFlow, torch), so fit checks the layers'
    own state (layer_state). `wraps`: the strategy's own, (owner, method
    name, wrapper) triples applied in their order after these (every
    wrapper of a compiled model is applied here, in one place)."""
    checked = replicas if even_shares else 1
    enter = scope or _no_scope
    enter_predict = predict_scope or enter

    def arrived(method_name, original, given):
        """Steps 1 and 2 of any method: its batches checked, then this
        process's part of them, in `given`. Returns the rows predict keeps
        (None: all of them)."""
        rows = None
        if method_name == "predict":
            if processes.shards:  # every process predicts everything
                return None
            rows = batching.pad_for_predict(given, checked)
        batching.check_call(method_name, original, checked, (), given)
        if processes.shards:
            sharding.take_share(method_name, given, processes.rank, processes.world,
                                even_shares)
        return rows

    def fit(original):
        def run(*args, **kwargs):
            given = batching.named_arguments(original, args, kwargs)
            if given is None:
                return original(*args, **kwargs)  # Keras reports the wrong call
            arrived("fit", original, given)
            _chief_only(given, processes)
            if given.get("callbacks"):
                given["callbacks"] = backup.swap_callbacks(given["callbacks"],
                                                           processes.is_chief)
            if not preemption.supported() or \
                    not isinstance(given.get("callbacks") or [], (list, tuple)):
                # Keras 2.2 (MXNet), or a CallbackList of the program's own: left alone
                with enter():
                    return original(**given)
            watch = preemption.Watch(processes.world, processes.is_chief, local.forward,
                                     barrier=processes.barrier)
            given["callbacks"] = watch.callbacks(given.get("callbacks"))
            if per_replica_calls:
                given["callbacks"].append(
                    layer_state.callback(model, replicas, processes.is_chief))
            with enter(), watch:
                return original(**given)

        return run

    def evaluate(original):
        def run(*args, **kwargs):
            given = batching.named_arguments(original, args, kwargs)
            if given is None or keras_fit.is_fits_validation(given):
                return original(*args, **kwargs)  # fit's own data: done by fit
            arrived("evaluate", original, given)
            _chief_only(given, processes)
            with enter():
                return original(**given)

        return run

    def predict(original):
        def run(*args, **kwargs):
            given = batching.named_arguments(original, args, kwargs)
            if given is None:
                return original(*args, **kwargs)
            rows = arrived("predict", original, given)
            _chief_only(given, processes)
            with enter_predict():
                predictions = original(**given)
            return predictions if rows is None else batching.rows_of(predictions, rows)

        return run

    def on_batch(method_name):
        def wrapper(original):
            def run(*args, **kwargs):
                given = batching.named_arguments(original, args, kwargs)
                if given is None or processes.shards and method_name == "predict_on_batch":
                    with enter_predict():  # every process predicts everything
                        return original(*args, **kwargs)
                arrived(method_name, original, given)
                if method_name != "predict_on_batch":
                    jax_on_batch.fill_sample_weight(given)
                with enter():
                    return original(**given)

            return run

        return wrapper

    methods.wrap_method(model, "fit", fit)
    methods.wrap_method(model, "evaluate", evaluate)
    methods.wrap_method(model, "predict", predict)
    for method_name in ("train_on_batch", "test_on_batch", "predict_on_batch"):
        methods.wrap_method(model, method_name, on_batch(method_name))
    guard_files(model, processes)
    methods.wrap_all(wraps)


# File-writing callbacks that only the chief runs.
QUIET_CALLBACKS = ("CSVLogger", "TensorBoard", "ProgbarLogger")


def _chief_only(given, processes):
    """Step 3: only the chief shows progress and writes logs."""
    if not processes.is_chief:
        given["verbose"] = 0
        callbacks = given.get("callbacks") or []
        given["callbacks"] = [c for c in callbacks if type(c).__name__ not in QUIET_CALLBACKS]


def guard_files(model, processes=ONE_PROCESS):
    """Atomic saves on the chief, none elsewhere; loads that name bad files.

    With several processes, `barrier()` follows every save on every process,
    so that a file any process opens afterwards is the one just written, and
    `share(value)` returns the chief's value on every process (see
    agnostic/collectives.py): BackupAndRestore restores the chief's backup
    everywhere with it, so that only the chief's disk needs one."""
    collectives.attach(model, processes.share)
    for name in ("save", "save_weights", "export"):
        if hasattr(model, name):
            if processes.is_chief:
                if name != "export":  # export writes a folder
                    methods.wrap_method(model, name, checkpoints.atomic)
            else:
                methods.wrap_method(model, name, lambda original: _skip)
            if processes.barrier is not None:
                methods.wrap_method(model, name, _followed_by(processes.barrier))
    if hasattr(model, "load_weights"):
        methods.wrap_method(model, "load_weights", checkpoints.checked_load)


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
