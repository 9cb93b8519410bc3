"""Losses that look at the whole batch, compiled as keras.io examples write
them, on batches of 33 (shares of 17 and 16 on 2 devices): a Loss subclass
with `reduction="sum"`, a sparse categorical crossentropy averaged by the
sample weights (`reduction="mean_with_sample_weight"`) with a `sample_weight`
array, and a regression loss measured from the batch's mean; one output
each, so the history's per-output losses show each. PROGRAM_RESULT=1: the
first output's values, for a test to read."""
from harness import compile, digits, finish  # noqa: I001

import keras
import numpy as np
from keras import layers, ops


class SumOfSquares(keras.losses.Loss):
    """The squared error summed over the batch (keras.io "Customizing a
    loss" style: a subclass that reduces with "sum")."""

    def __init__(self, name="sum_of_squares"):
        super().__init__(name=name, reduction="sum")

    def call(self, y_true, y_pred):
        return ops.sum(ops.square(y_true - y_pred), axis=-1)


def centered_error(y_true, y_pred):
    """The squared error of each row's distance from the batch's mean."""
    error = y_pred - y_true
    return ops.mean(ops.square(error - ops.mean(error, axis=0, keepdims=True)), axis=-1)


keras.utils.set_random_seed(41)
x, y = digits(307)
weights = np.where(y % 3 == 0, 2.0, 0.5).astype("float32")
size = (y / 10.0).astype("float32")[:, None]

inputs = keras.Input((64,))
hidden = layers.Dense(24, activation="relu")(inputs)
outputs = {
    "summed": layers.Dense(1, name="summed")(hidden),
    "digit": layers.Dense(10, activation="softmax", name="digit")(hidden),
    "centered": layers.Dense(1, name="centered")(hidden),
}
model = keras.Model(inputs, outputs)
model = compile(
    model, optimizer=keras.optimizers.SGD(0.002),
    loss={"summed": SumOfSquares(),
          "digit": keras.losses.SparseCategoricalCrossentropy(
              reduction="mean_with_sample_weight"),
          "centered": centered_error},
    metrics={"digit": ["accuracy"]},
)
targets = {"summed": size, "digit": y, "centered": size}
history = model.fit(x, targets, sample_weight=weights, batch_size=33, epochs=2,
                    shuffle=False, verbose=0)
evaluation = model.evaluate(x, targets, sample_weight=weights, batch_size=33, verbose=0,
                            return_dict=True)
finish(model, history, evaluation)
