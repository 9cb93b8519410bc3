"""Nothing read back is trusted (agnostic/resume/restore.py, agnostic/resume/backup.py): a
backup's weights file is verified against the SHA-256 and size recorded
when it was written, and the backup before it is kept as a fallback; the
pointer file is data, never a path; a backup of another model or past the
fit is refused before any weight is loaded. Real files, real fits, in this
process on one device (several processes: tests/resume/test_backup_disks.py)."""
import json
import os
import stat
import warnings

import numpy as np
import pytest

from tests import models
from tests.conftest import engine_or_skip

keras = engine_or_skip()

import agnostic  # noqa: E402
from agnostic.resume import restore  # noqa: E402

pytestmark = pytest.mark.skipif(not models.is_keras3(keras),
                                reason="keras-mxnet (Keras 2.2) has no BackupAndRestore")


def fit(folder, epochs, width=None):
    """A model fitted with BackupAndRestore in `folder` (kept): (model, history)."""
    x, y = models.data()
    template = models.build(keras)
    if width:  # another model: its first layer `width` wide
        template = keras.Sequential([keras.Input((x.shape[1],)),
                                     keras.layers.Dense(width, activation="relu"),
                                     keras.layers.Dense(int(y.max()) + 1,
                                                        activation="softmax")])
    model = agnostic.backend_agnostic_compile(template, optimizer="sgd", gpus=1,
                                              **models.COMPILE)
    backup = keras.callbacks.BackupAndRestore(str(folder), delete_checkpoint=False)
    history = model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=[backup])
    return model, history


def pointer(folder):
    return json.loads((folder / restore.POINTER).read_text())


def flip_a_bit_of_the_first_kernel(model, path):
    """One bit inside the weights' data (not the file's header)."""
    data = bytearray(path.read_bytes())
    kernel = np.asarray(keras.ops.convert_to_numpy(model.weights[0].value)).tobytes()
    at = data.find(kernel)
    assert at > 0, "the kernel's bytes are stored whole in the file"
    data[at + len(kernel) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_each_backup_records_its_digest_and_keeps_the_one_before(tmp_path):
    folder = tmp_path / "backup"
    model, _ = fit(folder, 3)
    state = pointer(folder)
    assert (state["epoch"], state["batch"]) == (3, 0)
    assert state["previous"]["epoch"] == 2 and "previous" not in state["previous"]
    assert sorted(name for name in os.listdir(folder) if name.endswith(".h5")) == [
        state["previous"]["weights"], state["weights"]]
    assert state["size"] == os.path.getsize(folder / state["weights"])
    assert state["variables"] == [[v.path, list(v.shape)] for v in model.weights]
    # The job's user's alone: the folder agnostic made, and what it wrote there.
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    for name in (restore.POINTER, state["weights"]):
        assert stat.S_IMODE(os.stat(folder / name).st_mode) == 0o600


def test_a_flipped_bit_is_skipped_with_a_warning_and_the_backup_before_resumes(tmp_path):
    # Before: the rerun said "resumes at epoch 2" and trained on weights
    # 2.5e37 off, exit status 0.
    model, _ = fit(tmp_path, 3)
    newest = tmp_path / pointer(tmp_path)["weights"]
    flip_a_bit_of_the_first_kernel(model, newest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history = fit(tmp_path, 4)
    said = [str(w.message) for w in caught if "fails verification" in str(w.message)]
    assert len(said) == 1
    assert "epoch 3, step 0" in said[0] and str(newest) in said[0]
    assert "SHA-256 differs" in said[0] and "resumes from epoch 2, step 0" in said[0]
    assert len(history.history["loss"]) == 2  # epochs 3 and 4, from the backup of epoch 2


def test_where_no_backup_verifies_fit_stops_naming_the_folder(tmp_path):
    model, _ = fit(tmp_path, 2)
    state = pointer(tmp_path)
    for name in (state["weights"], state["previous"]["weights"]):
        with open(tmp_path / name, "r+b") as handle:
            handle.truncate(os.path.getsize(tmp_path / name) - 8)
    with pytest.raises(agnostic.CheckpointError, match=f"The backup in {tmp_path} .* may be "
                       "the newest of this job, but its weights cannot be read") as raised:
        fit(tmp_path, 3)
    assert "holds" in str(raised.value) and "bytes where" in str(raised.value)


@pytest.mark.parametrize("field, value, said", [
    ("weights", "../../out/evil.weights.h5", "field 'weights' is '../../out/evil"),
    ("weights", "/tmp/evil.weights.h5", "field 'weights' is '/tmp/evil"),
    ("weights", ".", "field 'weights' is '.'"),
    ("epoch", -3, "field 'epoch' is -3"),
    ("batch", "2", "field 'batch' is '2'"),
    ("sha256", None, "field 'sha256' is None"),
])
def test_a_pointer_that_is_not_data_is_refused_naming_the_field(tmp_path, field, value, said):
    fit(tmp_path, 1)
    state = pointer(tmp_path)
    state[field] = value
    (tmp_path / restore.POINTER).write_text(json.dumps(state))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(agnostic.CheckpointError, match="pointer cannot be read or trusted") \
            as raised:
        fit(tmp_path, 2)
    assert said in str(raised.value) and str(tmp_path) in str(raised.value)
    assert sorted(os.listdir(tmp_path)) == before  # nothing written anywhere


@pytest.mark.parametrize("epoch, batch, said", [
    (999, 0, "is at epoch 999, but this fit trains 2 epochs"),
    (1, 999, "is at step 999 of epoch 1, but an epoch of this fit has"),
])
def test_a_backup_beyond_the_fit_is_refused_before_any_work(tmp_path, epoch, batch, said):
    # Before: epoch 999 trained 0 epochs and exited 0; batch 999 "trained"
    # two epochs while changing nothing. The digest is right: the numbers
    # alone are wrong.
    fit(tmp_path, 1)
    state = pointer(tmp_path)
    state.update(epoch=epoch, batch=batch)
    (tmp_path / restore.POINTER).write_text(json.dumps(state))
    with pytest.raises(agnostic.CheckpointError, match=said):
        fit(tmp_path, 2)


def test_a_backup_of_another_model_is_refused_naming_the_first_variable_that_differs(
        tmp_path):
    fit(tmp_path, 1, width=16)
    with pytest.raises(agnostic.CheckpointError, match=r"is of another model: its variable "
                       r"\d+, \S+/kernel, has shape \((\d+, 16|16, \d+)\) where this "
                       r"model's \S+/kernel has") as raised:
        fit(tmp_path, 2)
    assert str(tmp_path) in str(raised.value)


def test_a_weights_file_saved_through_agnostic_is_sealed_and_checked_when_loaded(tmp_path):
    # Before: load_weights of a .weights.h5 with a flipped bit loaded it,
    # although only a file's structure was checked.
    model, _ = fit(tmp_path / "backup", 1)
    path = tmp_path / "model.weights.h5"
    model.save_weights(str(path))
    plain = models.build(keras)  # Keras's own loading reads a sealed file as any other
    plain.load_weights(str(path))
    assert models.relative_difference(model.get_weights(), plain.get_weights()) == 0.0
    flip_a_bit_of_the_first_kernel(model, path)
    with pytest.raises(agnostic.CheckpointError, match=f"{path} is truncated or corrupt .* "
                       "SHA-256 differs from the one agnostic sealed in it"):
        model.load_weights(str(path))
