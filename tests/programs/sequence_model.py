"""Embedding, LSTM and GRU on token sequences, with class_weight for an
unbalanced binary task."""
from harness import compile, finish  # noqa: I001

import keras
import numpy as np
from keras import layers

keras.utils.set_random_seed(11)
rng = np.random.default_rng(11)
tokens = rng.integers(1, 50, size=(256, 12))
y = (tokens[:, :3].sum(axis=1) > 110).astype("float32")  # about a fifth positive

model = keras.Sequential([
    keras.Input((12,), dtype="int32"),
    layers.Embedding(50, 8),
    layers.LSTM(8, return_sequences=True),
    layers.GRU(8),
    layers.Dense(1, activation="sigmoid"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy",
                metrics=["binary_accuracy"])
history = model.fit(tokens, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                    class_weight={0: 1.0, 1: 3.0})
evaluation = model.evaluate(tokens, y, batch_size=64, verbose=0)
finish(model, history, evaluation)
