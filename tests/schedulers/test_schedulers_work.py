"""The real schedulers of the cluster tests work on this machine: SLURM's srun and sbatch on the
local two-node cluster, and Open MPI's mpirun."""
import os
import sys
import time

from tests.conftest import alive
from tests.schedulers import slurm

# One short line per variable ("rank name=value"), each written by one system call: srun cuts
# lines longer than 1 KiB, and mpirun gives the ranks a terminal, where print() writes in pieces;
# the ranks' output could otherwise interleave within a line.
PRINT_VARIABLES = (
    "import os\n"
    "rank = os.environ.get('SLURM_PROCID', os.environ.get('OMPI_COMM_WORLD_RANK'))\n"
    "for name, value in sorted(os.environ.items()):\n"
    "    if name.startswith(('SLURM', 'OMPI_', 'PMIX_', 'AGNOSTIC_')):\n"
    "        os.write(1, f'{rank} {name}={value}\\n'.encode())\n"
)
SHOW_VARIABLES = [sys.executable, "-c", PRINT_VARIABLES]

# Rank 1 dies by SIGKILL while rank 0 would sleep for 5 minutes.
KILL_RANK_1 = (
    "import os, signal, time\n"
    "if os.environ['SLURM_PROCID'] == '1':\n"
    "    time.sleep(1)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)\n"
    "time.sleep(300)\n"
)


def variables_by_rank(output):
    """The variables each rank printed, in rank order."""
    ranks = {}
    for line in output.splitlines():
        rank, _, variable = line.partition(" ")
        if rank.isdigit() and "=" in variable:
            ranks.setdefault(int(rank), {}).update([variable.split("=", 1)])
    return [ranks[rank] for rank in sorted(ranks)]


def succeeded(result):
    assert result.returncode == 0, f"{result.args} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_srun_one_task_on_each_node(slurm_cluster):
    result = slurm_cluster.run(
        ["srun", "-N2", "-n2", "--ntasks-per-node=1"] + SHOW_VARIABLES, timeout=60)
    tasks = variables_by_rank(succeeded(result))
    places = [(t["SLURM_PROCID"], t["SLURM_NODEID"], t["SLURMD_NODENAME"]) for t in tasks]
    assert places == [("0", "0", "n1"), ("1", "1", "n2")]
    assert {t["SLURM_JOB_NODELIST"] for t in tasks} == {"n[1-2]"}
    assert {t["SLURM_NTASKS"] for t in tasks} == {"2"}


def test_srun_two_tasks_on_one_node(slurm_cluster):
    result = slurm_cluster.run(["srun", "-n2"] + SHOW_VARIABLES, timeout=60)
    tasks = variables_by_rank(succeeded(result))
    places = [(t["SLURM_PROCID"], t["SLURM_LOCALID"], t["SLURM_NODEID"]) for t in tasks]
    assert places == [("0", "0", "0"), ("1", "1", "0")]
    assert tasks[0]["SLURMD_NODENAME"] == tasks[1]["SLURMD_NODENAME"]


def test_sbatch_wait_runs_a_script(slurm_cluster, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\nsrun {sys.executable} {tmp_path / 'show.py'}\n")
    (tmp_path / "show.py").write_text(PRINT_VARIABLES)
    output = tmp_path / "job.out"
    result = slurm_cluster.run(
        ["sbatch", "--wait", "-N2", "--ntasks-per-node=1", "-o", str(output), str(script)],
        timeout=60)
    succeeded(result)
    tasks = variables_by_rank(output.read_text())
    assert [t["SLURM_PROCID"] for t in tasks] == ["0", "1"]
    assert {t["SLURM_JOB_ID"] for t in tasks} == {result.stdout.split()[-1]}


def test_kill_on_bad_exit_ends_the_step_when_a_task_is_killed(slurm_cluster):
    # Without --kill-on-bad-exit (KillOnBadExit=0 is SLURM's default) srun waits for rank 0.
    start = time.monotonic()
    result = slurm_cluster.run(
        ["srun", "--kill-on-bad-exit=1", "-N2", "-n2", "--ntasks-per-node=1",
         sys.executable, "-c", KILL_RANK_1], timeout=90)
    assert result.returncode != 0
    assert time.monotonic() - start < 60
    assert "task 1: Killed" in result.stderr


def test_mpirun_starts_ranks(openmpi):
    result = openmpi.mpirun(2, SHOW_VARIABLES, env={"AGNOSTIC_PROBE": "1"}, timeout=60)
    tasks = variables_by_rank(succeeded(result))
    assert [t["OMPI_COMM_WORLD_RANK"] for t in tasks] == ["0", "1"]
    assert {t["OMPI_COMM_WORLD_SIZE"] for t in tasks} == {"2"}
    assert {t["AGNOSTIC_PROBE"] for t in tasks} == {"1"}


def test_local_cluster_leaves_nothing_behind(tmp_path):
    slurm.ensure_installed()
    pid_file = tmp_path / "task.pid"
    with slurm.local_cluster() as cluster:
        daemons, folder = list(cluster.pids), cluster.folder
        assert all(alive(pid) for pid in daemons)
        # A job still running at the end must not outlive the cluster either.
        result = cluster.run(["sbatch", "-o", "/dev/null", "--wrap",
                              f"echo $$ > {pid_file}; exec sleep 300"], timeout=30)
        assert result.returncode == 0, result.stderr
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline, "the batch job did not start"
            time.sleep(0.1)
        task = int(pid_file.read_text())
        assert alive(task)
    assert not any(alive(pid) for pid in daemons + [task])
    assert not os.path.exists(folder)
    with open(slurm.HOSTS_FILE) as handle:
        assert folder not in handle.read()
