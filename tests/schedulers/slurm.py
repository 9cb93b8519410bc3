"""A local SLURM cluster for tests: slurmctld and two slurmd "nodes", n1 and n2, on this machine.

    with local_cluster() as cluster:
        result = cluster.run(["srun", "-N2", "-n2", "hostname"])

No munge (auth/none) and no cgroups (proctrack/linuxproc, task/none), so it runs in a container.
Ports are picked free, and each of pytest's workers numbers its cluster's jobs from a first id of
its own (agnostic derives a job's ports from its id), so clusters can run side by side.
"""
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from agnostic.launch.processes import free_ports
from tests.schedulers import apt_install, find_command, machine_lock, run

COMMANDS = ("slurmctld", "slurmd", "srun", "sbatch", "sinfo")
NODES = ("n1", "n2")
HOSTS_FILE = "/etc/hosts"
HOSTS_MARK = "# local SLURM cluster of the tests in"

# config_overrides: 2 CPUs a node whatever the machine has. OverSubscribe=FORCE: jobs share
# CPUs, so that a job a failed test left running does not hold up the next tests.
# MinJobAge=5 keeps `sbatch --wait` polling every 2 s (it waits up to 8 s more otherwise);
# finished jobs leave squeue and scontrol 5 s after their end.
CONFIG = """\
ClusterName=agnostic
SlurmctldHost=localhost(127.0.0.1)
FirstJobId={first_job_id}
SlurmctldPort={controller_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=2
InactiveLimit=0
MinJobAge=5
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=localhost Port={n1_port} CPUs=2 State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 NodeHostname=localhost Port={n2_port} CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def ensure_installed():
    """Installs slurm-wlm with apt-get when slurmctld, slurmd or srun is missing."""
    apt_install("slurm-wlm", COMMANDS)


class LocalCluster:
    """A running cluster: its config file, folder and daemon PIDs, and how to call it."""

    def __init__(self, folder):
        self.folder = folder
        self.conf = os.path.join(folder, "slurm.conf")
        self.nodes = NODES
        self.pids = []

    def environ(self, env=None):
        """os.environ plus `env` for srun/sbatch: SLURM_CONF set, no SLURM_* of an enclosing job."""
        environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        environ.update(env or {}, SLURM_CONF=self.conf)
        return environ

    def run(self, arguments, env=None, timeout=120, cwd=None):
        """Runs srun, sbatch, sinfo... against this cluster; returns the CompletedProcess."""
        return run(arguments, env=self.environ(env), timeout=timeout, cwd=cwd)

    def logs(self):
        """The last lines of every daemon log, to explain a failure."""
        text = ""
        for name in sorted(os.listdir(os.path.join(self.folder, "log"))):
            with open(os.path.join(self.folder, "log", name)) as handle:
                text += f"--- {name}\n" + "".join(handle.readlines()[-15:])
        return text


@contextlib.contextmanager
def local_cluster(start_timeout=30):
    """Starts slurmctld and two slurmd, yields a LocalCluster once both nodes are idle, and
    stops every process it started (and removes what it wrote) however the block ends."""
    cluster = LocalCluster(tempfile.mkdtemp(prefix="slurm-"))
    daemons = []
    hosts_line = None
    try:
        _write_config(cluster.folder, cluster.conf)
        hosts_line = _add_hosts_line(cluster.folder)
        environ = cluster.environ()
        commands = [["slurmctld", "-D", "-f", cluster.conf]]
        commands += [["slurmd", "-D", "-N", node, "-f", cluster.conf] for node in NODES]
        for command in commands:
            # A session of its own, so that stopping its group also stops slurmscriptd.
            daemons.append(subprocess.Popen(
                [find_command(command[0])] + command[1:], env=environ, cwd=cluster.folder,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            ))
            cluster.pids.append(daemons[-1].pid)
        _wait_until_idle(cluster, daemons, start_timeout)
        yield cluster
    finally:
        _stop(daemons, cluster.conf)
        if hosts_line:
            _remove_hosts_line(hosts_line)
        shutil.rmtree(cluster.folder, ignore_errors=True)


def _write_config(folder, conf):
    for path in ["state", "log"] + [os.path.join("spool", node) for node in NODES]:
        os.makedirs(os.path.join(folder, path))
    ports = dict(zip(["controller_port", "n1_port", "n2_port"], free_ports(3)))
    with open(conf, "w") as handle:
        handle.write(CONFIG.format(folder=folder, first_job_id=first_job_id(), **ports))


def first_job_id():
    """1 for pytest's first worker (or none), 5001 for the second, ...: the ports agnostic derives
    from a job's id (agnostic.cluster.job_port, over 20,000 ids) differ between side-by-side
    clusters."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    return 1 + 5000 * (int(worker) % 4 if worker.isdigit() else 0)


def _wait_until_idle(cluster, daemons, timeout):
    deadline = time.monotonic() + timeout
    states = ""
    while time.monotonic() < deadline:
        if any(daemon.poll() is not None for daemon in daemons):
            break
        states = cluster.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10).stdout
        if sorted(states.split()) == sorted(NODES + ("idle",) * len(NODES)):
            return
        time.sleep(0.2)
    raise RuntimeError(
        f"The local SLURM cluster did not come up within {timeout} s. sinfo: {states!r}, "
        f"daemon exit codes: {[daemon.poll() for daemon in daemons]}\n{cluster.logs()}"
    )


def _stop(daemons, conf):
    """SIGTERM to each daemon's process group, SIGKILL after 5 s; then SIGKILL whatever they
    left (slurmstepd and job tasks carry SLURM_CONF=conf in their environment)."""
    for daemon in daemons:
        _signal_group(daemon.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    for daemon in daemons:
        try:
            daemon.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(daemon.pid, signal.SIGKILL)
            daemon.wait()
    for pid in _pids_with_environ(f"SLURM_CONF={conf}"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _signal_group(pid, signum):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signum)


def _pids_with_environ(entry):
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                if entry.encode() in handle.read().split(b"\0"):
                    pids.append(int(name))
        except OSError:
            continue
    return pids


def _add_hosts_line(folder):
    """Makes n1 and n2 resolve (a job's first node is its coordinator): returns the line added
    to /etc/hosts, or None where they resolve without the line of another test cluster (that
    line goes when that cluster stops, so each cluster adds its own, named by its folder)."""
    with machine_lock("hosts"):
        with open(HOSTS_FILE) as handle:
            text = handle.read()
        if HOSTS_MARK not in text and _resolves(NODES):
            return None
        line = f"127.0.0.1 {' '.join(NODES)} {HOSTS_MARK} {folder}\n"
        with open(HOSTS_FILE, "a") as handle:
            handle.write(("" if text.endswith("\n") or not text else "\n") + line)
        return line


def _resolves(names):
    try:
        for name in names:
            socket.gethostbyname(name)
        return True
    except OSError:
        return False


def _remove_hosts_line(line):
    """Removes `line`, and the lines of clusters whose folder is gone (a killed test run)."""
    with machine_lock("hosts"):
        with open(HOSTS_FILE) as handle:
            lines = handle.read().splitlines(keepends=True)
        kept = [other for other in lines if other != line and not (
            HOSTS_MARK in other and not os.path.exists(other.split(HOSTS_MARK)[1].strip()))]
        # Rewritten in place: /etc/hosts is often a bind mount that cannot be replaced.
        with open(HOSTS_FILE, "w") as handle:
            handle.write("".join(kept))
