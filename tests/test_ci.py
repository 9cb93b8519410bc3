"""The CI's own scripts (.ci/), in real processes: `once.py` runs an
environment's setup command once (`.ci/run` prepares an environment in one
tox run and tests it in the next, and tox runs extra_setup_commands at
both)."""
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.engine_free
ONCE = [sys.executable, f"{ROOT}/.ci/once.py"]


def once(marker, *command):
    return subprocess.run(ONCE + [str(marker), "--"] + list(command),
                          capture_output=True, text=True, timeout=60)


def test_a_command_runs_once_per_marker_and_again_when_it_changes(tmp_path):
    marker, count = tmp_path / "once-digits", tmp_path / "count"
    append = [sys.executable, "-c", f"open({str(count)!r}, 'a').write('x')"]
    assert once(marker, *append).returncode == 0
    assert once(marker, *append).returncode == 0
    assert count.read_text() == "x"  # the second run found its marker
    changed = append + ["another argument"]
    assert once(marker, *changed).returncode == 0
    assert count.read_text() == "xx"
    marker.write_bytes(b"\xff\xfe not the command")  # unreadable: run again
    assert once(marker, *changed).returncode == 0
    assert count.read_text() == "xxx"


def test_a_failing_command_leaves_no_marker_and_its_status(tmp_path):
    marker = tmp_path / "once-example"
    result = once(marker, sys.executable, "-c", "raise SystemExit(3)")
    assert result.returncode == 3
    assert not marker.exists()
    assert [path.name for path in tmp_path.iterdir()] == []


def test_a_call_without_its_command_says_how_to_call_it(tmp_path):
    result = subprocess.run(ONCE + [str(tmp_path / "marker")], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert "usage: once.py MARKER -- COMMAND...; received" in result.stderr
