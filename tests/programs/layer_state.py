"""A layer's own state updated in its call, as keras.io's "Making new
layers and models via subclassing" writes one (a non-trainable weight
changed with `assign_add`): a counter of the samples seen, declared
`aggregation="sum"`, a running mean of the batches' means, declared
`aggregation="mean"`, and the largest value seen, declared nothing (as most
examples write it), in batches of 32 (equal parts on 2 devices). All are
read after fit, with the warnings fit gave about them."""
from harness import compile, digits, finish  # noqa: I001

import warnings

import keras
from keras import ops


class Counting(keras.layers.Layer):
    def build(self, input_shape):
        self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                    aggregation="sum", name="seen")
        self.running_mean = self.add_weight(shape=(input_shape[-1],), initializer="zeros",
                                            trainable=False, aggregation="mean",
                                            name="running_mean")
        self.peak = self.add_weight(shape=(input_shape[-1],), initializer="zeros",
                                    trainable=False, name="peak")

    def call(self, inputs, training=False):
        if training:
            self.seen.assign_add(ops.cast(ops.shape(inputs)[0], "float32"))
            self.running_mean.assign(0.9 * self.running_mean
                                     + 0.1 * ops.mean(inputs, axis=0))
            self.peak.assign(ops.maximum(self.peak, ops.max(inputs, axis=0)))
        return inputs


keras.utils.set_random_seed(4)
x, y = digits(320)
counting = Counting()
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                          counting, keras.layers.Dense(10, activation="softmax")])
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
finish(model, history, seen=ops.convert_to_numpy(counting.seen),
       running_mean=ops.convert_to_numpy(counting.running_mean),
       peak=ops.convert_to_numpy(counting.peak),
       warned=[str(w.message) for w in caught if "aggregation" in str(w.message)])
