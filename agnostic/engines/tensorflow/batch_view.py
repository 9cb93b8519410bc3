"""TensorFlow's View of the global batch in a replica's step
(agnostic/fit/global_batch.py), through the replica context's collectives.

`ReplicaContext.all_gather` takes parts of any size along the axis. The
backward passes here call no collective where global_batch.py says none is
needed: under MirroredStrategy the replicas' collectives pair up in the order
each replica calls them, and a backward pass need not call them in the same
order on every replica.
"""


def view():
    """The View of the step being traced, in a replica of a strategy over
    several replicas; None elsewhere (one replica: nothing to gather)."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or tf.distribute.in_cross_replica_context() \
            or context.num_replicas_in_sync == 1:
        return None
    return View(context)


class View:
    def __init__(self, context):
        self.context = context
        self.replicas = context.num_replicas_in_sync

    def _all_gather(self, value):
        """Every replica's `value`, joined. TensorFlow gathers to the
        value's device: a tensor placed on none (a worker's batch, where a
        worker's one replica runs without a device scope) is put on the
        worker's device first."""
        import tensorflow as tf

        local = self.context.strategy.extended.worker_devices
        if not value.device and len(local) == 1:
            with tf.device(local[0]):
                value = tf.identity(value)
        if value.dtype == tf.string:
            return self._all_gather_strings(value)
        gathered = self.context.all_gather(value, axis=0)
        gathered.set_shape([None] + value.shape[1:])  # workers' collectives lose it
        return gathered

    def _all_gather_strings(self, value):
        """Strings (a text model's raw inputs), which collectives do not
        carry: sent as their bytes (int32, padded to the longest string of
        any replica) and their lengths, joined again on arrival."""
        import tensorflow as tf

        flat = tf.reshape(value, [-1])
        lengths = tf.strings.length(flat)
        longest = tf.reduce_max(self.context.all_gather(
            tf.reshape(tf.reduce_max(tf.concat([lengths, [1]], 0)), [1]), axis=0))
        codes = tf.cast(tf.io.decode_raw(flat, tf.uint8, fixed_length=longest), tf.int32)
        codes = self.context.all_gather(tf.reshape(codes, [-1, longest]), axis=0)
        lengths = self.context.all_gather(lengths, axis=0)
        characters = tf.gather(tf.constant([bytes([b]) for b in range(256)]), codes)
        kept = tf.sequence_mask(lengths, longest)
        joined = tf.strings.reduce_join(tf.where(kept, characters, ""), axis=1)
        joined = tf.reshape(joined, tf.concat([[-1], tf.shape(value)[1:]], 0))
        joined.set_shape([None] + value.shape[1:])
        return joined

    def is_tensor(self, value):
        import tensorflow as tf

        return isinstance(value, tf.Tensor)

    def leading(self, value):
        return value.shape[0]

    def rows(self, value):
        import tensorflow as tf

        return tf.shape(value)[0]

    def gather_data(self, data):
        """Every replica's rows of the step's data, in replica order."""
        import keras

        first = next((value for value in keras.tree.flatten(data)
                      if self.is_tensor(value) and value.shape.rank), None)
        if first is None:
            return data
        rows = first.shape[0]

        def gathered(value):
            if self.is_tensor(value) and value.shape.rank and value.shape[0] == rows:
                return self._all_gather(value)
            return value

        return keras.tree.map_structure(gathered, data)

    def split(self, rows):
        """This replica's rows of `rows`, as tf.distribute splits a batch:
        the first replicas take one more where they do not divide."""
        import tensorflow as tf

        index = tf.cast(self.context.replica_id_in_sync_group, rows.dtype)
        base, extra = rows // self.replicas, rows % self.replicas
        start = index * base + tf.minimum(index, extra)
        return start, start + base + tf.cast(index < extra, rows.dtype)

    def part(self, value, start, stop):
        import tensorflow as tf

        if not value.dtype.is_floating:
            return value[start:stop]
        replicas = self.replicas

        @tf.custom_gradient
        def part(whole):
            def gradient(upstream):
                # Every replica's part of the input's gradient, as one
                # device's; each carries the whole loss, hence the mean.
                return self._all_gather(upstream) / tf.cast(replicas, upstream.dtype)

            return tf.identity(whole[start:stop]), gradient

        return part(value)

    def gather(self, value, start, stop, rows):
        import tensorflow as tf

        if not value.dtype.is_floating:
            return self._all_gather(value)
        replicas = self.replicas

        @tf.custom_gradient
        def gather(part):
            def gradient(upstream):
                return upstream[start:stop] * tf.cast(replicas, upstream.dtype)

            return tf.identity(self._all_gather(part)), gradient

        return gather(value)

    def when_rows(self, rows, part_rows, if_equal, otherwise):
        """`if_equal()` where `rows` (a draw's first dimension) is this
        replica's rows, else `otherwise()`; decided as the step runs where
        either is known only then."""
        import tensorflow as tf

        if isinstance(rows, int) and isinstance(part_rows, int):
            return if_equal() if rows == part_rows else otherwise()
        return tf.cond(tf.equal(tf.cast(rows, tf.int32), tf.cast(part_rows, tf.int32)),
                       if_equal, otherwise)

    def noise_shape(self, inputs, noise_shape):
        """Dropout's noise shape with the inputs' dimensions where it has None."""
        import tensorflow as tf

        dynamic = tf.shape(inputs)
        given = noise_shape if noise_shape is not None else [None] * inputs.shape.rank
        return [dynamic[i] if size is None else size for i, size in enumerate(given)]

    def ones(self, shape, like):
        import tensorflow as tf

        return tf.ones(tf.stack([tf.cast(size, tf.int32) for size in shape]), like.dtype)

    def weighted_sum(self, value, start, stop, rows):
        import tensorflow as tf

        # A replica given no rows adds 0, not the NaN of a mean over none.
        weighted = tf.math.multiply_no_nan(
            value, tf.cast(stop - start, value.dtype) / tf.cast(rows, value.dtype))
        summed = self.context.all_reduce(tf.distribute.ReduceOp.SUM, tf.stop_gradient(weighted))
        local = weighted * tf.cast(self.replicas, value.dtype)
        return tf.stop_gradient(summed - local) + local


def first_replicas_metrics():
    """A variable creator scope in which metrics' variables (read by summing
    the replicas' copies, Keras's `on_read` "sum") are read from the first
    replica: under the global view every replica's copy holds the whole
    batch's state, one device's."""
    import tensorflow as tf

    def creator(next_creator, **kwargs):
        if kwargs.get("synchronization") == tf.VariableSynchronization.ON_READ \
                and kwargs.get("aggregation") in (tf.VariableAggregation.SUM,
                                                  tf.VariableAggregation.MEAN):
            kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
        return next_creator(**kwargs)

    return tf.variable_creator_scope(creator)
