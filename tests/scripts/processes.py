"""Multi-process scenarios, run as `python processes.py MODE FOLDER`
(torch-ddp; and under `agnostic launch`, any engine's processes).

Every process writes its pid to FOLDER/pid_<rank>, so the tests can check
that none is left behind. The chief prints one JSON line where MODE has one.
"""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402

import agnostic  # noqa: E402
from tests import models  # noqa: E402

MODE, FOLDER = sys.argv[1], sys.argv[2]
REPLICAS = int(os.environ.get("AGNOSTIC_TEST_REPLICAS", "2"))


class Trouble(keras.callbacks.Callback):
    """Makes rank 1 fail in the middle of training, as MODE says."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def on_train_batch_end(self, batch, logs=None):
        if self.rank == 0 and batch == 1:
            open(os.path.join(FOLDER, "started"), "w").close()
        if MODE == "wait":
            time.sleep(0.05)
        if self.rank == 1 and batch == 3 and MODE == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.rank == 1 and batch == 3 and MODE == "raise":
            raise RuntimeError("worker failure in rank 1")


def reference(x, y, **fit):
    model = models.build(keras)
    model.compile(optimizer=models.sgd(keras), **models.COMPILE)
    history = model.fit(x, y, shuffle=False, verbose=0, **fit).history
    return model, history


def main():
    x, y = models.data()
    template = models.build(keras)
    model = agnostic.backend_agnostic_compile(template, optimizer=models.sgd(keras),
                                              gpus=REPLICAS, **models.COMPILE)
    rank = agnostic.resolve(gpus=REPLICAS).process_id
    with open(os.path.join(FOLDER, f"pid_{rank}"), "w") as handle:
        handle.write(str(os.getpid()))
    result = None
    if MODE in ("raise", "sigkill", "wait"):
        epochs = 200 if MODE == "wait" else 2
        model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=[Trouble(rank)])
    elif MODE == "files":
        checkpoint = keras.callbacks.ModelCheckpoint(os.path.join(FOLDER, "epoch_{epoch}.keras"))
        csv = keras.callbacks.CSVLogger(os.path.join(FOLDER, "log.csv"))
        model.fit(x, y, batch_size=16, epochs=2, verbose=2, callbacks=[checkpoint, csv])
        model.save_weights(os.path.join(FOLDER, f"rank_{rank}.weights.h5"))
        print(f"printed by rank {rank}", flush=True)  # as a user's script prints
        result = {"saved": sorted(os.listdir(FOLDER))}
    elif MODE == "inputs":
        expected_model, expected = reference(x, y, batch_size=16, epochs=2,
                                             validation_split=0.25)
        history = model.fit(x, y, 16, 2, shuffle=False, verbose=0,  # positional too
                            validation_split=0.25).history
        dataset_model, _ = reference(x, y, batch_size=16, epochs=1)
        second = models.build(keras)
        # A process can hold one group: the second model joins the same one.
        second = agnostic.backend_agnostic_compile(second, optimizer=models.sgd(keras),
                                                   gpus=REPLICAS, **models.COMPILE)
        second.fit(Batches(x, y), epochs=1, shuffle=False, verbose=0)
        result = {
            "validation_split": models.relative_difference(expected_model.get_weights(),
                                                           model.get_weights()),
            "val_loss": [history["val_loss"], expected["val_loss"]],
            "loss": [history["loss"], expected["loss"]],
            "pydataset": models.relative_difference(dataset_model.get_weights(),
                                                    second.get_weights()),
        }
    if result is not None and rank == 0:
        print(json.dumps(result))


class Batches(keras.utils.PyDataset):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x) // 16

    def __getitem__(self, index):
        part = slice(index * 16, (index + 1) * 16)
        return self.x[part], self.y[part]


if __name__ == "__main__":
    main()
