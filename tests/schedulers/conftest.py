"""Fixtures for the real schedulers. A failed installation fails the test: it never skips."""
import pytest

from tests.schedulers import openmpi as openmpi_module
from tests.schedulers import slurm


@pytest.fixture(scope="session")
def slurm_cluster():
    """A local SLURM cluster (nodes n1 and n2) shared by the session; see slurm.LocalCluster."""
    slurm.ensure_installed()
    with slurm.local_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def openmpi():
    """The openmpi module, once mpirun is installed: `openmpi.mpirun(2, command)`."""
    openmpi_module.ensure_installed()
    return openmpi_module
