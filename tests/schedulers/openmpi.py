"""Open MPI's mpirun for tests, on this machine only.

    result = mpirun(2, [sys.executable, "-c", "import os; print(os.environ['PMIX_RANK'])"])

Processes started on this machine get mpirun's whole environment; only processes on other
machines need `-x NAME`, which mpirun() adds for each name of `env` anyway.
"""
import os

from tests.schedulers import apt_install, run

# --oversubscribe: more processes than cores; --bind-to none: no pinning to the few cores;
# single_copy_mechanism none: containers forbid the cross-memory attach vader uses by default.
OPTIONS = [
    "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
    "--mca", "btl_vader_single_copy_mechanism", "none",
]


def ensure_installed():
    """Installs openmpi-bin with apt-get when mpirun is missing."""
    apt_install("openmpi-bin", ("mpirun",))


def mpirun_command(num_processes, command, env_names=()):
    """The mpirun argument list that starts `command` (a list) `num_processes` times."""
    exported = [part for name in env_names for part in ("-x", name)]
    return ["mpirun", "-np", str(num_processes)] + OPTIONS + exported + list(command)


def mpirun(num_processes, command, env=None, timeout=120, cwd=None):
    """Runs `command` under mpirun with os.environ plus `env`; returns the CompletedProcess."""
    environ = dict(os.environ, **(env or {}))
    return run(mpirun_command(num_processes, command, env or {}), env=environ,
               timeout=timeout, cwd=cwd)
