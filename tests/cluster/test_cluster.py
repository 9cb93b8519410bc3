"""The cluster-environment layer: each scheduler's variables, exactly as the
scheduler sets them, read into the same answers. No engine needed."""
import json
import os
import sys

import warnings

import pytest

from agnostic import cluster, errors
from agnostic.cluster import slurm


def test_a_plain_process_is_in_no_environment():
    assert cluster.detect({"PATH": "/usr/bin", "HOME": "/root"}) is None


def test_torchrun():
    found = cluster.detect({
        "TORCHELASTIC_RUN_ID": "none", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
        "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400",
        "LOCAL_WORLD_SIZE": "2",
    })
    # Two nodes: the other node's host is not said (TensorFlow asks the store).
    assert found == cluster.Environment("torchrun", 4, 3, local_rank=1, node_rank=1,
                                        coordinator="10.0.0.1", port=29400,
                                        local_world_size=2, port_taken=True)
    # The agent's store holds MASTER_PORT: JAX's and TensorFlow's start after it.
    assert (found.address, found.engine_port) == ("tcp://10.0.0.1:29400", 29401)


def test_this_processs_job_is_detected_once_while_its_variables_stay(monkeypatch):
    """The start-up hook, the plan and `agnostic info` see one Environment;
    variables changed since (a launcher's, a test's) are read afresh."""
    for name in [name for name in os.environ if name.startswith(("SLURM_", "OMPI_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29400")
    first = cluster.job()
    assert first is not None and first.rank == 1
    assert cluster.job() is first and cluster.detect() is first
    monkeypatch.setenv("RANK", "0")
    again = cluster.job()
    assert again is not first and again.rank == 0
    monkeypatch.setenv("WORLD_SIZE", "two")  # a bad value: said, not kept
    with pytest.raises(errors.LaunchError, match="WORLD_SIZE"):
        cluster.detect()
    with pytest.raises(errors.LaunchError, match="WORLD_SIZE"):
        cluster.detect()


def test_torchrun_on_one_node_knows_every_host():
    found = cluster.detect({
        "TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29400",
    })
    assert found.hosts == ("localhost", "localhost")


def test_torchrun_under_srun_is_torchrun():
    environ = dict(srun_task(rank=1), TORCHELASTIC_RUN_ID="7", RANK="5", WORLD_SIZE="8")
    assert cluster.detect(environ).name == "torchrun"


def srun_task(rank=0, tasks=2, nodelist="n[1-2]", job="4242", per_node="1(x2)"):
    # What srun sets in each task of `srun -N2 -n2 python train.py` (seen on
    # SLURM 22.05, the variables that matter here).
    return {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": str(tasks), "SLURM_STEP_NUM_TASKS": str(tasks),
            "SLURM_LOCALID": "0", "SLURM_NODEID": str(rank),
            "SLURM_STEP_NODELIST": nodelist, "SLURM_JOB_NODELIST": nodelist,
            "SLURM_STEP_TASKS_PER_NODE": per_node, "SLURM_TASKS_PER_NODE": per_node}


def test_slurm_task_of_a_job_step():
    found = cluster.detect(srun_task(rank=1))
    assert found == cluster.Environment("slurm", 2, 1, local_rank=0, node_rank=1,
                                        coordinator="n1", port=15000 + 4242,
                                        hosts=("n1", "n2"))
    # MASTER_PORT chooses the port instead of the job id.
    assert cluster.detect(dict(srun_task(), MASTER_PORT="23456")).port == 23456


def test_slurm_tasks_per_node_place_every_task():
    # srun -N2 -n4: two tasks on each node, block distribution (SLURM's default).
    task = dict(srun_task(rank=2, tasks=4, per_node="2(x2)"), SLURM_NODEID="1")
    found = cluster.detect(task)
    assert found.hosts == ("n1", "n1", "n2", "n2") and found.local_world_size == 2
    cyclic = cluster.detect(dict(task, SLURM_DISTRIBUTION="cyclic"))
    assert cyclic.hosts == ("n1", "n2", "n1", "n2")
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]


def test_an_interactive_allocation_is_no_multi_task_job():
    # salloc -N2, then plain python: the allocation's variables, no step task.
    assert cluster.detect({"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2",
                           "SLURM_JOB_NODELIST": "n[1-2]"}) is None
    # One task of a step: nothing to join either.
    assert cluster.detect(srun_task(tasks=1)) is None


@pytest.mark.parametrize("nodelist, hosts", [
    ("n1", ["n1"]),
    ("n[1-2,5]", ["n1", "n2", "n5"]),
    ("gpu[08-10],login", ["gpu08", "gpu09", "gpu10", "login"]),
    ("a[1],b[3-4]", ["a1", "b3", "b4"]),
])
def test_slurm_host_lists(nodelist, hosts):
    assert slurm.expand_nodelist(nodelist) == hosts


def mpirun_process(rank, size=2, local_size=2):
    # What Open MPI 4.1's `mpirun -np 2` gives each process (seen here).
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % local_size),
            "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
            "OMPI_COMM_WORLD_NODE_RANK": str(rank % local_size),
            "OMPI_MCA_orte_hnp_uri": "2062417920.0;tcp://192.0.2.2:60415;tcp6://[fd00::2]:38907"}


def test_open_mpi_on_one_node_meets_on_localhost():
    found = cluster.detect(mpirun_process(1))
    assert (found.name, found.world_size, found.rank, found.local_rank) == ("openmpi", 2, 1, 1)
    assert found.coordinator == "127.0.0.1" and found.hosts == ("127.0.0.1", "127.0.0.1")
    assert found.port == 15000 + 2062417920 % 20000  # from the job's id, the same everywhere


def test_open_mpi_on_several_nodes_meets_where_mpirun_runs():
    found = cluster.detect(mpirun_process(3, size=4, local_size=2))
    assert (found.coordinator, found.node_rank, found.hosts) == ("192.0.2.2", 1, None)
    chosen = cluster.detect(dict(mpirun_process(3, size=4, local_size=2),
                                 MASTER_ADDR="10.0.0.9", MASTER_PORT="2345"))
    assert (chosen.coordinator, chosen.port) == ("10.0.0.9", 2345)


def test_lsf_jsrun(tmp_path):
    ranks = tmp_path / "rankfile"
    ranks.write_text("batch1\nnode1\nnode1\nnode2\nnode2\n")
    found = cluster.detect({"LSB_JOBID": "12", "JSM_NAMESPACE_SIZE": "4",
                            "JSM_NAMESPACE_RANK": "2", "JSM_NAMESPACE_LOCAL_RANK": "0",
                            "LSB_DJOB_RANKFILE": str(ranks)})
    assert (found.name, found.rank, found.coordinator, found.port) == ("lsf", 2, "node1", 15012)
    assert found.hosts == ("node1", "node1", "node2", "node2")


def test_kubeflow_tfjob_chief_is_rank_0_and_workers_follow():
    roles = {"chief": ["trainer-chief-0:2222"],
             "worker": ["trainer-worker-0:2222", "trainer-worker-1:2222"]}

    def task(kind, index):
        return {"TF_CONFIG": json.dumps({"cluster": roles,
                                         "task": {"type": kind, "index": index}})}

    chief = cluster.detect(task("chief", 0))
    assert (chief.name, chief.world_size, chief.rank) == ("tf-config", 3, 0)
    assert chief.hosts == ("trainer-chief-0", "trainer-worker-0", "trainer-worker-1")
    assert chief.coordinator == "trainer-chief-0" and chief.port == 2222
    assert cluster.detect(task("worker", 0)).rank == 1
    assert cluster.detect(task("worker", 1)).rank == 2


def test_tf_config_roles_agnostic_cannot_train_are_refused():
    config = {"cluster": {"worker": ["a:1", "b:1"], "ps": ["c:1"]},
              "task": {"type": "ps", "index": 0}}
    with pytest.raises(errors.LaunchError, match="parameter servers and evaluators"):
        cluster.detect({"TF_CONFIG": json.dumps(config)})
    with pytest.raises(errors.LaunchError, match="TF_CONFIG is not JSON"):
        cluster.detect({"TF_CONFIG": "{not json"})


def test_kubeflow_pytorchjob_one_process_per_pod():
    # The operator sets MASTER_ADDR/PORT, WORLD_SIZE and the pod's RANK.
    found = cluster.detect({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
                            "WORLD_SIZE": "3", "RANK": "2"})
    assert found == cluster.Environment("rank-variables", 3, 2, local_rank=0, node_rank=2,
                                        coordinator="job-master-0", port=23456)
    assert found.address == "tcp://job-master-0:23456"


def test_kubeflow_jaxjob():
    found = cluster.detect({"COORDINATOR_ADDRESS": "job-worker-0", "COORDINATOR_PORT": "6666",
                            "NUM_PROCESSES": "2", "PROCESS_ID": "1"})
    assert found == cluster.Environment("kubeflow-jaxjob", 2, 1, node_rank=1,
                                        coordinator="job-worker-0", port=6666)


def test_keras_distribution_variables():
    found = cluster.detect({"KERAS_DISTRIBUTION_JOB_ADDRESSES": "10.0.0.1:1234,10.0.0.2:1234",
                            "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                            "KERAS_DISTRIBUTION_PROCESS_ID": "1"})
    assert (found.name, found.rank, found.coordinator, found.port) == (
        "keras-distribution", 1, "10.0.0.1", 1234)


@pytest.mark.parametrize("environ, message", [
    ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK must be a whole number of at least 0. "
                                         "Received: RANK='one'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "Received: RANK=2"),
    (dict(srun_task(), SLURM_PROCID="-1"), "SLURM_PROCID must be a whole number"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_JOB_ADDRESSES": "nohost"},
     "must start with the coordinator's HOST:PORT"),
])
def test_bad_values_are_named(environ, message):
    with pytest.raises(errors.LaunchError) as raised:
        cluster.detect(environ)
    assert message in str(raised.value)


def test_tensorflow_workers_get_one_port_each():
    from agnostic.engines.tensorflow import start

    # Two tasks on one host (srun -n2): the coordinator's port plus the rank.
    found = cluster.detect(srun_task(rank=1, nodelist="n1", per_node="2"))
    assert start.worker_addresses(found) == ["n1:19242", "n1:19243"]
    several = cluster.detect(mpirun_process(3, size=4, local_size=2))
    with pytest.raises(errors.LaunchError, match="does not say where each process runs"):
        start.worker_addresses(several)


@pytest.mark.parametrize("name, flag, main_source, joins", [
    ("slurm", None, "import keras\n", False),  # srun's other programs stay out
    ("slurm", None, "import keras\nfrom agnostic import backend_agnostic_compile\n", True),
    ("slurm", "1", "import keras\n", True),
    ("tf-config", None, "import keras\n", False),  # a TFJob pod's plain programs too
    ("tf-config", None, "import keras\nimport agnostic\n", True),
    ("tf-config", "0", "import agnostic\n", False),
])
def test_a_scheduler_job_is_joined_only_by_programs_that_use_agnostic(
        monkeypatch, tmp_path, name, flag, main_source, joins):
    from agnostic import _startup

    script = tmp_path / "train.py"
    script.write_text(main_source)
    main = type(sys)("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(_startup, "IMPORTED", {})
    if flag is None:
        monkeypatch.delenv("AGNOSTIC_JOIN", raising=False)
    else:
        monkeypatch.setenv("AGNOSTIC_JOIN", flag)
    assert _startup.joins(cluster.Environment(name, 2, 0)) is joins


# Each launcher's own variables, as it sets them in the third process of a
# node running two (or the second), and the GPU that process takes among the
# node's four. The GPU count is the one thing made up: no GPU exists here.
def launch_process():
    from agnostic.launch import nodes, rendezvous

    two_nodes = rendezvous.Cluster((rendezvous.Node(0, "10.0.0.1", (2222, 2223)),
                                    rendezvous.Node(1, "10.0.0.2", (2222, 2223))))
    return nodes.environment(two_nodes, 1, 1, "10.0.0.1", 29400)


LAUNCHERS = {
    # agnostic's own (launch/local.py): rank 0 starts ranks 1..N-1.
    "agnostic": lambda: {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
                         "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": "41234", "PYTHONWARNINGS": "ignore"},
    "agnostic launch": launch_process,
    # torchrun --nnodes 2 --nproc-per-node 2 (torch 2.13's agent), node 1's second.
    "torchrun": lambda: {"TORCHELASTIC_RUN_ID": "none", "RANK": "3", "WORLD_SIZE": "4",
                         "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                         "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
                         "ROLE_NAME": "default", "MASTER_ADDR": "10.0.0.1",
                         "MASTER_PORT": "29400", "TORCHELASTIC_RESTART_COUNT": "0",
                         "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
                         "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
    # srun -N2 -n4: block distribution, task 3 is node 1's second.
    "slurm": lambda: dict(srun_task(rank=3, tasks=4, per_node="2(x2)"),
                          SLURM_NODEID="1", SLURM_LOCALID="1", SLURM_GTIDS="2,3"),
    "openmpi": lambda: mpirun_process(3, size=4, local_size=2),
    # Ray Train's torch workers (Ray 2.x sets these before the train function).
    "ray": lambda: {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                    "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                    "MASTER_PORT": "29500"},
    "lsf": lambda: {"LSB_JOBID": "12", "JSM_NAMESPACE_SIZE": "4", "JSM_NAMESPACE_RANK": "3",
                    "JSM_NAMESPACE_LOCAL_RANK": "1", "JSM_NAMESPACE_LOCAL_SIZE": "2"},
    # Kubeflow TFJob with two workers in one pod's host (two containers).
    "kubeflow tfjob": lambda: {"TF_CONFIG": json.dumps({
        "cluster": {"worker": ["pod-0:2222", "pod-0:2223"]},
        "task": {"type": "worker", "index": 1}})},
}
# (environment name, local rank, GPU of four taken); Kubeflow's PyTorchJob
# and JAXJob run one process per pod: local rank 0.
EXPECTED = {
    "agnostic": ("rank-variables", 1), "agnostic launch": ("agnostic-launch", 1),
    "torchrun": ("torchrun", 1), "slurm": ("slurm", 1), "openmpi": ("openmpi", 1),
    "ray": ("rank-variables", 1), "lsf": ("lsf", 1), "kubeflow tfjob": ("tf-config", 1),
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_the_local_rank_is_right_under_every_launcher(launcher):
    from agnostic import devices

    found = cluster.detect(LAUNCHERS[launcher]())
    assert (found.name, found.local_rank) == EXPECTED[launcher]
    # On a node with four GPUs each local rank takes its own; with one GPU
    # visible (the scheduler gave each process its own) that one.
    assert devices.cuda_index(found, 4) == 1
    assert devices.cuda_index(found, 1) == 0
    # Two processes on a node whose CUDA_VISIBLE_DEVICES shows each two GPUs:
    # local rank 1 takes cuda:1; a third (local rank 2) would have none.
    assert devices.cuda_index(found, 2) == 1
    with pytest.raises(errors.LaunchError, match="local rank 2 on its node .* sees 2 CUDA"):
        devices.cuda_index(cluster.Environment(found.name, 4, 3, local_rank=2), 2)


def test_kubeflow_one_process_per_pod_is_local_rank_0():
    pytorchjob = cluster.detect({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
                                 "WORLD_SIZE": "3", "RANK": "2", "PYTHONUNBUFFERED": "1"})
    jaxjob = cluster.detect({"COORDINATOR_ADDRESS": "job-worker-0", "COORDINATOR_PORT": "6666",
                             "NUM_PROCESSES": "2", "PROCESS_ID": "1"})
    assert (pytorchjob.local_rank, jaxjob.local_rank) == (0, 0)


def test_agnostic_launch_is_its_own_environment_with_its_ports():
    found = cluster.detect(launch_process())
    # Node 1's second process of 2 x 2; torch's store at PORT+1, JAX at PORT+2.
    assert (found.rank, found.world_size, found.node_rank, found.local_world_size) == (3, 4, 1, 2)
    assert (found.coordinator, found.port, found.engine_port) == ("10.0.0.1", 29401, 29402)
    assert found.hosts == ("10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2")
    assert found.requested


def test_pin_torch_takes_the_local_rank_gpu(monkeypatch):
    # Only the CUDA device count (and availability) is made up here: a
    # machine with GPUs cannot exist in this test environment.
    torch = pytest.importorskip("torch") if os.environ.get("KERAS_BACKEND") == "torch" \
        else pytest.skip("torch's own tox environment runs this")
    from agnostic.engines.torch import start

    taken = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", taken.append)
    for launcher in sorted(LAUNCHERS):
        start.join(torch, cluster.detect(LAUNCHERS[launcher]()))
    assert taken == [1] * len(LAUNCHERS)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    start.join(torch, cluster.detect(LAUNCHERS["slurm"]()))
    assert taken[-1] == 0


def srun_with(**variables):
    return dict(srun_task(), **variables)


def tf_config(value):
    return {"TF_CONFIG": value if isinstance(value, str) else json.dumps(value)}


WORKERS = {"worker": ["a:1", "b:1"]}
BAD_VALUES = [
    # SLURM host lists and counts
    (srun_with(SLURM_STEP_NODELIST="n[1-"), "SLURM_STEP_NODELIST", "'n[1-'"),
    (srun_with(SLURM_STEP_NODELIST=""), "SLURM_STEP_NODELIST", "''"),
    (srun_with(SLURM_STEP_NODELIST="n[1-2"), "SLURM_STEP_NODELIST", "'n[1-2'"),
    (srun_with(SLURM_STEP_NODELIST="n[a-b]"), "SLURM_STEP_NODELIST", "'n[a-b]'"),
    (srun_with(SLURM_STEP_NODELIST="n[3-1]"), "SLURM_STEP_NODELIST", "'n[3-1]'"),
    (srun_with(SLURM_STEP_NODELIST=",,,"), "SLURM_STEP_NODELIST", "',,,'"),
    (srun_with(SLURM_STEP_NODELIST="n[0-20000000]"), "SLURM_STEP_NODELIST", "n[0-20000000]"),
    (srun_with(SLURM_STEP_NODELIST="n[1,]"), "SLURM_STEP_NODELIST", "'n[1,]'"),
    (srun_with(SLURM_STEP_NODELIST="n]1["), "SLURM_STEP_NODELIST", "'n]1['"),
    (srun_with(SLURM_STEP_TASKS_PER_NODE="2(x"), "SLURM_STEP_TASKS_PER_NODE", "'2(x'"),
    (srun_with(SLURM_STEP_TASKS_PER_NODE="a,b"), "SLURM_STEP_TASKS_PER_NODE", "'a,b'"),
    (srun_with(SLURM_LOCALID="x"), "SLURM_LOCALID", "'x'"),
    (srun_with(SLURM_JOB_ID="-3"), "SLURM_JOB_ID", "'-3'"),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", '
                   '"index": 0}}'}, "TF_CONFIG", "a:1 for more than one task"),
    # ports
    (srun_with(MASTER_PORT="99999"), "MASTER_PORT", "'99999'"),
    (srun_with(MASTER_PORT="0"), "MASTER_PORT", "'0'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "99999"}, "MASTER_PORT", "'99999'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "MASTER_PORT", "'http'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": ""}, "MASTER_ADDR", "''"),
    (dict(LAUNCHERS["torchrun"](), MASTER_PORT="65535"), "MASTER_PORT", "'65535'"),
    (dict(LAUNCHERS["torchrun"](), LOCAL_RANK="2"), "LOCAL_RANK", "LOCAL_RANK=2"),
    ({"COORDINATOR_ADDRESS": "w-0", "NUM_PROCESSES": "2", "PROCESS_ID": "0",
      "COORDINATOR_PORT": "70000"}, "COORDINATOR_PORT", "'70000'"),
    ({"COORDINATOR_ADDRESS": " ", "NUM_PROCESSES": "2", "PROCESS_ID": "0"},
     "COORDINATOR_ADDRESS", "' '"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
      "KERAS_DISTRIBUTION_JOB_ADDRESSES": "h:99999"}, "KERAS_DISTRIBUTION_JOB_ADDRESSES",
     "'h:99999'"),
    (dict(mpirun_process(1), OMPI_COMM_WORLD_LOCAL_RANK="5"), "OMPI_COMM_WORLD_LOCAL_RANK",
     "=5"),
    (dict(mpirun_process(3, size=4, local_size=2), OMPI_MCA_orte_hnp_uri="garbage"),
     "OMPI_MCA_orte_hnp_uri", "'garbage'"),
    # TF_CONFIG
    (tf_config("{not json"), "TF_CONFIG", "{not json"),
    (tf_config([1, 2]), "TF_CONFIG", "[1, 2]"),
    (tf_config({"task": {"type": "worker", "index": 0}}), "TF_CONFIG", '"task"'),
    (tf_config({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG", '"a:1"'),
    (tf_config({"cluster": WORKERS, "task": {"type": "worker", "index": 2}}),
     "TF_CONFIG", '"index": 2'),
    (tf_config({"cluster": WORKERS, "task": {"type": "worker", "index": "one"}}),
     "TF_CONFIG", '"one"'),
    (tf_config({"cluster": WORKERS, "task": {"type": "trainer", "index": 0}}),
     "TF_CONFIG", '"trainer"'),
    (tf_config({"cluster": {"worker": ["a", "b:1"]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG", '"a"'),
    (tf_config({"cluster": {"worker": ["a:99999"]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG", "a:99999"),
    (tf_config({"cluster": [], "task": []}), "TF_CONFIG", '"cluster": []'),
    (tf_config({"cluster": WORKERS, "task": "worker"}), "TF_CONFIG", '"task": "worker"'),
    (tf_config({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG", '"worker": []'),
    (tf_config({"cluster": {"worker": [1, 2]}, "task": {"type": "worker", "index": 0}}),
     "TF_CONFIG", "[1, 2]"),
    # agnostic launch's own
    (dict(launch_process(), AGNOSTIC_LAUNCH_NODE_RANK="x"), "AGNOSTIC_LAUNCH_NODE_RANK", "'x'"),
    (dict(launch_process(), MASTER_PORT="65535"), "MASTER_PORT", "'65535'"),
]


@pytest.mark.parametrize("environ, variable, value", BAD_VALUES,
                         ids=[f"{v}={s}"[:60] for _, v, s in BAD_VALUES])
def test_every_bad_value_is_a_launch_error_naming_the_variable_and_value(
        environ, variable, value):
    with pytest.raises(errors.LaunchError) as raised:
        cluster.detect(environ)
    message = str(raised.value)
    assert f"Received: {variable}" in message or f"{variable}=" in message, message
    assert value in message, message


def test_a_long_host_list_is_counted_not_expanded():
    import time

    began = time.perf_counter()
    found = cluster.detect(srun_with(SLURM_STEP_NODELIST="n[00001-99999],m[1]",
                                     SLURM_STEP_TASKS_PER_NODE="1(x100000)",
                                     SLURM_STEP_NUM_TASKS="100000", SLURM_NTASKS="100000"))
    assert time.perf_counter() - began < 0.05  # no list of 100,000 names at start-up
    assert (found.coordinator, len(found.hosts)) == ("n00001", 100000)
    assert found.hosts[99999] == "m1" and found.hosts[1] == "n00002"


@pytest.mark.parametrize("nodelist, hosts", [
    ("n[1-3,5],m[01-02]", ["n1", "n2", "n3", "n5", "m01", "m02"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
    ("a,b[7],c", ["a", "b7", "c"]),
])
def test_slurm_host_list_syntax(nodelist, hosts):
    assert slurm.expand_nodelist(nodelist) == hosts


def test_more_cpu_devices_than_cores_is_allowed_with_a_warning(monkeypatch):
    from agnostic import devices

    monkeypatch.setattr(devices, "_WARNED", set())
    monkeypatch.setenv("AGNOSTIC_CPU_DEVICES", str(devices.PAST_CORES * devices.cores() + 1))
    # resolve() asks with warn=True: said once, in the program that uses agnostic.
    with pytest.warns(errors.CpuDevicesWarning, match="more than 4 CPU devices per core"):
        assert devices.requested_cpu_devices(warn=True) == devices.PAST_CORES * devices.cores() + 1
    # A few per core (a many-device program tested on a small machine): nothing said.
    monkeypatch.setattr(devices, "_WARNED", set())
    monkeypatch.setenv("AGNOSTIC_CPU_DEVICES", str(devices.PAST_CORES * devices.cores()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        devices.requested_cpu_devices(warn=True)
