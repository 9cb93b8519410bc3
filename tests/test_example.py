"""examples/digits.py, unchanged, in a real process on the configured engine."""
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, engine_or_skip, scikit_learn_beside, with_scikit_learn

engine_or_skip()
# The example reads scikit-learn's digits (the `examples` extra). tox installs
# scikit-learn and its dependencies in a folder beside the environment (tox.ini:
# [digits] and [example]), where the example's process finds them; elsewhere
# it imports the installed one. An engine's environment without it is a
# failure, not a skip.
if not scikit_learn_beside():
    if os.environ.get("AGNOSTIC_REQUIRE_ENGINE") == "1":
        import sklearn  # noqa: F401
    else:
        pytest.importorskip("sklearn", reason="examples/digits.py needs scikit-learn "
                            "(the `examples` extra)")


# On the README's 2 devices: the same program on 4 and on odd batch sizes
# is tests/test_programs.py's and tests/test_keras_io.py's.
@pytest.mark.parametrize("devices", ["2"])
def test_digits_example_reaches_90_percent(devices):
    env = with_scikit_learn(dict(os.environ, AGNOSTIC_CPU_DEVICES=devices))
    env.pop("AGNOSTIC_START_EARLY", None)  # as users run it (torch: tox.ini sets 0)
    result = subprocess.run([sys.executable, "examples/digits.py"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"on {devices} device(s)" in result.stdout
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", result.stdout).group(1))
    assert accuracy >= 0.9
    assert result.stdout.count("test accuracy") == 1  # one result
    assert result.stdout.count("Epoch 1/") == 1  # one progress display
    # What ran, said once by default (the example configures no logging).
    assert result.stderr.count("agnostic: plan: backend=") == 1, result.stderr[-3000:]
