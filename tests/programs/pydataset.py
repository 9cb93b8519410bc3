"""A keras.utils.PyDataset, with and without fit's shuffling of its batches."""
from harness import compile, digits, finish  # noqa: I001

import os

import keras
import numpy as np

keras.utils.set_random_seed(7)
x, y = digits()
SHUFFLE = os.environ.get("PROGRAM_SHUFFLE", "0") == "1"


class Digits(keras.utils.PyDataset):
    def __init__(self, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.batch_size = batch_size

    def __len__(self):
        return int(np.ceil(len(x) / self.batch_size))

    def __getitem__(self, index):
        part = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return x[part], y[part]


model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(Digits(32), epochs=2, shuffle=SHUFFLE, verbose=0)
evaluation = model.evaluate(Digits(64), verbose=0)
finish(model, history, evaluation)
