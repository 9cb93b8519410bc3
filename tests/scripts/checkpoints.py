"""Checkpoint scenarios, run as `python checkpoints.py MODE REPLICAS FOLDER`.

MODE "callbacks": unchanged Keras callbacks on several devices.
MODE "resume": 4 epochs with BackupAndRestore. KILL=epoch:batch makes a
process (rank 1 under torch-ddp, else the only one) SIGKILL itself there;
KILL_IN_WRITE=epoch kills the chief while it replaces that epoch's backup
file (the temporary file written, the rename not done). The chief saves the
final weights to FOLDER/final.npz.
MODE "own-folders": as "resume" over 2 epochs with SGD and momentum, each
node backing up to its own NODE_FOLDER (machines without a shared disk);
every process saves its final weights to FOLDER/final-RANK.npz, the
epochs it trained to FOLDER/epochs-RANK.json and agnostic's log messages to
FOLDER/logs-RANK.json. EPOCHS=n trains n epochs; DELETE=0 keeps the backup
at the end (BackupAndRestore's delete_checkpoint=False).
"""
import json
import logging
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import agnostic  # noqa: E402
from tests import models  # noqa: E402

MODE, REPLICAS, FOLDER = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def rank():
    return agnostic.resolve(gpus=REPLICAS).process_id


class KillAt(keras.callbacks.Callback):
    def __init__(self, epoch, batch, victim):
        super().__init__()
        self.kill_epoch, self.kill_batch, self.victim = epoch, batch, victim
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == (self.kill_epoch, self.kill_batch) and rank() == self.victim:
            os.kill(os.getpid(), signal.SIGKILL)


def kill_while_replacing(epoch):
    """Fault injection: SIGKILL in place of the rename that would publish the
    backup of `epoch`, after its temporary file is complete."""
    replace = os.replace

    def dying_replace(source, target):
        if os.path.basename(str(target)).startswith(f"backup-{epoch:06d}"):
            os.kill(os.getpid(), signal.SIGKILL)
        return replace(source, target)

    os.replace = dying_replace


def compiled():
    model = models.build(keras)
    return agnostic.backend_agnostic_compile(model, optimizer=models.sgd(keras),
                                             gpus=REPLICAS, **models.COMPILE)


def killers():
    """The KillAt callback KILL asks for, if any."""
    if not os.environ.get("KILL"):
        return []
    epoch, batch = map(int, os.environ["KILL"].split(":"))
    victim = 1 if agnostic.resolve(gpus=REPLICAS).num_processes > 1 else 0
    return [KillAt(epoch, batch, victim)]


def resume():
    x, y = models.data()
    model = compiled()
    callbacks = [keras.callbacks.BackupAndRestore(os.path.join(FOLDER, "backup"))]
    callbacks += killers()
    if os.environ.get("KILL_IN_WRITE") and rank() == 0:
        kill_while_replacing(int(os.environ["KILL_IN_WRITE"]))
    history = model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0,
                        callbacks=callbacks)
    if rank() == 0:
        np.savez(os.path.join(FOLDER, "final.npz"), *model.get_weights())
        return {"epochs": list(history.epoch)}
    return None


def own_folders():
    x, y = models.data()
    # Momentum: the optimizer's state must reach every process too.
    model = agnostic.backend_agnostic_compile(
        models.build(keras), optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        gpus=REPLICAS, **models.COMPILE)
    callbacks = [keras.callbacks.BackupAndRestore(
        os.path.join(os.environ["NODE_FOLDER"], "backup"),
        delete_checkpoint=os.environ.get("DELETE") != "0")] + killers()
    records = models.Records()
    logging.getLogger("agnostic").addHandler(records)
    logging.getLogger("agnostic").setLevel(logging.INFO)
    history = model.fit(x, y, batch_size=16, epochs=int(os.environ.get("EPOCHS", "2")),
                        shuffle=False, verbose=0, callbacks=callbacks)
    np.savez(os.path.join(FOLDER, f"final-{rank()}.npz"), *model.get_weights())
    with open(os.path.join(FOLDER, f"epochs-{rank()}.json"), "w") as handle:
        json.dump(list(history.epoch), handle)
    with open(os.path.join(FOLDER, f"logs-{rank()}.json"), "w") as handle:
        json.dump(records.messages, handle)


def callbacks():
    x, y = models.data()
    model = compiled()
    keras3 = models.is_keras3(keras)
    suffix = ".keras" if keras3 else ".h5"
    weights_suffix = ".weights.h5" if keras3 else ".h5"
    best = os.path.join(FOLDER, "best" + suffix)
    used = [
        keras.callbacks.ModelCheckpoint(best, monitor="loss", save_best_only=True),
        keras.callbacks.ModelCheckpoint(os.path.join(FOLDER, "w{epoch}" + weights_suffix),
                                        save_weights_only=True),
        keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0),
        keras.callbacks.CSVLogger(os.path.join(FOLDER, "log.csv")),
    ]
    if keras3:
        used.append(keras.callbacks.BackupAndRestore(os.path.join(FOLDER, "backup"),
                                                     delete_checkpoint=False))
    history = model.fit(x, y, batch_size=16, epochs=5, shuffle=False, verbose=0,
                        callbacks=used)
    if rank() != 0:
        return None
    np.save(os.path.join(FOLDER, "x.npy"), x)
    np.save(os.path.join(FOLDER, "predictions.npy"), model.predict(x, batch_size=16, verbose=0))
    return {"epochs": list(history.epoch), "files": sorted(os.listdir(FOLDER)),
            "backup": sorted(os.listdir(os.path.join(FOLDER, "backup"))) if keras3 else []}


if __name__ == "__main__":
    result = {"resume": resume, "callbacks": callbacks, "own-folders": own_folders}[MODE]()
    if result is not None:
        print(json.dumps(result))
