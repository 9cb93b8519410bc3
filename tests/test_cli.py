"""`agnostic info` and `python -m agnostic info` in a real process."""
import os
import subprocess
import sys

from tests.conftest import ROOT


def run_info(*command):
    return subprocess.run(list(command), capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=dict(os.environ))


def test_info_reports_versions_and_the_plan():
    result = run_info(sys.executable, "-m", "agnostic", "info")
    assert "python: " in result.stdout
    assert "keras: " in result.stdout
    try:
        import keras  # noqa: F401
    except ImportError:
        assert result.returncode == 1
        assert "plan: unavailable: agnostic needs Keras" in result.stdout
        return
    assert result.returncode == 0, result.stderr
    backend = os.environ.get("KERAS_BACKEND")
    assert f"backend: {backend}" in result.stdout
    assert "plan: strategy=" in result.stdout
    assert "reason: " in result.stdout


def test_console_script_is_installed():
    script = os.path.join(os.path.dirname(sys.executable), "agnostic")
    result = run_info(script, "info")
    assert "plan:" in result.stdout
