"""Processes started together on one machine share its cores, as torchrun's
do: each gets cores / processes intra-op threads (OMP_NUM_THREADS for torch
and OpenMP, TF_NUM_INTRAOP_THREADS for TensorFlow), unless the user chose.
Real launches of a script that imports no engine."""
import json

import pytest

from agnostic import devices
from tests.launch.launching import launch

# Starts no engine in any process (tests/conftest.py: where it runs).
pytestmark = pytest.mark.engine_free

SAYS = """import json, os
print(json.dumps({name: os.environ.get(name) for name in
                  ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS")}))
"""


@pytest.fixture
def says(tmp_path):
    (tmp_path / "says.py").write_text(SAYS)
    return tmp_path


def launched(folder, nproc):
    """What rank 0 of `nproc` launched processes found (the test's variables)."""
    code, out, err = launch(folder, "--nproc-per-node", str(nproc), "says.py")
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def no_thread_variables(monkeypatch):
    for name in devices.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_two_processes_share_the_cores(says):
    share = str(max(1, devices.cores() // 2))
    assert launched(says, 2) == {"OMP_NUM_THREADS": share, "TF_NUM_INTRAOP_THREADS": share}


def test_one_process_keeps_the_engines_default(says):
    assert launched(says, 1) == {"OMP_NUM_THREADS": None, "TF_NUM_INTRAOP_THREADS": None}


def test_the_users_choice_is_kept(says, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert launched(says, 2) == {"OMP_NUM_THREADS": "3", "TF_NUM_INTRAOP_THREADS": None}
