"""Preemption with real signals on every engine: SIGTERM to the chief (torch:
the first of 2 processes the shim starts, which passes it on) stops every
process after the same step, the backup is written there, the status says
preempted, nothing is left in the temporary folder, and the rerun ends with
the weights of a run never interrupted."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import models
from tests.conftest import ROOT, engine_or_skip, made_once

keras = engine_or_skip()

SCRIPT = os.path.join("tests", "scripts", "preempt.py")


def start(folder, temporary, **variables):
    env = dict(os.environ, TMPDIR=str(temporary), **variables)
    return subprocess.Popen([sys.executable, SCRIPT, str(folder)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process, timeout=120):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def signal_at_marker(process, folder, number):
    deadline = time.monotonic() + 90
    while not (folder / "marker").exists():
        assert process.poll() is None, finish(process)[2][-3000:]
        assert time.monotonic() < deadline, "the marker step was never reached"
        time.sleep(0.02)
    process.send_signal(number)
    return finish(process)


def final_weights(folder):
    return models.saved_weights(os.path.join(str(folder), "final.npz"))


def leftovers(temporary):
    # The workers' log folder stays: what they wrote is kept (launch/output.py).
    return [name for name in os.listdir(temporary)
            if name.startswith("agnostic-") and not name.startswith("agnostic-logs-")]


@pytest.fixture
def uninterrupted(tmp_path):
    """The final weights of a run never interrupted: made once per session,
    whichever test worker asks first."""
    def make(folder):
        code, _, err = finish(start(folder, folder, BACKUP="epoch"))
        assert code == 0, err[-3000:]

    made_once(["preempt.py", "BACKUP=epoch"], tmp_path / "whole", make)
    return final_weights(tmp_path / "whole")


def test_sigterm_stops_at_one_step_with_a_backup_and_the_rerun_ends_the_same(
        uninterrupted, tmp_path):
    folder, temporary = tmp_path / "run", tmp_path / "tmp"
    folder.mkdir(), temporary.mkdir()
    code, out, err = signal_at_marker(start(folder, temporary, BACKUP="epoch", MARK="2:1"),
                                      folder, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert not (folder / "final.npz").exists()  # the script did not go on after fit
    state = json.loads((folder / "backup" / "agnostic_backup.json").read_text())
    # Signalled as step 1 of epoch 2 ended: every process stopped after step 2
    # (torch's 2 processes after step 3: their all-reduce of the flags runs
    # during the next step, see agnostic/resume/preemption.py).
    trained = 4 if keras.backend.backend() == "torch" else 3
    assert (state["epoch"], state["batch"]) == (2, trained)
    assert "backup written" in err
    assert leftovers(temporary) == []
    (folder / "marker").unlink()
    code, out, err = finish(start(folder, temporary, BACKUP="epoch"))
    assert code == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["epochs"] == [2, 3]
    assert models.relative_difference(uninterrupted, final_weights(folder)) < 1e-6
    assert leftovers(temporary) == []


@pytest.mark.skipif(keras.backend.backend() != "jax", reason=(
    "the chosen signal and the warning are the same code on every engine: checked once, "
    "on JAX (the quickest); the engines' own paths are the tests above and below"))
def test_a_chosen_signal_preempts_and_without_backup_says_nothing_was_saved(tmp_path):
    code, out, err = signal_at_marker(
        start(tmp_path, tmp_path, MARK="1:0", AGNOSTIC_PREEMPT_SIGNAL="usr1"),
        tmp_path, signal.SIGUSR1)
    assert code == 128 + signal.SIGUSR1, err[-3000:]
    assert "nothing was saved" in err and "BackupAndRestore" in err
    assert not (tmp_path / "final.npz").exists()
    assert leftovers(tmp_path) == []


def test_a_backup_inside_an_epoch_resumes_after_its_step(uninterrupted, tmp_path):
    # No signal: save_freq=2 batches, killed (SIGKILL) after step 2 of epoch 2,
    # so the last backup is after step 1 (2 batches of the epoch trained).
    code, _, err = finish(start(tmp_path, tmp_path, BACKUP="2", KILL="2:2"))
    assert code != 0
    state = json.loads((tmp_path / "backup" / "agnostic_backup.json").read_text())
    assert (state["epoch"], state["batch"]) == (2, 2)
    code, out, err = finish(start(tmp_path, tmp_path, BACKUP="2"))
    assert code == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["epochs"] == [2, 3]
    assert models.relative_difference(uninterrupted, final_weights(tmp_path)) < 1e-6
    # The program's callback hears of the batches this run trained, not of
    # the 2 the backup had trained and fit skipped.
    trained = [[2, batch] for batch in range(2, 6)] + [[3, batch] for batch in range(6)]
    assert result["begun"] == trained and result["ended"] == trained
