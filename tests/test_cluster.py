"""The cluster-environment layer: each scheduler's variables, exactly as the
scheduler sets them, read into the same answers. No engine needed."""
import json
import sys

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
    with pytest.raises(errors.LaunchError, match="TF_CONFIG must be JSON"):
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
    ({"RANK": "2", "WORLD_SIZE": "2"}, "Received: rank=2, processes=2"),
    (dict(srun_task(), SLURM_PROCID="-1"), "SLURM_PROCID must be a whole number"),
    ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2", "KERAS_DISTRIBUTION_JOB_ADDRESSES": "nohost"},
     "must start with the coordinator's HOST:PORT"),
])
def test_bad_values_are_named(environ, message):
    with pytest.raises(errors.LaunchError) as raised:
        cluster.detect(environ)
    assert message in str(raised.value)


def test_tensorflow_workers_get_one_port_each():
    from agnostic import _startup

    # Two tasks on one host (srun -n2): the coordinator's port plus the rank.
    found = cluster.detect(srun_task(rank=1, nodelist="n1", per_node="2"))
    assert _startup.worker_addresses(found) == ["n1:19242", "n1:19243"]
    several = cluster.detect(mpirun_process(3, size=4, local_size=2))
    with pytest.raises(errors.LaunchError, match="does not say where each process runs"):
        _startup.worker_addresses(several)


@pytest.mark.parametrize("name, flag, main_source, joins", [
    ("slurm", None, "import keras\n", False),  # srun's other programs stay out
    ("slurm", None, "import keras\nfrom agnostic import backend_agnostic_compile\n", True),
    ("slurm", "1", "import keras\n", True),
    ("tf-config", None, "import keras\n", True),  # set for this very process
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
