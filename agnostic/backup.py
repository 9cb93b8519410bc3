"""BackupAndRestore that survives a kill at any moment, written by one process.

Keras 3.15's BackupAndRestore writes the weights and then the epoch number in
place: a kill in between, or during either write, loses the backup or pairs
new weights with an old epoch. agnostic swaps it, inside `fit` on the models it
returns, for this callback with the same settings: each backup is a new
weights file written atomically, then a small JSON file naming it, also
replaced atomically; only then are older weights files removed. Whenever the
process dies, the JSON names a complete weights file.

With several processes only the chief reads the backup at the start of fit:
machines need not share a disk. It sends the epoch and the weights file's
bytes to every process through the engine's collectives (the model's
`share`, see agnostic/collectives.py), and every process loads those same
bytes, so all resume at the chief's epoch with its weights and optimizer state.
"""
import glob
import json
import os
import shutil
import tempfile

from agnostic import checkpoints, collectives, errors
from agnostic.compat import keras_fit

POINTER = "agnostic_backup.json"


def _callback_class():
    import keras

    class AtomicBackupAndRestore(keras.callbacks.Callback):
        def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True,
                     is_chief=True):
            super().__init__()
            self.backup_dir = backup_dir
            self.save_freq = save_freq
            self.delete_checkpoint = delete_checkpoint
            self.is_chief = is_chief
            self._epoch = 0
            self._batches = 0

        def on_train_begin(self, logs=None):
            share = collectives.of(self.model)
            if share is None:  # one process, or every one reads the same disk
                backup = _read(self.backup_dir, with_weights=False)
            else:
                backup = share(_read(self.backup_dir, with_weights=True)
                               if self.is_chief else None)
            if backup is None:
                return
            if "error" in backup:  # raised on every process, not the chief alone
                raise errors.CheckpointError(backup["error"])
            state = backup["state"]
            if self.is_chief or share is None:
                self._restore(state, os.path.join(self.backup_dir, state["weights"]))
                return
            folder = tempfile.mkdtemp(prefix="agnostic-restore-")
            try:  # Keras loads weights from a path only: the chief's bytes, here
                path = os.path.join(folder, state["weights"])
                with open(path, "wb") as handle:
                    handle.write(backup["weights"])
                self._restore(state, path)
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        def _restore(self, state, weights):
            # Every process builds, as every one loads: a variable made under
            # a TensorFlow workers' strategy is made by all of them together.
            optimizer = getattr(self.model, "optimizer", None)
            if optimizer is not None and not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            self.model.load_weights(weights)  # checked: names a broken file
            self._epoch = state["epoch"]
            keras_fit.resume_at(self.model, state["epoch"])

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def on_epoch_end(self, epoch, logs=None):
            if self.save_freq == "epoch":
                self._save(epoch + 1, 0)

        def on_train_batch_end(self, batch, logs=None):
            if isinstance(self.save_freq, int) and self.save_freq > 0:
                self._batches += 1
                if self._batches % self.save_freq == 0:
                    self._save(self._epoch, batch + 1)

        def _save(self, epoch, batch):
            name = f"backup-{epoch:06d}-{batch:06d}.weights.h5"
            if not self.is_chief:
                # Writes nothing here; waits with the others for the chief.
                self.model.save_weights(os.path.join(self.backup_dir, name), overwrite=True)
                return
            os.makedirs(self.backup_dir, exist_ok=True)
            self.model.save_weights(os.path.join(self.backup_dir, name), overwrite=True)
            state = {"epoch": epoch, "batch": batch, "weights": name}
            pointer = os.path.join(self.backup_dir, POINTER)
            checkpoints.replace_atomically(pointer, lambda path: _write_json(path, state))
            for old in glob.glob(os.path.join(self.backup_dir, "backup-*.weights.h5")):
                if os.path.basename(old) != name:
                    os.remove(old)

        def on_train_end(self, logs=None):
            if self.delete_checkpoint and self.is_chief:
                shutil.rmtree(self.backup_dir, ignore_errors=True)

    return AtomicBackupAndRestore


def _read(backup_dir, with_weights):
    """The backup in `backup_dir`: its state (and its weights file's bytes);
    None when there is none; {"error": message} when it is broken."""
    pointer = os.path.join(backup_dir, POINTER)
    if not os.path.exists(pointer):
        return None
    try:
        checkpoints.check_file(pointer)
        with open(pointer) as handle:
            state = json.load(handle)
        weights = os.path.join(backup_dir, state["weights"])
        checkpoints.check_file(weights)
        if not with_weights:
            return {"state": state}
        with open(weights, "rb") as handle:
            return {"state": state, "weights": handle.read()}
    except errors.CheckpointError as error:
        return {"error": str(error)}


def _write_json(path, state):
    with open(path, "w") as handle:
        json.dump(state, handle)


def swap_callbacks(callbacks, is_chief=True):
    """`callbacks` with each keras.callbacks.BackupAndRestore swapped for the
    atomic one (same settings); user subclasses are left as they are."""
    try:
        import keras

        keras_backup = keras.callbacks.BackupAndRestore
    except AttributeError:  # Keras 2.2 (keras-mxnet) has none
        return callbacks
    if not callbacks:
        return callbacks
    swapped = []
    atomic = None
    for callback in callbacks:
        if type(callback) is keras_backup:
            if not isinstance(callback.save_freq, int) and callback.save_freq != "epoch":
                raise errors.CheckpointError(
                    "BackupAndRestore save_freq must be 'epoch' or a number of "
                    f"batches. Received: save_freq={callback.save_freq!r}"
                )
            atomic = atomic or _callback_class()
            callback = atomic(callback.backup_dir, callback.save_freq,
                              callback.delete_checkpoint, is_chief)
        swapped.append(callback)
    return swapped
