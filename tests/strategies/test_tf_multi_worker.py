"""tf-multi-worker: two real TensorFlow worker processes (TF_CONFIG written
by hand, both on 127.0.0.1) whose program makes its own
MultiWorkerMirroredStrategy, as Ray's and TensorFlow's guides do, beside the
one agnostic makes as the worker joins its job."""
import json
import os

import numpy as np
import pytest

from tests import jobs, models
from tests.conftest import engine_or_skip

engine_or_skip()

from agnostic.launch.processes import free_ports  # noqa: E402

SCRIPT = os.path.join("tests", "scripts", "own_strategy.py")
LATE = 8  # seconds the chief waits between the two strategies
BOUND = 240  # a run takes about 15 s on 2 cores (8 of them waiting)


@pytest.mark.parametrize("order", ["agnostic-first", "own-first"])
def test_a_program_with_its_own_strategy_trains_in_it_whoever_is_late(tmp_path, order):
    # TensorFlow 2.21 starts the worker's collective runtime again for each
    # strategy made: the chief's second start, after the other worker's first
    # all-reduce has reached it, left that all-reduce waiting for ever (CI met
    # it under Ray, where the timing is chance; here the chief is late).
    ports = free_ports(2)
    workers = []
    for index in (0, 1):
        config = {"cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
                  "task": {"type": "worker", "index": index}}
        workers.append(jobs.start(jobs.python(SCRIPT, order, LATE, tmp_path),
                                  TF_CONFIG=json.dumps(config), AGNOSTIC_CPU_DEVICES=None,
                                  TF_CPP_MIN_LOG_LEVEL="2"))
    codes, outputs, _ = jobs.finish(workers, seconds=BOUND)
    jobs.succeeded(codes, outputs)
    results = [json.loads((tmp_path / f"result_{index}.json").read_text())
               for index in (0, 1)]
    weights = {name: models.saved_weights(tmp_path / f"weights_{name}.npz")
               for name in ("0", "1", "one_device")}
    for index, result in enumerate(results):
        assert result["users_strategy"], result  # trained under the program's own
        assert models.relative_difference(weights["one_device"], weights[str(index)]) < 1e-5
        np.testing.assert_allclose(result["loss"], results[0]["one_device_loss"], atol=1e-4)
