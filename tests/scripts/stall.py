"""Trains for a long time, as `python stall.py FOLDER`: every process writes
FOLDER/pid_<rank> once it has trained a step, so that a test can stop one of
them (SIGSTOP) in the middle of training."""
import os
import sys
import time

import keras
import numpy as np

import agnostic

FOLDER = sys.argv[1]


class Mark(keras.callbacks.Callback):
    def __init__(self, rank):
        super().__init__()
        self.path = os.path.join(FOLDER, f"pid_{rank}")

    def on_train_batch_end(self, batch, logs=None):
        if not os.path.exists(self.path):
            with open(self.path + ".part", "w") as handle:
                handle.write(str(os.getpid()))
            os.replace(self.path + ".part", self.path)
        time.sleep(0.05)


def main():
    x = np.random.default_rng(0).random((256, 8), dtype="float32")
    y = x.sum(axis=1, keepdims=True)
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model = agnostic.backend_agnostic_compile(model, optimizer="sgd", loss="mse")
    rank = agnostic.resolve().process_id
    model.fit(x, y, batch_size=16, epochs=10000, verbose=0, callbacks=[Mark(rank)])


if __name__ == "__main__":
    main()
