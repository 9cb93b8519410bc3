"""Jobs of several processes started as a scheduler starts them (SLURM,
mpirun, Kubeflow's operators, by hand), and the checks every such job must
pass: it trains like one device, and only the chief writes and prints."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np

from tests.conftest import ROOT, made_once, run_script

SCENARIO = os.path.join("tests", "scripts", "scenario.py")
PROCESSES = os.path.join("tests", "scripts", "processes.py")
CHECKPOINTS = os.path.join("tests", "scripts", "checkpoints.py")


def start(command, **variables):
    """One process of a job: `command` with the test's environment plus
    `variables` (None removes one)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.update(variables)
    env = {name: value for name, value in env.items() if value is not None}
    return subprocess.Popen([str(part) for part in command], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def python(script, *arguments):
    return [sys.executable, script] + [str(a) for a in arguments]


def finish(processes, seconds=600):
    """(exit codes, [(stdout, stderr)], seconds taken); kills what is left."""
    began = time.monotonic()
    outputs = []
    for process in processes:
        try:
            outputs.append(process.communicate(timeout=seconds))
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
    return [p.returncode for p in processes], outputs, time.monotonic() - began


def succeeded(codes, outputs):
    assert all(code == 0 for code in codes), "\n".join(
        f"exit {code}:\n{out[-3000:]}\n{err[-3000:]}" for code, (out, err) in zip(codes, outputs))


def chief_result(outputs):
    """The one JSON line the job printed: the chief's alone."""
    lines = [line for out, _ in outputs for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, lines
    return json.loads(lines[0])


def check_like_one_device(result, replicas, environment):
    """A scenario.py `equivalence` result against plain compile on one device."""
    assert result["num_replicas"] == replicas
    assert f"environment={environment}" in result["logs"][0], result["logs"]
    assert result["model_vs_reference"] < 1e-5
    assert result["template_vs_reference"] < 1e-5
    np.testing.assert_allclose(*result["loss"], atol=1e-3)
    np.testing.assert_allclose(*result["evaluate"], atol=1e-5)
    assert result["predict"] < 1e-5


def check_only_the_chief_wrote(result, folder):
    """A processes.py `files` result: one writer of each file, one printer."""
    saved = result["saved"]
    assert "rank_0.weights.h5" in saved and not [n for n in saved if n.startswith("rank_1")]
    assert {"epoch_1.keras", "epoch_2.keras", "log.csv"} <= set(saved)
    rows = (folder / "log.csv").read_text().strip().splitlines()
    assert rows[0].startswith("epoch") and len(rows) == 3


def uninterrupted(mode, replicas, folder, **variables):
    """Into `folder`, what `checkpoints.py MODE REPLICAS` writes trained
    without a kill on this machine's devices, the reference a resumed run's
    weights are compared with: made once per session for each mode, number
    of replicas and variables (a two-node job trains like one device, which
    the jobs' own tests check), whichever test asks first."""
    def make(kept):
        for value in variables.values():
            (kept / value).mkdir(parents=True, exist_ok=True)
        run_script(CHECKPOINTS, mode, replicas, kept,
                   env={name: str(kept / value) for name, value in variables.items()})

    made_once(["checkpoints.py", mode, replicas, sorted(variables.items())], folder, make)
