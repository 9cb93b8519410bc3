"""torch's processes are tested as users start them: the shim's workers
started as torch is imported (AGNOSTIC_START_EARLY's default), whatever the
environment sets for the other tests (tox.ini says why)."""
import pytest


@pytest.fixture(autouse=True)
def workers_start_early(monkeypatch):
    monkeypatch.setenv("AGNOSTIC_START_EARLY", "1")
