"""BackupAndRestore that survives a kill at any moment, written by one process.

Keras 3.15's BackupAndRestore writes the weights and then the epoch number in
place: a kill in between, or during either write, loses the backup or pairs
new weights with an old epoch. agnostic swaps it, inside `fit` on the models it
returns, for a subclass holding the same settings (still a BackupAndRestore to
any code that asks) whose saving and restoring are these: each backup is a new
weights file written atomically, then a small JSON file naming it (with its
SHA-256, size and the model's variables) and the backup before it, also
replaced atomically; only then are older weights files removed. Whenever the
process dies, the JSON names a complete weights file, and a file that is not
what was written falls back to the one before (restore.py).

With several processes every one reads its own folder at the start of fit:
machines need not share a disk, and a node may come back under another rank.
The process holding the newest backup sends its weights file's bytes to every
other through the engine's collectives (agnostic/resume/restore.py), and every
process loads those same bytes, so all resume at the same epoch with the same
weights and optimizer state.

A backup records its epoch and step: one written inside an epoch (save_freq
a number of batches, or a preempting signal: agnostic/resume/preemption.py, which
writes one at the step every process stopped after) resumes after that step,
fit skipping the batches it had trained (agnostic/compat/fit_resume.py).
"""
import glob
import json
import os
import shutil
import tempfile

from agnostic import collectives, errors
from agnostic.resume import checkpoints, preemption, restore
from agnostic.compat import keras_fit

POINTER = restore.POINTER  # the small file naming the newest backup


def _callback_class():
    import keras

    class AtomicBackupAndRestore(keras.callbacks.BackupAndRestore):
        """Keras's BackupAndRestore with its settings as the user made them
        (Keras's own __init__ checked them); the writing and reading are ours."""

        @classmethod
        def taking_over(cls, given, is_chief=True):
            callback = cls.__new__(cls)
            callback.__dict__.update(given.__dict__)
            callback.is_chief = is_chief
            callback._epoch = 0
            callback._batches = 0
            callback._resumed = (0, 0)  # (epoch, batch) the backup restored was at
            callback._found = restore.NOTHING  # what on_train_begin found (restore.py)
            callback._written = None  # the entry this process wrote last, this fit
            return callback

        def on_train_begin(self, logs=None):
            self._written = None
            # The newest backup any process holds, on every one (restore.py).
            self._found = found = restore.newest(self.backup_dir, collectives.of(self.model))
            if found.state is None:
                return
            if found.path is not None:
                self._restore(found.state, found.path)
                return
            wrong = restore.problem(found.state)  # as another process sent it
            if wrong:
                raise errors.CheckpointError(
                    f"The backup another process chose cannot be trusted: {wrong}.")
            folder = tempfile.mkdtemp(prefix="agnostic-restore-")
            try:  # Keras loads weights from a path only: the source's bytes, here
                path = os.path.join(folder, found.state["weights"])
                with open(path, "wb") as handle:
                    handle.write(found.data)
                self._restore(found.state, path)
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        def _restore(self, state, weights):
            _check_fits(state, self.params or {}, self.backup_dir, self.model)
            # Every process builds, as every one loads: a variable made under
            # a TensorFlow workers' strategy is made by all of them together.
            optimizer = getattr(self.model, "optimizer", None)
            if optimizer is not None and not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            self.model.load_weights(weights)  # checked: names a broken file
            self._epoch = state["epoch"]
            keras_fit.resume_at(self.model, state["epoch"])
            # A backup inside an epoch: its first batches are not trained again.
            self._resumed = (state["epoch"], state.get("batch", 0))
            watch = preemption.current()
            if watch is not None:
                watch.skip = state.get("batch", 0)

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def on_epoch_end(self, epoch, logs=None):
            if self.save_freq == "epoch" and not preemption.stopping():
                self._save(epoch + 1, 0)

        def on_train_batch_end(self, batch, logs=None):
            if (self._epoch, batch + 1) <= self._resumed:
                return  # a batch the backup had trained, skipped by fit
            if preemption.stopping():  # every process stops after this step
                steps = (self.params or {}).get("steps")
                self._save(*((self._epoch + 1, 0) if steps == batch + 1
                             else (self._epoch, batch + 1)))
                preemption.current().saved = True
                return
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
            if not os.path.isdir(self.backup_dir):  # its user's alone (security.md)
                os.makedirs(self.backup_dir, mode=0o700, exist_ok=True)
            # The backup before stays until this one is on disk, verified,
            # and named by the pointer; then it is the fallback (restore.py).
            # Read back once: after that, the entry this process wrote last.
            previous = self._written or restore.last_good(self.backup_dir)
            self.model.save_weights(os.path.join(self.backup_dir, name), overwrite=True)
            state = restore.entry(epoch, batch, self.backup_dir, name, self.model)
            self._written = dict(state)  # its digest read back from disk
            if previous is not None and previous["weights"] != name:
                state["previous"] = previous
            pointer = os.path.join(self.backup_dir, POINTER)
            checkpoints.replace_atomically(pointer, lambda path: _write_json(path, state))
            for path in (pointer, os.path.join(self.backup_dir, name)):
                os.chmod(path, 0o600)
            kept = {name, state.get("previous", {}).get("weights")}
            for old in glob.glob(os.path.join(self.backup_dir, "backup-*.weights.h5")):
                if os.path.basename(old) not in kept:
                    os.remove(old)

        def on_train_end(self, logs=None):
            if self.delete_checkpoint and not preemption.stopping():
                restore.forget(self.backup_dir, collectives.of(self.model), self._found,
                               self.is_chief)
                if self.is_chief:
                    shutil.rmtree(self.backup_dir, ignore_errors=True)

    return AtomicBackupAndRestore


def _check_fits(state, params, folder, model):
    """A CheckpointError, before any weight is loaded, where the backup in
    `folder` cannot be this fit's: its epoch or step beyond the fit's
    `params`, or its variables not `model`'s."""
    epochs, steps = params.get("epochs"), params.get("steps")
    where = f"The backup in {os.path.abspath(folder)} ({POINTER})"
    if epochs is not None and state["epoch"] > epochs:
        raise errors.CheckpointError(
            f"{where} is at epoch {state['epoch']}, but this fit trains {epochs} epochs. "
            "Pass the epochs of the run that wrote it, or remove the folder to start again.")
    if steps and (state["batch"] >= steps or state["epoch"] == epochs and state["batch"]):
        raise errors.CheckpointError(
            f"{where} is at step {state['batch']} of epoch {state['epoch']}, but an epoch of "
            f"this fit has {steps} steps. Pass the data of the run that wrote it, or remove "
            "the folder to start again.")
    written = state["variables"]
    if not model.weights:
        return  # built by load_weights, which names what differs
    own = restore.variables(model)
    for number, (mine, theirs) in enumerate(zip(own, written)):
        if mine[1] != theirs[1]:
            raise errors.CheckpointError(
                f"{where} is of another model: its variable {number}, {theirs[0]}, has shape "
                f"{tuple(theirs[1])} where this model's {mine[0]} has {tuple(mine[1])}. "
                "Use another backup folder for this model, or remove that one.")
    if len(own) != len(written):
        raise errors.CheckpointError(
            f"{where} is of another model: it holds {len(written)} variables where this "
            f"model has {len(own)}. Use another backup folder for this model, or remove "
            "that one.")


def _write_json(path, state):
    with open(path, "w") as handle:
        json.dump(state, handle)


def swap_callbacks(callbacks, is_chief=True):
    """`callbacks` with each keras.callbacks.BackupAndRestore swapped for the
    atomic subclass, with the same settings (the user's object is left as it
    is); user subclasses are left as they are."""
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
            callback = atomic.taking_over(callback, is_chief)
        swapped.append(callback)
    return swapped
