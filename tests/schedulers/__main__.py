"""`python -m tests.schedulers`: installs SLURM and Open MPI where they are
missing, as the schedulers' tests do (apt-get, root), ahead of the tests:
.ci/run prepares the `together` environment while the one before it runs
its tests, and this is part of preparing it (tox.ini). Run by another user,
it installs nothing and says so; the tests name what is missing."""
import os
import sys

from tests.schedulers import openmpi, slurm


def main():
    if os.geteuid() != 0:
        print("tests.schedulers: not root, nothing installed; the schedulers' tests "
              "install SLURM and Open MPI where they run as root")
        return 0
    slurm.ensure_installed()
    openmpi.ensure_installed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
