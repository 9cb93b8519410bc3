"""A PyDataset as keras.io writes it ("Writing a training loop"/the
PyDataset guide: `__len__` rounds up, `__getitem__` slices by the batch
index), for training and for `validation_data`, with fit's default
`shuffle=True`; then evaluate, predict, save and `load_model`."""
from harness import compile, digits, finish, path  # noqa: I001

import math
import os

import keras
import numpy as np


class DigitsDataset(keras.utils.PyDataset):
    def __init__(self, x_set, y_set, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = x_set, y_set
        self.batch_size = batch_size

    def __len__(self):
        return math.ceil(len(self.x) / self.batch_size)

    def __getitem__(self, idx):
        low = idx * self.batch_size
        high = min(low + self.batch_size, len(self.x))
        return self.x[low:high], self.y[low:high]


keras.utils.set_random_seed(11)
x, y = digits(samples=512)
train = DigitsDataset(x[:384], y[:384], batch_size=32)
validation = DigitsDataset(x[384:], y[384:], batch_size=32)

model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(train, validation_data=validation if os.environ.get("PROGRAM_VALIDATE", "1") == "1" else None, epochs=3, verbose=0,
                    shuffle=os.environ.get("PROGRAM_SHUFFLE", "1") == "1")
evaluation = model.evaluate(validation, verbose=0)
predictions = model.predict(x[384:], verbose=0)
model.save(path("model.keras"))
loaded = keras.models.load_model(path("model.keras"))
finish(model, history, evaluation, predictions=predictions,
       loaded=loaded.predict(x[384:], verbose=0))
