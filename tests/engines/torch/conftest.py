"""torch's processes are tested as users start them: the shim's workers
started as torch is imported (AGNOSTIC_START_EARLY's default), whatever the
environment sets for the other tests (tox.ini says why).

On 2 CPU devices, where the torch environment sets 4: these scripts ask
for 2 processes (gpus=2), and workers started as torch is imported are
started for every device, so on 4 devices two more would import Keras and
torch in every launch, only to be stopped at the compile line (about
10 CPU-seconds a launch on 2 cores). A script that asks for every device is
the usual user's; test_early_start.py, which tests the workers left over,
asks for 4 devices itself."""
import pytest


@pytest.fixture(autouse=True)
def workers_start_early(monkeypatch):
    monkeypatch.setenv("AGNOSTIC_START_EARLY", "1")
    monkeypatch.setenv("AGNOSTIC_CPU_DEVICES", "2")
