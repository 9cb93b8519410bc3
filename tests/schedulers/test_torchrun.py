"""torchrun starts every engine's processes, not only torch's: the same
unchanged script trains like one device on TensorFlow, JAX and torch. Its
agent's store holds MASTER_PORT, so JAX's coordinator and TensorFlow's
workers take the ports after it; on several nodes TensorFlow's workers learn
each other's addresses through that store (torchrun does not say them)."""
import sys

import pytest

from agnostic.launch.processes import free_port
from tests import jobs
from tests.schedulers.test_training import DEVICES, variables

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def run(processes, engine):
    codes, outputs, _ = jobs.finish(processes, seconds=600)
    jobs.succeeded(codes, outputs)
    jobs.check_like_one_device(jobs.chief_result(outputs), 2 * DEVICES[engine], "torchrun")


# JAX's processes join alike on one node and on two (the coordinator on the
# port after the agent's store): its two-node run below. TensorFlow's
# workers on one node know every address; on two they exchange them.
@pytest.mark.parametrize("engine", ["tensorflow", "torch"])
def test_one_node_trains_like_one_device(engine, tmp_path):
    command = TORCHRUN + ["--standalone", "--nproc-per-node", "2"] + jobs.python(
        jobs.SCENARIO, "equivalence", 2 * DEVICES[engine], tmp_path)[1:]
    run([jobs.start(command, **variables(engine))], engine)


@pytest.mark.parametrize("engine", ["tensorflow", "jax"])
def test_two_nodes_train_like_one_device(engine, tmp_path):
    # Two torchrun agents on this machine, as on two nodes (static rendezvous).
    port = free_port()
    script = jobs.python(jobs.SCENARIO, "equivalence", 2 * DEVICES[engine], tmp_path)[1:]
    processes = [
        jobs.start(TORCHRUN + ["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node",
                               "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
                   + script, **variables(engine))
        for node in (0, 1)
    ]
    run(processes, engine)
