"""A TensorFlow worker whose program makes its own MultiWorkerMirroredStrategy,
as Ray's and TensorFlow's guides write it, for tests/engines/
test_tf_multi_worker.py.

Usage: own_strategy.py ORDER LATE FOLDER, with TF_CONFIG set.

The program lives in `run` below and this file's main part names no
agnostic, as under Ray, where the worker's main program is Ray's: agnostic
joins the job when the program imports it. ORDER "agnostic-first" imports
agnostic (which joins: its strategy) and then makes the program's own;
"own-first" makes the program's own and then imports agnostic. The chief
(task 0) waits LATE seconds between the two, so that the other worker's first
all-reduce reaches it in between. Then the program builds its model in its
strategy's scope, compiles it with backend_agnostic_compile and fits.

Every worker writes weights_<task>.npz and result_<task>.json to FOLDER; the
chief also trains the same model with plain `compile` on one device, after
the job, for reference.
"""
import importlib
import json
import os
import sys
import time


def run(order, late, folder):
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    import numpy as np
    import tensorflow as tf

    def strategy():
        return tf.distribute.MultiWorkerMirroredStrategy()

    def later():
        if task == 0:
            time.sleep(late)

    if order == "agnostic-first":
        shim = importlib.import_module("agnostic")
        later()
        own = strategy()
    else:
        own = strategy()
        later()
        shim = importlib.import_module("agnostic")
    import keras

    rows = np.random.default_rng(0)
    x = rows.normal(size=(64, 8)).astype("float32")
    y = (x @ rows.normal(size=(8, 1))).astype("float32")

    def model():
        keras.utils.set_random_seed(1)
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="tanh"),
                                 keras.layers.Dense(1)])

    with own.scope():
        trained = shim.backend_agnostic_compile(model(), optimizer=keras.optimizers.SGD(0.1),
                                                loss="mse")
    history = trained.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    np.savez(os.path.join(folder, f"weights_{task}.npz"), *trained.get_weights())
    result = {"users_strategy": trained.distribute_strategy is own,
              "loss": history.history["loss"]}
    if task == 0:
        plain = model()
        plain.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        reference = plain.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        np.savez(os.path.join(folder, "weights_one_device.npz"), *plain.get_weights())
        result["one_device_loss"] = reference.history["loss"]
    with open(os.path.join(folder, f"result_{task}.json"), "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    run(sys.argv[1], float(sys.argv[2]), sys.argv[3])
