"""Real `agnostic launch` processes for the launcher's tests: tiny scripts
that import no engine (the launcher is the point), run from a test's own
folder, which is also their TMPDIR (so a log folder made in the temp dir
lands there)."""
import glob
import os
import subprocess
import sys

from tests.conftest import ROOT

# Variables of an outer launch or run that would change what these do.
OUTER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RUN_ID", "AGNOSTIC_EXIT_SECONDS", "AGNOSTIC_PREEMPT_SIGNAL",
         "AGNOSTIC_JOB_SECRET", "AGNOSTIC_JOB_SECRET_FILE", "JAX_COORDINATOR_BIND_ADDRESS")


def environment(folder, **variables):
    env = {name: value for name, value in os.environ.items() if name not in OUTER}
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env.update(TMPDIR=str(folder), PYTHONPATH=path, **variables)
    return env


def start(folder, *arguments, **variables):
    """`agnostic launch ARGUMENTS`, started in `folder` (bytes out and err, piped)."""
    command = [sys.executable, "-m", "agnostic", "launch"] + [str(a) for a in arguments]
    return subprocess.Popen(command, cwd=folder, env=environment(folder, **variables),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def launch(folder, *arguments, timeout=120, **variables):
    """`agnostic launch ARGUMENTS` run to its end: (status, stdout, stderr) as text."""
    process = start(folder, *arguments, **variables)
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def temporary_logs(folder):
    """The log folders the launcher made in the temp dir (`folder`)."""
    return sorted(glob.glob(os.path.join(str(folder), "agnostic-logs-*")))


def read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()
