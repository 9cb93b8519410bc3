"""TensorFlow: one device's loss and gradient arithmetic under agnostic's
tf.distribute strategies.

Keras 3.13-3.16 under a strategy divide every loss they compute by the
number of replicas (`keras.src.losses.loss.scale_loss_for_distribution`,
private) inside each compiled loss and the added ones, let each replica's
optimizer clip, accumulate and average its own gradients, and sum the
replicas' gradients only in the last step of `apply`
(`_backend_update_step`). So on N replicas `clipnorm`, `clipvalue` and
`global_clipnorm` clip each replica's part of the gradient; a term that a
`compute_loss` override adds is not divided and counts N times; shares of
unequal size count equally; sparse gradients (`IndexedSlices`) of a lookup
made once per step (a position embedding) reach Adam's second moment as N
slices per row; and `gradient_accumulation_steps` fails (a merge_call
inside a `cond`).

Inside the steps of a model agnostic compiled:

- every loss is one device's on the replica's share (the scaling above does
  nothing), so trackers and custom steps see one device's numbers;
- each replica's loss is weighted by its share of the global batch
  (n_r / n) where Keras's train_step scales it for the optimizer (its
  gradients through synchronized batch statistics then carry the weight
  too), or else its gradients are; every optimizer's `apply` sums the
  replicas' gradients and runs
  the rest of `apply` (clipping, weight decay, accumulation, moving
  averages, the update) once, in cross-replica context, on that sum: one
  device's gradient, for the mean-over-batch losses Keras computes and for
  the terms that do not depend on the batch (regularizers, a
  `compute_loss` term), shares of any size;
- sparse gradients are the replicas' slices together, as one device's lookup
  gives them, except that a lookup whose indices are the same on every
  replica (one shared by the whole batch) has its slices summed, row by row.

The module functions this needs changed (Keras's loss scaling, TensorFlow's
`maybe_merge_call`) are replaced only while such a step runs
(compat/tf_loss_scaling.py); the methods, on the model's and its
optimizers' instances only (agnostic/methods.py).
"""
import threading

from agnostic.compat import tf_loss_scaling

_step = threading.local()  # replicas trace their steps on threads of their own

STEPS = ("train_step", "test_step")


def one_device_arithmetic(model, optimizers, trackers, global_view=False):
    """`model`'s steps compute one device's losses on their share, each of
    `optimizers` applies the gradients of the global batch, and each of
    `trackers` (the model's mean metrics) weighs a share by its rows.
    `global_view`: the steps see the whole global batch on every replica
    (agnostic/fit/global_batch.py), whose gradients are then averaged.
    Returns the wraps that do it, (owner, method name, wrapper) triples for
    methods.wrap_all."""
    tf_loss_scaling.check()
    wraps = [(model, name, _recording_share(global_view)) for name in STEPS]
    if not global_view:
        wraps += [(tracker, "update_state", _weighted_when_unweighted) for tracker in trackers]
    wraps.append((model, "compute_loss", _nothing_from_an_empty_share))
    for optimizer in optimizers:
        wraps += [(optimizer, "scale_loss", _weighted_by_share(optimizer)),
                  (optimizer, "apply", _summed_first(optimizer))]
    return wraps


def _recording_share(global_view):
    def wrapper(step):
        def run(data, *args, **kwargs):
            previous = (getattr(_step, "rows", None), getattr(_step, "weighted", None),
                        getattr(_step, "whole", False))
            _step.rows, _step.weighted, _step.whole = _rows(data), set(), global_view
            try:
                with tf_loss_scaling.one_device_losses():
                    return step(data, *args, **kwargs)
            finally:
                _step.rows, _step.weighted, _step.whole = previous

        return run

    return wrapper


def _share():
    """This replica's part of the global batch, n_r / n (0 for no rows);
    1 / replicas where every replica's step saw the whole batch."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if _step.whole:
        return tf.constant(1.0 / context.num_replicas_in_sync)
    rows = _step.rows
    return tf.math.divide_no_nan(rows, context.all_reduce(tf.distribute.ReduceOp.SUM, rows))


def _in_replica_step():
    import tensorflow as tf

    return (_in_step() and tf.distribute.get_replica_context() is not None
            and not tf.distribute.in_cross_replica_context())


def _weighted_when_unweighted(update_state):
    """A Mean tracker updated in a replica's step with one value and no
    weight counts it by the replica's share of the batch (replicas * n_r /
    n): the tracker then holds the mean of the global batches' values, as on
    one device, not the mean of the replicas' (which differ for shares of
    unequal size)."""
    def run(values, sample_weight=None):
        import tensorflow as tf

        if sample_weight is None and _in_replica_step() \
                and tf.convert_to_tensor(values).shape.num_elements() == 1:
            replicas = tf.distribute.get_replica_context().num_replicas_in_sync
            sample_weight = tf.reshape(_share() * replicas, tf.shape(values))
        return update_state(values, sample_weight=sample_weight)

    return run


def _weighted_by_share(optimizer):
    """Keras's own train_step scales its loss through the optimizer before
    taking gradients: the loss is weighted there, so that gradients flowing
    across replicas (synchronized batch statistics) carry each share's
    weight too; `apply` then only sums."""
    def wrapper(scale_loss):
        def run(loss):
            loss = scale_loss(loss)
            if not _in_replica_step():
                return loss
            import tensorflow as tf

            _step.weighted.add(id(optimizer))
            return tf.math.multiply_no_nan(loss, tf.cast(_share(), loss.dtype))

        return run

    return wrapper


def _nothing_from_an_empty_share(compute_loss):
    """A replica given no rows (the last batch of an epoch, smaller than
    the replicas) adds 0, not the NaN of a mean over nothing (nor, where its
    share is known to be empty as it is traced, the empty tensor Keras's
    loss then is: *_on_batch)."""
    def run(*args, **kwargs):
        import tensorflow as tf

        loss = compute_loss(*args, **kwargs)
        rows = getattr(_step, "rows", None)
        if rows is None or loss is None:
            return loss
        if loss.shape.num_elements() == 0:
            loss = tf.reduce_sum(loss)
        return tf.where(rows > 0, loss, tf.zeros_like(loss))

    return run


def _rows(data):
    """The number of rows in a replica's share of the batch (a tensor)."""
    import tensorflow as tf

    for value in tf.nest.flatten(data):
        if value is not None and getattr(value, "shape", None) is not None \
                and value.shape.rank:
            return tf.cast(tf.shape(value)[0], tf.float32)
    return tf.constant(1.0)


def _in_step():
    return getattr(_step, "rows", None) is not None


def _summed_first(optimizer):
    """`apply` on the sum of the replicas' gradients, each weighted by its
    share (here, unless its loss was weighted already)."""
    def wrapper(apply):
        def run(grads, trainable_variables=None):
            import tensorflow as tf

            if not _in_replica_step():
                return apply(grads, trainable_variables)
            grads = list(grads)
            if id(optimizer) not in _step.weighted:  # a train_step of the program's
                share = _share()
                grads = [_scaled(g, share) for g in grads]
            if hasattr(optimizer, "inner_optimizer"):
                # A LossScaleOptimizer (mixed precision) runs its inner one
                # per replica itself, which sums at the update as Keras does:
                # the shares are weighted, clipping stays per replica.
                return apply(grads, trainable_variables)
            grads = [_every_replicas_slices(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
            return tf.distribute.get_replica_context().merge_call(
                _apply_summed, args=(apply, grads, trainable_variables))

        return run

    return wrapper


def _scaled(gradient, share):
    import tensorflow as tf

    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        values = tf.math.multiply_no_nan(gradient.values, tf.cast(share, gradient.values.dtype))
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return tf.math.multiply_no_nan(gradient, tf.cast(share, gradient.dtype))


def _apply_summed(strategy, apply, grads, trainable_variables):
    import tensorflow as tf

    summed = list(grads)
    dense = [i for i, g in enumerate(grads)
             if g is not None and not _is_sparse(strategy, g)]
    if dense:
        reduced = strategy.extended.batch_reduce_to(
            tf.distribute.ReduceOp.SUM, [(grads[i], grads[i]) for i in dense])
        for i, value in zip(dense, reduced):
            summed[i] = value
    for i, g in enumerate(grads):
        if g is not None and _is_sparse(strategy, g):
            # Every replica's slices already (_every_replicas_slices).
            summed[i] = strategy.experimental_local_results(g)[0]
    return apply(summed, trainable_variables)


def _is_sparse(strategy, value):
    import tensorflow as tf

    return isinstance(strategy.experimental_local_results(value)[0], tf.IndexedSlices)


def _every_replicas_slices(gradient):
    """In a replica: every replica's IndexedSlices of one variable as one,
    gathered across all replicas (over every worker too): summed slice by
    slice when every replica looked up the same indices (a lookup shared by
    the whole batch), else concatenated in replica order, as one device's
    lookup over the whole batch gives them."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync
    values = context.all_gather(gradient.values, axis=0)
    indices = context.all_gather(gradient.indices, axis=0)
    sizes = context.all_gather(tf.reshape(tf.size(gradient.indices), [1]), axis=0)

    def each_replicas(tensor):
        return tf.reshape(tensor, tf.concat([[replicas, -1], tf.shape(tensor)[1:]], 0))

    same = tf.cond(tf.reduce_all(tf.equal(sizes, sizes[0])),
                   lambda: tf.reduce_all(tf.equal(each_replicas(indices),
                                                  each_replicas(indices)[:1])),
                   lambda: tf.constant(False))
    values, indices = tf.cond(
        same, lambda: (tf.reduce_sum(each_replicas(values), axis=0), each_replicas(indices)[0]),
        lambda: (values, indices))
    return tf.IndexedSlices(values, indices, gradient.dense_shape)
