"""Train, save, load the file back and predict with it, twice: every
process runs the whole script, so every process loads what was saved."""
from harness import compile, digits, finish, path  # noqa: I001

import io
import os
import zipfile

import h5py
import keras
import numpy as np

keras.utils.set_random_seed(4)
x, y = digits()
model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
gaps = []
for round in range(2):
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    model.save(path("model.keras"))
    loaded = keras.models.load_model(path("model.keras"))
    # What every process loaded is what was just trained, not an older file.
    gaps.append(max(float(np.abs(a - b).max())
                    for a, b in zip(loaded.get_weights(), model.get_weights())))
rank = os.environ.get("RANK", "0")
with open(path(f"loaded-by-{rank}.txt"), "w") as handle:
    handle.write(repr(max(gaps)))
predictions = loaded.predict(x[:64], batch_size=32, verbose=0)
# What the file holds: the same entries as plain Keras writes.
with zipfile.ZipFile(path("model.keras")) as archive:
    with h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as stored:
        entries = []
        stored.visit(entries.append)
finish(model, predictions=predictions, entries=entries)
