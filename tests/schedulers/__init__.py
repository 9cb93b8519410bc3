"""Real schedulers for tests: a local SLURM cluster (`slurm`) and Open MPI's mpirun (`openmpi`).

Both are installed with apt-get when missing (root only). The helpers here are shared by them.
"""
import contextlib
import fcntl
import os
import shutil
import signal
import subprocess
import tempfile

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_command(name):
    """The full path of `name`, also looked for in the sbin folders a user's PATH may lack."""
    return shutil.which(name) or shutil.which(name, path=SYSTEM_PATH)


@contextlib.contextmanager
def machine_lock(name):
    """Held by one test process of this machine at a time (pytest's workers
    share the machine's package manager and /etc/hosts)."""
    with open(os.path.join(tempfile.gettempdir(), f"agnostic-tests-{name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # released as the file closes


def apt_install(package, commands):
    """Installs the Debian `package` unless all of `commands` are already there."""
    if all(find_command(name) for name in commands):
        return
    with machine_lock("apt"):
        _apt_install(package, commands)


def _apt_install(package, commands):
    if all(find_command(name) for name in commands):  # installed meanwhile
        return
    if os.geteuid() != 0:
        raise RuntimeError(
            f"{package} is not installed and only root can install it. Received: "
            f"uid={os.geteuid()}, missing={[n for n in commands if not find_command(n)]}. "
            f"Run `apt-get install {package}` as root, or the tests as root."
        )
    environ = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for arguments in (["update", "-qq"], ["install", "-y", "-qq", package]):
        # Another apt-get on the machine holds the lock for a while; wait for it.
        result = subprocess.run(
            ["apt-get", "-o", "DPkg::Lock::Timeout=300"] + arguments,
            env=environ, capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"apt-get {' '.join(arguments)} failed ({result.returncode}) while installing "
                f"{package}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
    missing = [name for name in commands if not find_command(name)]
    if missing:
        raise RuntimeError(f"{package} is installed but {missing} are still missing.")


def run(arguments, env=None, timeout=120, cwd=None):
    """Runs a launcher (srun, sbatch, mpirun) and returns its CompletedProcess (text output).

    On timeout the launcher gets SIGTERM first, so that it ends its tasks (SIGKILL would leave
    them running), then SIGKILL; subprocess.TimeoutExpired is raised either way.
    """
    process = subprocess.Popen(
        arguments, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        raise subprocess.TimeoutExpired(arguments, timeout, stdout, stderr)
    return subprocess.CompletedProcess(arguments, process.returncode, stdout, stderr)
