"""Batches of any size, as users pass them: a batch_size that does not
divide by the devices (PROGRAM_BATCH: 33, 17, 1) over a number of rows that
leaves a short last batch (PROGRAM_ROWS, default 1,001), through fit with
validation_data, a keras.io-style PyDataset whose batches are just as odd,
a validation_split with class weights, evaluate, predict on 7 rows with
the default batch, and train_on_batch,
test_on_batch and predict_on_batch on a few rows. The model normalises its
batches (BatchNormalization), so each share of a batch must count as one
device counts it."""
import math
import os

from harness import compile, finish  # noqa: I001

import keras
import numpy as np

BATCH = int(os.environ.get("PROGRAM_BATCH", "33"))
ROWS = int(os.environ.get("PROGRAM_ROWS", "1001"))


class Rows(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return math.ceil(len(self.x) / self.batch_size)

    def __getitem__(self, idx):
        low = idx * self.batch_size
        high = min(low + self.batch_size, len(self.x))
        return self.x[low:high], self.y[low:high]


keras.utils.set_random_seed(3)
rng = np.random.default_rng(0)
x = rng.normal(size=(ROWS, 6)).astype("float32")
y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
validation = ROWS // 10 + 1  # odd as well

model = keras.Sequential([
    keras.Input((6,)),
    keras.layers.Dense(12),
    keras.layers.BatchNormalization(),
    keras.layers.Activation("relu"),
    keras.layers.Dense(2, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.05, momentum=0.5),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                    validation_data=(x[:validation], y[:validation]))
from_dataset = model.fit(Rows(x, y, BATCH), epochs=1, shuffle=False, verbose=0)
# Keras cuts validation_split at floor(rows * 0.77): 770 of 1,001 for training.
from_split = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                       validation_split=0.23, class_weight={0: 1.0, 1: 2.0})
evaluation = model.evaluate(x, y, batch_size=BATCH, verbose=0)
trained = model.train_on_batch(x[:5], y[:5], return_dict=True)
tested = model.test_on_batch(x[:3], y[:3], return_dict=True)
finish(model, history, evaluation,
       from_dataset=from_dataset.history,
       from_split=from_split.history,
       on_batch=[trained, tested],
       predictions=model.predict(x[:7], verbose=0),
       on_batch_predictions=model.predict_on_batch(x[:3]))
