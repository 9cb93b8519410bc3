"""The start-up hook (agnostic-cpu-devices.pth, _agnostic_hook.py) in real
interpreters: every process that srun, mpirun, a launcher or a TFJob pod
starts has the job's variables, whether it trains with agnostic or not. A
program that never uses agnostic runs exactly as without agnostic, whatever
the variables say; a program that uses agnostic has its engine set up
(the CPU split, the job joined) and gets a bad value as a clear error."""
import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, engine_or_skip

ENGINE = os.environ.get("KERAS_BACKEND")
# Every variable that could change what agnostic does in a child: each test
# starts from none of them and sets its own.
CLEARED = ("AGNOSTIC_CPU_DEVICES", "AGNOSTIC_JOIN", "AGNOSTIC_JOIN_SECONDS", "TF_CONFIG",
           "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
           "TORCHELASTIC_RUN_ID", "KERAS_DISTRIBUTION_JOB_ADDRESSES",
           "KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID",
           "OMPI_COMM_WORLD_SIZE", "NUM_PROCESSES", "COORDINATOR_ADDRESS",
           "JSM_NAMESPACE_SIZE", "LSB_JOBID")
# What srun sets in task 1 of `srun -n2 python ...` (job 77, one node).
SRUN_TASK = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1",
             "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1",
             "SLURM_NODEID": "0", "SLURM_STEP_NODELIST": "127.0.0.1",
             "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_STEP_TASKS_PER_NODE": "2"}
NOT_INSTALLED = ("agnostic's start-up hook did not run: install agnostic with pip in this "
                 "environment (its wheel puts agnostic-cpu-devices.pth and "
                 "_agnostic_hook.py in site-packages)")


def python(arguments, timeout=120, **variables):
    """`python ARGUMENTS` from the repository, with only `variables` of agnostic's
    and the schedulers' set."""
    env = {key: value for key, value in os.environ.items()
           if key not in CLEARED and not key.startswith("SLURM_")}
    env.update(variables)
    return subprocess.run([sys.executable] + arguments, env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def free_port():
    from agnostic.launch.processes import free_port as port

    return port()


# --- No engine: at start-up -------------------------------------------------

MODULES = "import json, sys; print(json.dumps(sorted(sys.modules)))"


def test_the_start_up_line_reads_and_imports_nothing_of_agnostic():
    plain = json.loads(python(["-c", MODULES]).stdout)
    with_job = json.loads(python(["-c", MODULES], WORLD_SIZE="2", RANK="0").stdout)
    assert "_agnostic_hook" in with_job, NOT_INSTALLED
    assert set(with_job) - set(plain) == {"_agnostic_hook"}


@pytest.mark.parametrize("variables", [
    dict(SRUN_TASK, SLURM_JOB_NODELIST="n[a-b]", SLURM_STEP_NODELIST="n[3-1]"),
    dict(SRUN_TASK, SLURM_STEP_NODELIST=",,,", SLURM_NTASKS="two"),
    {"TF_CONFIG": '{"cluster": 5}'},
    {"TF_CONFIG": "{not json"},
    {"AGNOSTIC_CPU_DEVICES": "abc", "AGNOSTIC_JOIN": "yes", "AGNOSTIC_JOIN_SECONDS": "-1"},
    {"WORLD_SIZE": "x", "RANK": "y", "MASTER_PORT": "99999"},
    {"OMPI_COMM_WORLD_SIZE": "-3", "KERAS_DISTRIBUTION_NUM_PROCESSES": "[]"},
], ids=["slurm-hosts", "slurm-tasks", "tf-config-shape", "tf-config-json",
        "agnostic-variables", "rank-variables", "mpirun-keras"])
def test_a_bad_value_changes_nothing_in_a_program_without_agnostic(variables):
    quiet = python(["-c", "pass"], **variables)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    probe = python(["-c", MODULES], **variables)
    assert probe.stderr == ""
    modules = json.loads(probe.stdout)
    assert "_agnostic_hook" in modules, NOT_INSTALLED
    assert not [name for name in modules if name.startswith("agnostic")]


@pytest.mark.serial  # a start-up in under a second: run alone (tox: -m serial)
def test_a_huge_host_list_costs_nothing_at_start():
    # Expanded, this list is 20 million names (6.5 s and 1.5 GB before).
    # The peak of this interpreter's own memory (VmHWM: getrusage's maximum
    # would carry the test process's, kept across fork and exec).
    code = ("import json, sys; peak = [l for l in open('/proc/self/status') "
            "if l.startswith('VmHWM')][0]; print(json.dumps({'hook': '_agnostic_hook' in "
            "sys.modules, 'kb': int(peak.split()[1])}))")
    began = time.monotonic()
    result = python(["-c", code], **dict(SRUN_TASK, SLURM_JOB_NODELIST="n[0-20000000]",
                                         SLURM_STEP_NODELIST="n[0-20000000]"))
    seconds = time.monotonic() - began
    assert (result.returncode, result.stderr) == (0, "")
    probe = json.loads(result.stdout)
    assert probe["hook"], NOT_INSTALLED
    assert seconds < 1.0
    assert probe["kb"] < 200 * 1024


SPAWNS = """import json, multiprocessing, sys
import agnostic
from agnostic import _startup, cluster


def joins():
    return _startup.joins(cluster.Environment("rank-variables", 2, 0))


def child(queue):
    queue.put(joins())


if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,))
    process.start()
    print(json.dumps({"parent": joins(), "child": queue.get(timeout=60)}))
    process.join()
"""


def test_a_multiprocessing_child_never_joins_its_parents_job(tmp_path):
    # A spawned child (a data loader's worker, say) runs the parent's main
    # script again as __mp_main__, with the parent's variables, even
    # AGNOSTIC_JOIN=1: they describe the parent.
    script = tmp_path / "train.py"
    script.write_text(SPAWNS)
    result = python([str(script)], RANK="0", WORLD_SIZE="2", AGNOSTIC_JOIN="1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"parent": True, "child": False}


# --- With an engine ---------------------------------------------------------

# A plain Keras program: it never names the package. It reports its loss,
# the devices its engine sees, and whether it joined a job.
PLAIN = """import json, sys
import keras
import numpy as np

if hasattr(keras.utils, "set_random_seed"):
    keras.utils.set_random_seed(0)
else:  # keras-mxnet 2.2
    np.random.seed(0)
model = keras.Sequential([keras.layers.Dense(1, input_shape=(3,))])
model.compile(loss="mse", optimizer="sgd")
history = model.fit(np.ones((8, 3)), np.arange(8.0).reshape(8, 1), epochs=2, verbose=0)
engine = keras.backend.backend()
if engine == "tensorflow":
    import tensorflow as tf
    devices, processes = len(tf.config.list_logical_devices("CPU")), 1
elif engine == "jax":
    import jax
    devices, processes = jax.device_count(), jax.process_count()
elif engine == "torch":
    import torch.distributed as dist
    devices = 1
    processes = dist.get_world_size() if dist.is_initialized() else 1
else:  # MXNet: its contexts are listed at compile, no job to join
    devices, processes = 1, 1
print(json.dumps({"loss": history.history["loss"], "devices": devices,
                  "processes": processes,
                  "agnostic": sorted(m for m in sys.modules if m.startswith("agnostic"))}))
"""


def job_variables():
    """This engine's job of 2 processes, as its own tools set it; the peer
    never starts, so a process that joined would wait, then fail."""
    if ENGINE == "tensorflow":  # a Kubeflow TFJob pod
        ports = [free_port(), free_port()]
        return {"TF_CONFIG": json.dumps({
            "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
            "task": {"type": "worker", "index": 0}})}
    return {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port())}


def test_a_plain_program_runs_as_without_agnostic(tmp_path):
    engine_or_skip()
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    alone = python([str(script)])
    assert alone.returncode == 0, alone.stderr[-3000:]
    variables = dict(job_variables(), AGNOSTIC_CPU_DEVICES="4", AGNOSTIC_JOIN_SECONDS="3",
                     **SRUN_TASK)
    began = time.monotonic()
    in_a_job = python([str(script)], **variables)
    assert in_a_job.returncode == 0, in_a_job.stderr[-3000:]
    assert time.monotonic() - began < 60
    assert in_a_job.stdout == alone.stdout
    assert json.loads(in_a_job.stdout)["agnostic"] == []
    assert json.loads(in_a_job.stdout)["devices"] == 1
    assert "agnostic" not in in_a_job.stderr.lower()
    assert "Traceback" not in in_a_job.stderr


def test_a_bad_value_is_a_clear_error_in_a_program_that_uses_agnostic(tmp_path):
    # The hook imports agnostic as keras imports the engine, and sets
    # nothing up; resolve() names each value, one after the other.
    engine_or_skip()
    script = tmp_path / "train.py"
    script.write_text(
        "import json, os\n"
        "import keras\n"
        "import agnostic\n"
        "errors = []\n"
        "for fixed in ('AGNOSTIC_CPU_DEVICES', 'TF_CONFIG'):\n"
        "    try:\n"
        "        agnostic.resolve()\n"
        "    except agnostic.AgnosticError as error:\n"
        "        errors.append([type(error).__name__, str(error)])\n"
        "    del os.environ[fixed]\n"
        "print(json.dumps({'errors': errors, 'plan': agnostic.resolve().strategy}))\n")
    result = python([str(script)], AGNOSTIC_CPU_DEVICES="abc", TF_CONFIG="{not json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    errors = json.loads(result.stdout.splitlines()[-1])["errors"]
    assert errors[0][0] == "DeviceRequestError"
    assert "Received: AGNOSTIC_CPU_DEVICES='abc'" in errors[0][1]
    assert errors[1][0] == "LaunchError"
    assert "Received: TF_CONFIG='{not json'" in errors[1][1]


# TensorFlow and JAX set up as they start: the CPU split, the job joined.
SPLITS = ENGINE in ("tensorflow", "jax")
only_splitting_engines = pytest.mark.skipif(
    not SPLITS, reason="only TensorFlow and JAX split the CPU and join a job as they start")
DEVICES = {
    "tensorflow": "import tensorflow as tf\n"
                  "devices = len(tf.config.list_logical_devices('CPU'))\n",
    "jax": "import jax\ndevices = jax.device_count()\n",
}.get(ENGINE, "")
@only_splitting_engines
def test_a_lookup_of_the_engine_before_its_import_keeps_the_set_up():
    # importlib.util.find_spec asks the import machinery without importing
    # (agnostic's own check for a missing engine does, as Keras's optional
    # imports do): the CPU split must still happen at the real import.
    engine_or_skip()
    code = ("import importlib.util, json, agnostic\n"
            f"assert importlib.util.find_spec({ENGINE!r}) is not None\n"
            + DEVICES + "print(json.dumps({'devices': devices}))\n")
    result = python(["-c", code], AGNOSTIC_CPU_DEVICES="4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"devices": 4}


# Reports whether the engine joined a job, without naming agnostic itself.
JOINED = {
    "tensorflow": "import json, sys, tensorflow\n"
                  "hook = sys.modules.get('agnostic.engines.tensorflow.start')\n"
                  "print(json.dumps({'joined': bool(hook and hook.WORKERS)}))\n",
    "jax": "import json, jax\n"
           "print(json.dumps({'joined': jax.process_count() > 1"
           " or jax.distributed.is_initialized()}))\n",
}.get(ENGINE, "")


def srun_task(**changes):
    return {**SRUN_TASK, "MASTER_PORT": str(free_port()), "AGNOSTIC_JOIN_SECONDS": "4",
            **changes}


@only_splitting_engines
def test_a_script_that_builds_before_importing_agnostic_is_set_up(tmp_path):
    # What the hook is for: the engine has run (a layer built) before the
    # script imports agnostic, too late to split the CPU then. AGNOSTIC_JOIN=0
    # keeps this program, which names agnostic, out of srun's job.
    engine_or_skip()
    script = tmp_path / "train.py"
    script.write_text("import json, sys\nimport keras\n"
                      "keras.layers.Dense(2)(keras.ops.ones((1, 3)))\n" + DEVICES +
                      "from agnostic import backend_agnostic_compile\n"
                      "print(json.dumps({'devices': devices}))\n" + JOINED)
    result = python([str(script)], **srun_task(AGNOSTIC_CPU_DEVICES="4", AGNOSTIC_JOIN="0"))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines == [{"devices": 4}, {"joined": False}]


@only_splitting_engines
@pytest.mark.parametrize("way", ["imports agnostic", "AGNOSTIC_JOIN=1"])
def test_a_program_that_uses_agnostic_joins_the_schedulers_job(tmp_path, way):
    # Its peer (task 0) never starts: joining shows as waiting for it, then
    # ending within AGNOSTIC_JOIN_SECONDS (TensorFlow says so). AGNOSTIC_JOIN=1
    # joins a program that does not name agnostic.
    engine_or_skip()
    script = tmp_path / "train.py"
    engine = ("import keras\n" if ENGINE == "tensorflow" else "import jax\n")
    uses = way == "imports agnostic"
    script.write_text(engine + ("import agnostic\n" if uses else "")
                      + ("jax.devices()\n" if ENGINE == "jax" else ""))
    variables = srun_task() if uses else srun_task(AGNOSTIC_JOIN="1")
    began = time.monotonic()
    result = python([str(script)], **variables)
    assert result.returncode != 0
    assert time.monotonic() - began < 90
    if ENGINE == "tensorflow":  # the join's watchdog ended it, saying so
        for words in ("TensorFlow worker 1 of 2", "from slurm", "within 4 s"):
            assert words in result.stderr


@pytest.mark.skipif(ENGINE != "jax", reason="JAX's coordinator: TensorFlow's workers and "
                    "torch's store listen elsewhere (tests/cluster)")
@pytest.mark.parametrize("shared", [False, True], ids=["plain", "reuseport"])
def test_a_coordinator_port_another_process_holds_is_named_before_jax_tries_it(
        tmp_path, shared):
    # Task 0 of `srun -n2`, whose port (MASTER_PORT here) another process of
    # the machine holds: a clear error naming the port and the fix, before
    # JAX starts. A holder that shares its port (SO_REUSEPORT, as gRPC
    # servers do: another job's JAX coordinator, Ray's) is where JAX 0.10
    # waits for its bound instead of raising "Failed to start RPC server".
    import socket

    script = tmp_path / "train.py"
    script.write_text("import jax\nimport agnostic\njax.devices()\nprint('trained')\n")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        if shared:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        began = time.monotonic()
        result = python([str(script)], **srun_task(SLURM_PROCID="0", SLURM_LOCALID="0",
                                                   MASTER_PORT=str(port),
                                                   AGNOSTIC_JOIN_SECONDS="60"))
        took = time.monotonic() - began
    assert result.returncode != 0 and "trained" not in result.stdout
    assert f"could not listen on 127.0.0.1:{port} for the job's coordinator" in result.stderr, \
        result.stderr[-3000:]
    assert "Address already in use" in result.stderr
    assert "Set MASTER_PORT to a port that is free on the first node" in result.stderr
    assert took < 60  # said at once, not at the join's bound


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


@only_splitting_engines
def test_variables_set_after_start_up_join_at_the_programs_first_use(tmp_path):
    # The hook imports agnostic as the engine is imported (the script names
    # agnostic, AGNOSTIC_CPU_DEVICES is set), before the job's variables
    # exist. The program's first name taken from agnostic, after they are
    # set, joins the job.
    engine_or_skip()
    script = tmp_path / "worker.py"
    script.write_text(
        "import json, os, sys\n"
        f"import {ENGINE}\n"
        "started = 'agnostic' in sys.modules\n"
        "hook = sys.modules.get('agnostic.engines.tensorflow.start')\n"
        "print(json.dumps({'imported_with_the_engine': started,\n"
        "                  'joined': bool(hook and hook.WORKERS)}), flush=True)\n"
        f"os.environ.update({late_job_variables()!r})\n"
        "from agnostic import resolve\n"
        + ("import jax\njax.devices()\n" if ENGINE == "jax" else "")
        + "print(json.dumps({'after': 'no job joined'}))\n"
    )
    began = time.monotonic()
    result = python([str(script)], AGNOSTIC_CPU_DEVICES="2", AGNOSTIC_JOIN_SECONDS="4")
    lines = result.stdout.strip().splitlines()
    assert json.loads(lines[0]) == {"imported_with_the_engine": True, "joined": False}, (
        f"{NOT_INSTALLED}\n{result.stdout}\n{result.stderr}")
    assert result.returncode != 0, result.stdout  # it waited for task 0
    assert "no job joined" not in result.stdout
    assert time.monotonic() - began < 90
    if ENGINE == "tensorflow":
        for words in ("TensorFlow worker 1 of 2", "from tf-config", "within 4 s"):
            assert words in result.stderr


def test_an_early_start_counts_the_cpu_split_else_the_gpus_torch_sees(monkeypatch):
    # A GPU count cannot exist here: torch is a stand-in that reports 8 GPUs.
    from agnostic import _startup
    from agnostic.launch import early

    started = []
    monkeypatch.setattr(_startup, "_starts_early", lambda: True)
    monkeypatch.setattr(early, "start", started.append)
    gpus = type("Cuda", (), {"is_available": staticmethod(lambda: True),
                             "device_count": staticmethod(lambda: 8)})
    torch = type("Torch", (), {"cuda": gpus})
    monkeypatch.delenv("AGNOSTIC_CPU_DEVICES", raising=False)
    _startup.start_early()  # as torch's import begins: nothing to count yet
    assert started == []
    _startup.start_early(torch)  # once imported: its GPUs
    assert started == [8]
    monkeypatch.setenv("AGNOSTIC_CPU_DEVICES", "3")
    _startup.start_early()
    assert started == [8, 3]
    monkeypatch.setattr(_startup, "_starts_early", lambda: False)
    _startup.start_early(torch)
    assert started == [8, 3]
