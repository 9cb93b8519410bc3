"""A model trained with shard=True, backed up, and resumed on another device
count, as `python sharded.py STAGE FOLDER DEVICES`:

- plain: model.compile on one device, 2 epochs;
- first: shard=True on DEVICES, 1 epoch, with BackupAndRestore (kept);
- second: shard=True on DEVICES, 2 epochs, resuming from that backup.

SHARDED_OPTIMIZER=average: Adam with a moving average and gradient
accumulation; adamw: AdamW with decay and a clip by the global norm; else
SGD with momentum.

Each writes FOLDER/STAGE.weights.h5 and FOLDER/STAGE.keras (saved by the
model), plain and second FOLDER/STAGE.npz (its weights), and prints the bytes
each of the chief's devices holds, its predictions and its evaluation.
"""
import json
import os
import sys

import keras
import numpy as np

import agnostic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from tests.programs.held import bytes_per_device, rank, watch  # noqa: E402

STAGE, FOLDER, DEVICES = sys.argv[1], sys.argv[2], int(sys.argv[3])


def build():
    keras.utils.set_random_seed(3)
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ])


def main():
    rng = np.random.default_rng(0)
    x = rng.random((256, 64), dtype="float32")
    y = rng.integers(0, 10, 256)
    model = build()
    kind = os.environ.get("SHARDED_OPTIMIZER", "")
    if kind == "average":
        # Slots of four kinds: moments, an average written into the weights
        # every 3 steps and at the end, gradients accumulated over 2 steps.
        optimizer = keras.optimizers.Adam(0.002, use_ema=True, ema_overwrite_frequency=3,
                                          gradient_accumulation_steps=2, clipvalue=0.01)
    elif kind == "adamw":  # decay and a clip by the norm of all gradients: not per value
        optimizer = keras.optimizers.AdamW(0.002, weight_decay=0.05, global_clipnorm=1.0)
    else:
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    arguments = dict(optimizer=optimizer,
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = []
    if STAGE == "plain":
        model.compile(**arguments)
    else:
        agnostic.backend_agnostic_compile(model, gpus=DEVICES, shard=True, **arguments)
        watch(model)
        callbacks.append(keras.callbacks.BackupAndRestore(os.path.join(FOLDER, "backup"),
                                                          delete_checkpoint=False))
    epochs = 1 if STAGE == "first" else 2
    model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0,
              callbacks=callbacks)
    model.save_weights(os.path.join(FOLDER, f"{STAGE}.weights.h5"))  # every process
    model.save(os.path.join(FOLDER, f"{STAGE}.keras"))
    predictions = model.predict(x[:8], verbose=0).tolist()
    loss = model.evaluate(x, y, batch_size=64, verbose=0)
    if rank() == 0:
        if STAGE != "first":  # (JAX over several processes holds no whole weight to get)
            np.savez(os.path.join(FOLDER, f"{STAGE}.npz"), *model.get_weights())
        print(json.dumps({"bytes_per_device": bytes_per_device(model),
                          "predictions": predictions, "loss": loss}))


if __name__ == "__main__":
    main()
