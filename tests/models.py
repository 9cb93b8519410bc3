"""The model and data a new user would write: functional, two branches,
built outside any scope, trained with SGD and shuffle=False.

Written once for Keras 3 and for Keras 2.2 (keras-mxnet), whose names differ
in a few places: those differences live here.
"""
import logging
import os

import numpy as np

SAMPLES = 96
BATCH = 16
EPOCHS = 2
COMPILE = dict(loss="sparse_categorical_crossentropy", metrics=["accuracy"])


def is_keras3(keras):
    return int(keras.__version__.split(".")[0]) >= 3


def seed(keras, value):
    if is_keras3(keras):
        keras.utils.set_random_seed(value)
    else:  # Keras 2.2 initializers draw from the engine's generator
        import mxnet

        np.random.seed(value)
        mxnet.random.seed(value)


def build(keras, seed_value=1, model_class=None):
    seed(keras, seed_value)
    inputs = keras.layers.Input((8,))
    left = keras.layers.Dense(16, activation="relu")(inputs)
    right = keras.layers.Dense(16, activation="tanh")(inputs)
    merged = keras.layers.concatenate([left, right])
    outputs = keras.layers.Dense(3, activation="softmax")(merged)
    return (model_class or keras.models.Model)(inputs, outputs)


def sgd(keras):
    return keras.optimizers.SGD(0.1)  # positional: `learning_rate` / Keras 2.2 `lr`


def accuracy(history):
    return history["accuracy"] if "accuracy" in history else history["acc"]


def model_file(keras, folder, name):
    return os.path.join(str(folder), name + (".keras" if is_keras3(keras) else ".h5"))


def saved_weights(path):
    """The weights a run saved with np.savez(path, *model.get_weights())."""
    stored = np.load(str(path))
    return [stored[f"arr_{index}"] for index in range(len(stored.files))]


def data(samples=SAMPLES):
    rng = np.random.RandomState(0)
    x = rng.normal(size=(samples, 8)).astype("float32")
    y = rng.randint(0, 3, samples)
    return x, y


def relative_difference(expected, actual):
    largest = max(float(np.abs(w).max()) for w in expected)
    return max(float(np.abs(a - b).max()) for a, b in zip(expected, actual)) / largest


def devices_of(weight):
    """The devices holding a Keras 3 variable: a jax array's, or each TF copy's."""
    value = weight.value
    if hasattr(value, "sharding"):
        return {f"{d.platform}:{d.id}" for d in value.sharding.device_set}
    return {copy.device for copy in getattr(value, "values", (value,))}


class Records(logging.Handler):
    """Keeps agnostic's log messages."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())
