"""Preemption scenarios, run as `python preempt.py FOLDER`.

Trains 4 epochs of 6 steps (SGD with momentum, shuffle=False) on 2 devices
(AGNOSTIC_TEST_REPLICAS; torch: 2 processes the shim starts, or a
scheduler's tasks) and saves the chief's final weights to
FOLDER/final.npz; prints as JSON the epochs this run trained and the
(epoch, batch) its callback's batch hooks were called for.

BACKUP=epoch|N: keras.callbacks.BackupAndRestore(FOLDER/backup, save_freq).
MARK=epoch:batch: the chief writes FOLDER/marker after that step, then
waits there (MARK_SECONDS, 30 s at most) until a preempting signal has
reached it, so the step every process stops after is known: the next one.
KILL=epoch:batch: the chief SIGKILLs itself after that step.
"""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import agnostic  # noqa: E402
from agnostic.resume import preemption  # noqa: E402
from tests import models  # noqa: E402

FOLDER = sys.argv[1]
REPLICAS = int(os.environ.get("AGNOSTIC_TEST_REPLICAS", "2"))


def at(variable):
    value = os.environ.get(variable)
    return tuple(map(int, value.split(":"))) if value else None


class Steps(keras.callbacks.Callback):
    def __init__(self, chief):
        super().__init__()
        self.chief, self.epoch = chief, 0
        self.mark, self.kill = at("MARK"), at("KILL")
        self.begun, self.ended = [], []  # (epoch, batch) of each batch hook

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        self.begun.append([self.epoch, batch])

    def on_train_batch_end(self, batch, logs=None):
        self.ended.append([self.epoch, batch])
        if not self.chief:
            return
        if (self.epoch, batch) == self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if (self.epoch, batch) == self.mark:
            with open(os.path.join(FOLDER, "marker"), "w"):
                pass
            deadline = time.monotonic() + float(os.environ.get("MARK_SECONDS", "30"))
            while not preemption.current().requested and time.monotonic() < deadline:
                time.sleep(0.01)


def main():
    x, y = models.data(192)
    model = agnostic.backend_agnostic_compile(
        models.build(keras), optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        gpus=REPLICAS, **models.COMPILE)
    chief = agnostic.resolve(gpus=REPLICAS).process_id == 0
    steps = Steps(chief)
    callbacks = [steps]
    if os.environ.get("BACKUP"):
        frequency = os.environ["BACKUP"]
        callbacks.insert(0, keras.callbacks.BackupAndRestore(
            os.path.join(FOLDER, "backup"),
            save_freq=int(frequency) if frequency.isdigit() else frequency))
    history = model.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0,
                        callbacks=callbacks)
    if chief:
        np.savez(os.path.join(FOLDER, "final.npz"), *model.get_weights())
        print(json.dumps({"epochs": list(history.epoch), "begun": steps.begun,
                          "ended": steps.ended}))


if __name__ == "__main__":
    main()
