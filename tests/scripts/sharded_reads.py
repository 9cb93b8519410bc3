"""Programs that read a split weight during fit, with shard=True on torch
over 2 processes, as `python sharded_reads.py MODE`:

- one-process: after the second step, process 0 reads the first layer's
  kernel and process 1 the second's (of the same size). The gather checks
  which weight each process sent, so the run fails naming both processes
  rather than mixing the two kernels.
- between: a train_step of the program's own reads the first kernel's
  values between backward and the update (as a step that logs a weight's
  norm does), where Keras's own step reads only gradients. It prints each
  step's norm and the trained weights' sum, as `between-plain` does on one
  device with model.compile.
"""
import json
import os
import sys

import keras
import numpy as np

import agnostic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from tests.programs.held import rank  # noqa: E402

MODE = sys.argv[1]


class ReadsOnItsOwn(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            self.model.layers[rank()].kernel.numpy()


class ReadsBetween(keras.Sequential):
    norms = []

    def train_step(self, data):
        x, y = data
        self.zero_grad()
        loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        loss.backward()
        kernel = self.layers[0].kernel
        self.norms.append(float(keras.ops.sum(keras.ops.square(kernel))))
        weights = self.trainable_weights
        self.optimizer.apply([v.value.grad for v in weights], weights)
        return {"loss": loss}


keras.utils.set_random_seed(1)
kind = ReadsBetween if MODE.startswith("between") else keras.Sequential
model = kind([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
              keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
arguments = dict(optimizer=keras.optimizers.SGD(0.01), loss="mse")
if MODE == "between-plain":
    model.compile(**arguments)
else:
    agnostic.backend_agnostic_compile(model, gpus=2, shard=True, **arguments)
x = np.random.default_rng(0).random((128, 64), dtype="float32")
callbacks = [ReadsOnItsOwn()] if MODE == "one-process" else []
model.fit(x, x.sum(axis=1), batch_size=32, epochs=1, shuffle=False, verbose=0,
          callbacks=callbacks)
total = float(sum(np.abs(w).sum() for w in model.get_weights()))
if rank() == 0:
    print(json.dumps({"norms": ReadsBetween.norms, "weights": total}))
