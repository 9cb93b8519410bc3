"""A model trained with shard=True, backed up, and resumed on another device
count, as `python sharded.py STAGE FOLDER DEVICES`:

- plain: model.compile on one device, 2 epochs;
- first: shard=True on DEVICES, 1 epoch, with BackupAndRestore (kept);
- second: shard=True on DEVICES, 2 epochs, resuming from that backup.

Each writes FOLDER/STAGE.npz (its weights) and FOLDER/STAGE.weights.h5 (saved
by the model), and prints the bytes each device holds and its predictions.
"""
import json
import os
import sys

import keras
import numpy as np

import agnostic

STAGE, FOLDER, DEVICES = sys.argv[1], sys.argv[2], int(sys.argv[3])


def build():
    keras.utils.set_random_seed(3)
    return keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ])


def held(model):
    sizes = {}
    for variable in list(model.variables) + list(model.optimizer.variables):
        for shard in variable.value.addressable_shards:
            sizes[str(shard.device)] = sizes.get(str(shard.device), 0) + shard.data.nbytes
    return sizes


def main():
    rng = np.random.default_rng(0)
    x = rng.random((256, 64), dtype="float32")
    y = rng.integers(0, 10, 256)
    model = build()
    arguments = dict(optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = []
    if STAGE == "plain":
        model.compile(**arguments)
    else:
        agnostic.backend_agnostic_compile(model, gpus=DEVICES, shard=True, **arguments)
        callbacks.append(keras.callbacks.BackupAndRestore(os.path.join(FOLDER, "backup"),
                                                          delete_checkpoint=False))
    epochs = 1 if STAGE == "first" else 2
    model.fit(x, y, batch_size=32, epochs=epochs, shuffle=False, verbose=0,
              callbacks=callbacks)
    model.save_weights(os.path.join(FOLDER, f"{STAGE}.weights.h5"))
    np.savez(os.path.join(FOLDER, f"{STAGE}.npz"), *model.get_weights())
    print(json.dumps({"bytes_per_device": held(model),
                      "predictions": model.predict(x[:8], verbose=0).tolist()}))


if __name__ == "__main__":
    main()
