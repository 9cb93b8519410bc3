"""The start-up hook under a scheduler: every process srun starts has
SLURM's variables, whether it trains with agnostic or not. Only a program
that uses agnostic joins the job as its engine starts (TensorFlow's workers,
JAX's processes); any other program runs as if started plainly."""
import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, engine_or_skip, run_python

engine_or_skip()

ENGINE = os.environ.get("KERAS_BACKEND")
if ENGINE not in ("tensorflow", "jax"):
    pytest.skip("only TensorFlow and JAX join a job as they start", allow_module_level=True)

from agnostic.launch.local import free_port  # noqa: E402

# What srun sets in task 1 of `srun -n2 python ...` (job 77, one node).
SRUN_TASK = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
             "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1",
             "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "127.0.0.1",
             "SLURM_STEP_TASKS_PER_NODE": "2", "AGNOSTIC_JOIN_SECONDS": "4",
             "AGNOSTIC_CPU_DEVICES": None}
# Reports whether the engine joined a job, without naming agnostic itself.
JOINED = {
    "tensorflow": "import json, sys, tensorflow\n"
                  "hook = sys.modules.get('agnostic._startup')\n"
                  "print(json.dumps({'joined': bool(hook and hook.TF_WORKERS)}))\n",
    "jax": "import json, jax\n"
           "print(json.dumps({'joined': jax.process_count() > 1"
           " or jax.distributed.is_initialized()}))\n",
}[ENGINE]


def task(**changes):
    variables = dict(SRUN_TASK, MASTER_PORT=str(free_port()), **changes)
    return {name: value for name, value in variables.items()}


def test_a_program_that_never_uses_agnostic_does_not_join():
    began = time.monotonic()
    assert run_python(JOINED, env=task()) == {"joined": False}
    assert time.monotonic() - began < 60


def test_agnostic_join_0_keeps_even_an_agnostic_program_out():
    code = "import agnostic\n" + JOINED
    assert run_python(code, env=task(AGNOSTIC_JOIN="0")) == {"joined": False}


def test_a_program_that_imports_agnostic_joins_the_schedulers_job(tmp_path):
    # Its peer (task 0) never starts: joining shows as waiting for it, then
    # ending within AGNOSTIC_JOIN_SECONDS (TensorFlow says so).
    script = tmp_path / "train.py"
    script.write_text(("import keras\nimport agnostic\n" if ENGINE == "tensorflow"
                       else "import jax\nimport agnostic\njax.devices()\n"))
    env = dict(os.environ, PYTHONPATH=ROOT, **{k: v for k, v in task().items() if v})
    env.pop("AGNOSTIC_CPU_DEVICES", None)
    began = time.monotonic()
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    assert result.returncode != 0
    assert time.monotonic() - began < 90
    if ENGINE == "tensorflow":
        assert "TensorFlow worker 1 of 2 did not reach every worker" in result.stderr
        assert "from slurm) within 4 s" in result.stderr


# Variables that appear in a running process, after the engine was imported:
# as Ray's TensorflowTrainer sets TF_CONFIG in its workers; Keras's variables
# for JAX. This process is task 1 of 2; task 0 never starts.
def late_job_variables():
    ports = [free_port(), free_port()]
    if ENGINE == "tensorflow":
        return {"TF_CONFIG": json.dumps({
            "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
            "task": {"type": "worker", "index": 1}})}
    return {"KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(f"127.0.0.1:{p}" for p in ports),
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_PROCESS_ID": "1"}


def test_variables_set_after_start_up_join_at_the_programs_first_use(tmp_path):
    # AGNOSTIC_CPU_DEVICES makes agnostic's .pth file import agnostic as
    # Python starts, before the job's variables exist. The program's first
    # name taken from agnostic, after they are set, joins the job.
    script = tmp_path / "worker.py"
    script.write_text(
        "import json, os, sys\n"
        f"import {ENGINE}\n"
        "started = 'agnostic' in sys.modules\n"
        "hook = sys.modules.get('agnostic._startup')\n"
        "print(json.dumps({'imported_at_start': started,\n"
        "                  'joined': bool(hook and hook.TF_WORKERS)}), flush=True)\n"
        f"os.environ.update({late_job_variables()!r})\n"
        "from agnostic import resolve\n"
        + ("import jax\njax.devices()\n" if ENGINE == "jax" else "")
        + "print(json.dumps({'after': 'no job joined'}))\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT, AGNOSTIC_CPU_DEVICES="2",
               AGNOSTIC_JOIN_SECONDS="4")
    began = time.monotonic()
    result = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                            text=True, timeout=120, cwd=ROOT)
    lines = result.stdout.strip().splitlines()
    assert json.loads(lines[0]) == {"imported_at_start": True, "joined": False}, (
        "agnostic's .pth file did not import agnostic at start: install agnostic "
        f"with pip in this environment\n{result.stdout}\n{result.stderr}")
    assert result.returncode != 0, result.stdout  # it waited for task 0
    assert "no job joined" not in result.stdout
    assert time.monotonic() - began < 90
    if ENGINE == "tensorflow":
        assert "TensorFlow worker 1 of 2 did not reach every worker" in result.stderr
        assert "within 4 s" in result.stderr
