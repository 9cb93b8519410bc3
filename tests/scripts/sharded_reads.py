"""A program that reads a weight during fit on one process only, with
shard=True on torch over 2 processes, as `python sharded_reads.py`: after
the second step, process 0 reads the first layer's kernel and process 1 the
second's (of the same size), while each is split over the processes. The
gather checks which weight each process sent, so the run fails naming both
processes rather than mixing the two kernels."""
import os
import sys

import keras
import numpy as np

import agnostic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from tests.programs.held import rank  # noqa: E402


class ReadsOnItsOwn(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            self.model.layers[rank()].kernel.numpy()


keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
agnostic.backend_agnostic_compile(model, optimizer="sgd", loss="mse", gpus=2, shard=True)
x = np.random.default_rng(0).random((128, 64), dtype="float32")
model.fit(x, x.sum(axis=1), batch_size=32, epochs=1, verbose=0, callbacks=[ReadsOnItsOwn()])
print("trained")
