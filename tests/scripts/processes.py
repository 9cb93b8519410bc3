"""Multi-process scenarios, run as `python processes.py MODE FOLDER`
(torch-ddp; and under `agnostic launch`, any engine's processes).

Every process writes its pid to FOLDER/pid_<rank>, so the tests can check
that none is left behind. The chief prints one JSON line where MODE has one.
"""
import atexit
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
        if batch == 3 and MODE == "everyone":  # a bug in the script: every rank fails
            raise ValueError(f"the same bug, met by rank {self.rank}")


def left_group():
    """Records, at exit, whether this process's group was ended."""
    import torch.distributed as dist

    rank = os.environ.get("RANK", "0")
    with open(os.path.join(FOLDER, f"group_at_exit_{rank}"), "w") as handle:
        handle.write("open" if dist.is_initialized() else "ended")


def reference(x, y, **fit):
    model = models.build(keras)
    model.compile(optimizer=models.sgd(keras), **models.COMPILE)
    history = model.fit(x, y, shuffle=False, verbose=0, **fit).history
    return model, history


def main():
    if MODE == "overlap":  # several buckets even for this small model
        from agnostic.strategies import torch_reduce

        torch_reduce.BUCKET_BYTES = torch_reduce.FIRST_BUCKET_BYTES = 64
    x, y = models.data()
    if MODE == "files" and keras.backend.backend() == "torch":  # after agnostic's handlers
        atexit.register(left_group)
    template = models.build(keras)
    model = agnostic.backend_agnostic_compile(template, optimizer=models.sgd(keras),
                                              gpus=REPLICAS, **models.COMPILE)
    rank = agnostic.resolve(gpus=REPLICAS).process_id
    with open(os.path.join(FOLDER, f"pid_{rank}"), "w") as handle:
        handle.write(str(os.getpid()))
    result = None
    if MODE in ("raise", "sigkill", "wait", "everyone"):
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
    elif MODE == "overlap":
        result = overlap(x, y, model, rank)
    elif MODE == "manual":  # a step that updates the weights itself
        manual = models.build(keras, model_class=ManualUpdate)
        manual = agnostic.backend_agnostic_compile(manual, optimizer=models.sgd(keras),
                                                   gpus=REPLICAS, **models.COMPILE)
        manual.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        result = {"done": True}
    if result is not None and rank == 0:
        print(json.dumps(result))


def overlap(x, y, model, rank):
    """Gradients summed while backward runs (small buckets, so that there are
    several); a backward pass outside fit on one process only; a model whose
    own train_step runs backward twice (gradient accumulation)."""
    import torch

    if rank == 0:  # e.g. a saliency map: no collective may start here
        model(torch.as_tensor(x[:4])).sum().backward()
    expected, _ = reference(x, y, batch_size=16, epochs=2)
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    reducer = model._agnostic_reducer
    sent_early, buckets = reducer.early, len(reducer.buckets)
    halves = models.build(keras, model_class=TwoHalves)
    halves = agnostic.backend_agnostic_compile(halves, optimizer=models.sgd(keras),
                                               gpus=REPLICAS, **models.COMPILE)
    halves.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    plain, _ = reference(x, y, batch_size=16, epochs=1)
    return {
        "buckets": buckets, "sent_early": sent_early,
        "plain": models.relative_difference(expected.get_weights(), model.get_weights()),
        "halves": models.relative_difference(plain.get_weights(), halves.get_weights()),
    }


class TwoHalves(keras.Model):
    """Gradient accumulation: backward runs once per half batch, so each
    weight gets its gradient twice in one step; the mean over both halves on
    every process is the plain step's gradient."""

    def train_step(self, data):
        import torch

        x, y = data[0], data[1]
        self.zero_grad()
        middle = x.shape[0] // 2
        for part in (slice(0, middle), slice(middle, None)):
            loss = self.compute_loss(x=x[part], y=y[part], y_pred=self(x[part], training=True))
            (loss / 2).backward()
        weights = self.trainable_weights
        with torch.no_grad():
            self.optimizer.apply([w.value.grad for w in weights], weights)
        return {"loss": loss}


class ManualUpdate(keras.Model):
    """Plain SGD written by hand, past the optimizer."""

    def train_step(self, data):
        import torch

        x, y = data[0], data[1]
        self.zero_grad()
        loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        loss.backward()
        with torch.no_grad():
            for weight in self.trainable_weights:
                weight.assign(weight.value - 0.1 * weight.value.grad)
        return {"loss": loss}


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
