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
import numpy as np  # noqa: E402

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


def reference(x, y, model_class=None, **fit):
    model = models.build(keras, model_class=model_class)
    model.compile(optimizer=models.sgd(keras), **models.COMPILE)
    history = model.fit(x, y, shuffle=False, verbose=0, **fit).history
    return model, history


def abort_in_rank_1():
    """What torch's teardown sometimes does to a process at exit (SIGABRT,
    "terminate called without an active exception")."""
    if os.environ.get("RANK") == "1":
        os.abort()


def main():
    x, y = models.data()
    if MODE == "files" and keras.backend.backend() == "torch":  # after agnostic's handlers
        atexit.register(left_group)
    if MODE == "teardown":  # registered first: runs after agnostic has left the group
        atexit.register(abort_in_rank_1)
    template = models.build(keras)
    model = agnostic.backend_agnostic_compile(template, optimizer=models.sgd(keras),
                                              gpus=REPLICAS, **models.COMPILE)
    if MODE == "abort":  # registered last: runs before agnostic leaves the group
        atexit.register(abort_in_rank_1)
    rank = agnostic.resolve(gpus=REPLICAS).process_id
    with open(os.path.join(FOLDER, f"pid_{rank}"), "w") as handle:
        handle.write(str(os.getpid()))
    result = None
    if MODE in ("raise", "sigkill", "wait", "everyone"):
        epochs = 200 if MODE == "wait" else 2
        model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=[Trouble(rank)])
    elif MODE in ("teardown", "abort"):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
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
    elif MODE == "gradients":
        result = gradients(x, y, model, rank)
    elif MODE == "manual":  # steps that update the weights themselves
        result = {}
        for model_class in (ManualUpdate, ManualParts):
            expected, _ = reference(x, y, batch_size=16, epochs=2, model_class=model_class)
            manual = models.build(keras, model_class=model_class)
            manual = agnostic.backend_agnostic_compile(manual, optimizer=models.sgd(keras),
                                                       gpus=REPLICAS, **models.COMPILE)
            manual.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
            result[model_class.__name__] = models.relative_difference(
                expected.get_weights(), manual.get_weights())
    if result is not None and rank == 0:
        print(json.dumps(result))


def gradients(x, y, model, rank):
    """Who averaged each step's gradients: torch's DistributedDataParallel
    during backward for a step that calls the model, twice in a step too
    (gradient accumulation); the optimizer's wrapper for a step that calls
    the model's parts only. A backward pass outside fit on one process only
    must start no collective (the next fit would hang or sum mismatched
    tensors)."""
    import torch

    if rank == 0:  # e.g. a saliency map
        model(torch.as_tensor(x[:4])).sum().backward()
    result = {}
    for name, model_class, epochs in (("plain", None, 2), ("halves", TwoHalves, 1),
                                      ("parts", ThroughParts, 1)):
        expected, _ = reference(x, y, batch_size=16, epochs=epochs, model_class=model_class)
        if model_class is not None:
            model = models.build(keras, model_class=model_class)
            model = agnostic.backend_agnostic_compile(model, optimizer=models.sgd(keras),
                                                      gpus=REPLICAS, **models.COMPILE)
        model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)
        result[name] = who_averaged(expected, model)
    if "ddp_model" in vars(model):  # Keras 3.16's own wrapper: fails, as torch's does
        return result
    # An output that no loss uses: its weights get no gradient.
    targets = {"main": y, "extra": np.zeros((len(x), 1), "float32")}
    expected = with_unused_output()
    expected.compile(optimizer=models.sgd(keras), loss={"main": models.COMPILE["loss"]})
    expected.fit(x, targets, batch_size=16, epochs=2, shuffle=False, verbose=0)
    model = agnostic.backend_agnostic_compile(
        with_unused_output(), optimizer=models.sgd(keras), loss={"main": models.COMPILE["loss"]},
        gpus=REPLICAS)
    model.fit(x, targets, batch_size=16, epochs=2, shuffle=False, verbose=0)
    result["unused"] = who_averaged(expected, model)
    return result


def who_averaged(expected, model):
    from agnostic.compat import torch_keras_ddp

    steps = vars(model)["_agnostic_gradients"]
    parallel, at_optimizer = steps.parallel, steps.at_optimizer
    if torch_keras_ddp.keras_averages_gradients(model):  # Keras 3.16's own wrapper
        parallel = vars(model)["ddp_model"]
    return {
        "difference": models.relative_difference(expected.get_weights(), model.get_weights()),
        "parallel": type(parallel).__name__,
        "at_optimizer": at_optimizer,
    }


def with_unused_output():
    models.seed(keras, 1)
    inputs = keras.layers.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    outputs = {"main": keras.layers.Dense(3, activation="softmax")(hidden),
               "extra": keras.layers.Dense(1)(hidden)}
    return keras.models.Model(inputs, outputs)


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


class ThroughParts(keras.Model):
    """A step that runs the model's layers without calling the model (as a
    GAN's step calls its generator and discriminator), then the optimizer."""

    def train_step(self, data):
        import torch

        x, y = data[0], data[1]
        self.zero_grad()
        loss = self.compute_loss(x=x, y=y, y_pred=self.call(x, training=True))
        loss.backward()
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
        loss = self.compute_loss(x=x, y=y, y_pred=self.forward_pass(x))
        loss.backward()
        with torch.no_grad():
            for weight in self.trainable_weights:
                weight.assign(weight.value - 0.1 * weight.value.grad)
        return {"loss": loss}

    def forward_pass(self, x):
        return self(x, training=True)


class ManualParts(ManualUpdate):
    """Plain SGD by hand, on the model's layers without calling the model:
    nothing averages these gradients."""

    def forward_pass(self, x):
        return self.call(x, training=True)


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

