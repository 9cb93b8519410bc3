"""Saving and resuming, shared by every engine: unchanged Keras callbacks on
several devices, files a plain single-device Keras loads, runs killed with
SIGKILL that resume exactly, and broken files named in the error."""
import json
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests import jobs, models
from tests.conftest import ROOT, engine_or_skip, run_python, run_script

keras = engine_or_skip()

import agnostic  # noqa: E402

SCRIPT = jobs.CHECKPOINTS
KERAS3 = models.is_keras3(keras)
ENGINE = keras.backend.backend()
# The reduced suite each other tested Keras version runs (tox.ini).
VERSIONS = pytest.mark.keras_versions

LOAD_PLAINLY = """
import json, numpy, keras
x = numpy.load({x!r})
model = keras.models.load_model({best!r})
print(json.dumps(model.predict(x, batch_size=16, verbose=0).tolist()))
"""


def test_keras_callbacks_work_unchanged_on_several_devices(tmp_path):
    result, _, _ = run_script(SCRIPT, "callbacks", 2, tmp_path)
    assert result["epochs"] == [0, 1]  # EarlyStopping stopped every process
    suffix = ".keras" if KERAS3 else ".h5"
    weights = ".weights.h5" if KERAS3 else ".h5"
    assert {"best" + suffix, "w1" + weights, "w2" + weights, "log.csv"} <= set(result["files"])
    assert not [name for name in result["files"] if name.startswith(".agnostic-")]
    rows = (tmp_path / "log.csv").read_text().strip().splitlines()
    assert len(rows) == 3 and rows[0].startswith("epoch")
    if KERAS3:
        assert "agnostic_backup.json" in result["backup"]
        # The newest backup and the one before it, its fallback (restore.py).
        assert len([n for n in result["backup"] if n.endswith(".weights.h5")]) == 2
    # The best model loads in a plain single-device process, same predictions.
    loaded = run_python(LOAD_PLAINLY.format(x=str(tmp_path / "x.npy"),
                                            best=str(tmp_path / ("best" + suffix))),
                        env={"AGNOSTIC_CPU_DEVICES": None})
    np.testing.assert_allclose(np.array(loaded), np.load(tmp_path / "predictions.npy"),
                               atol=1e-5)


def test_a_broken_checkpoint_is_named_and_not_loaded(tmp_path):
    model = agnostic.backend_agnostic_compile(models.build(keras), optimizer="sgd",
                                              gpus=1, loss="mse")
    whole = models.model_file(keras, tmp_path, "whole")
    model.save(whole)
    weights = str(tmp_path / ("part.weights.h5" if KERAS3 else "part.h5"))
    model.save_weights(weights)
    for path in (whole, weights):
        data = open(path, "rb").read()
        with open(path, "wb") as handle:
            handle.write(data[: len(data) // 2])
    with pytest.raises(agnostic.CheckpointError, match=f"{weights} is truncated or corrupt"):
        model.load_weights(weights)
    with pytest.raises(agnostic.CheckpointError, match=f"{whole} is truncated or corrupt"):
        agnostic.load_model(whole)
    with pytest.raises(agnostic.CheckpointError, match="does not exist"):
        agnostic.load_model(str(tmp_path / "missing.keras"))


def test_saves_replace_the_file_whole(tmp_path):
    model = agnostic.backend_agnostic_compile(models.build(keras), optimizer="sgd",
                                              gpus=1, loss="mse")
    path = models.model_file(keras, tmp_path, "model")
    model.save(path)
    first = os.stat(path).st_ino
    model.save(path)
    assert os.stat(path).st_ino != first  # a new file renamed over, not rewritten
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]


if os.environ.get("KERAS_BACKEND") in ("tensorflow", "jax"):  # the model is a copy there

    def test_the_template_saves_whole_too(tmp_path):
        template = models.build(keras)
        agnostic.backend_agnostic_compile(template, optimizer="sgd", gpus=2, loss="mse")
        agnostic.backend_agnostic_compile(template, optimizer="sgd", gpus=2, loss="mse")
        path = models.model_file(keras, tmp_path, "template")
        template.save(path)
        first = os.stat(path).st_ino
        template.save(path)
        assert os.stat(path).st_ino != first
        assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]
        assert keras.models.load_model(path).count_params() == template.count_params()


def run_resume(folder, replicas, **kill):
    env = dict(os.environ, **kill)
    return subprocess.run([sys.executable, SCRIPT, "resume", str(replicas), str(folder)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def final_weights(folder):
    return models.saved_weights(os.path.join(str(folder), "final.npz"))


if KERAS3:  # Keras 2.2 (keras-mxnet) has no BackupAndRestore

    # Killed as the chief publishes a backup (the rename of a complete file,
    # agnostic's own on every engine): on torch, where it dies with a peer
    # still running.
    KILLS = [pytest.param({"KILL": "2:3"}, marks=VERSIONS, id="mid-epoch")] + (
        [pytest.param({"KILL_IN_WRITE": "3"}, id="mid-write")] if ENGINE == "torch" else [])

    @pytest.mark.parametrize("kill", KILLS)
    def test_a_killed_run_resumes_from_its_last_backup(kill, tmp_path):
        whole, broken = tmp_path / "whole", tmp_path / "broken"
        whole.mkdir(), broken.mkdir()
        jobs.uninterrupted("resume", 2, whole)  # the same for each way of killing
        killed = run_resume(broken, 2, **kill)
        assert killed.returncode != 0  # SIGKILL, or the launcher's non-zero status
        assert not (broken / "final.npz").exists()
        again = run_resume(broken, 2)
        assert again.returncode == 0, again.stderr[-3000:]
        # Epochs 0 and 1 were backed up (after a write killed mid-way too),
        # so the rerun trains epochs 2 and 3: four in all, as asked.
        assert '"epochs": [2, 3]' in again.stdout
        assert models.relative_difference(final_weights(whole), final_weights(broken)) < 1e-5

    def test_the_swapped_backup_is_still_keras_s_with_the_users_settings(tmp_path):
        # Code that looks for a BackupAndRestore among fit's callbacks still
        # finds one; the user's own object is left as it was.
        from agnostic.resume import backup

        given = keras.callbacks.BackupAndRestore(str(tmp_path), save_freq=3,
                                                 delete_checkpoint=False)
        history = keras.callbacks.History()
        swapped, kept = backup.swap_callbacks([given, history], is_chief=False)
        assert kept is history and swapped is not given
        assert isinstance(swapped, keras.callbacks.BackupAndRestore)
        assert (swapped.backup_dir, swapped.save_freq, swapped.delete_checkpoint,
                swapped.is_chief) == (str(tmp_path), 3, False, False)
        assert type(given) is keras.callbacks.BackupAndRestore
        assert not hasattr(given, "is_chief")



FULL_DISK = """
import json, os, resource, signal, sys
import keras, numpy
import agnostic
from tests import models

folder = sys.argv[1]
model = agnostic.backend_agnostic_compile(models.build(keras), optimizer="sgd",
                                          gpus=1, loss="mse")
whole, part = models.model_file(keras, folder, "whole"), os.path.join(folder, "part.weights.h5")
model.save(whole)
model.save_weights(part)
numpy.savez(os.path.join(folder, "good.npz"), *model.get_weights())
model.set_weights([w + 1.0 for w in model.get_weights()])
# A file size limit below the files' size: each write fails with EFBIG, as a
# full disk fails with ENOSPC (the signal ignored so that the write returns it).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(part) // 2, resource.RLIM_INFINITY))
try:
    model.save(whole)
except agnostic.CheckpointError as error:
    print(json.dumps({"error": str(error), "files": sorted(os.listdir(folder))}), flush=True)
# HDF5 may end the process when its last flush fails (SIGSEGV, h5py 3.x):
# the previous file must survive that too. Else h5py's RuntimeError ("Disable
# slist on flush dest failure failed") is a CheckpointError.
try:
    model.save_weights(part)
except agnostic.CheckpointError as error:
    print(json.dumps({"error": str(error), "files": sorted(os.listdir(folder))}), flush=True)
    sys.exit(3)
"""

THEN_LOAD = """
import json, os, sys
import keras
import agnostic
from tests import models

folder = sys.argv[1]
good = models.saved_weights(os.path.join(folder, "good.npz"))
model = agnostic.backend_agnostic_compile(models.build(keras, seed_value=2), optimizer="sgd",
                                          gpus=1, loss="mse")
model.load_weights(os.path.join(folder, "part.weights.h5"))
loaded = [agnostic.load_model(models.model_file(keras, folder, "whole")).get_weights(),
          model.get_weights()]
model.save_weights(os.path.join(folder, "part.weights.h5"))  # removes a dead writer's file
print(json.dumps({"differences": [max(float(abs(a - b).max()) for a, b in zip(good, weights))
                                  for weights in loaded],
                  "files": sorted(os.listdir(folder))}))
"""


if KERAS3:  # the file names below are Keras 3's

    def test_a_full_disk_names_the_file_and_keeps_the_last_good_one(tmp_path):
        failed = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path)], cwd=ROOT,
                                capture_output=True, text=True, timeout=300)
        printed = failed.stdout.strip().splitlines()
        full = json.loads(printed[0])
        whole = models.model_file(keras, tmp_path, "whole")
        assert full["error"].startswith(f"Could not write {whole}: ")
        assert "File too large" in full["error"] and "is unchanged" in full["error"]
        assert full["files"] == sorted([os.path.basename(whole), "good.npz", "part.weights.h5"])
        assert failed.returncode != 0  # the weights' write failed too, one way or the other
        if failed.returncode == 3:  # not ended by HDF5: a CheckpointError, nothing left
            weights = json.loads(printed[1])
            assert weights["error"].startswith(f"Could not write {tmp_path / 'part.weights.h5'}")
            assert weights["files"] == full["files"]
        result = run_python(THEN_LOAD.replace("sys.argv[1]", repr(str(tmp_path))))
        assert result["differences"] == [0.0, 0.0]  # the old weights, whole
        assert result["files"] == full["files"]


if KERAS3:

    def test_a_backup_that_cannot_be_read_stops_fit_naming_its_host_and_folder(tmp_path):
        x, y = models.data()
        folder = str(tmp_path / "backup")
        model = agnostic.backend_agnostic_compile(models.build(keras), optimizer="sgd",
                                                  gpus=1, **models.COMPILE)
        backup = keras.callbacks.BackupAndRestore(folder, delete_checkpoint=False)
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[backup])
        weights = [name for name in os.listdir(folder) if name.endswith(".weights.h5")]
        with open(os.path.join(folder, weights[0]), "r+b") as handle:
            handle.truncate(100)
        with pytest.raises(agnostic.CheckpointError,
                           match=re.escape(f"The backup in {folder} on host "
                                           f"{socket.gethostname()} (process 0) may be the newest")):
            model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=[backup])
