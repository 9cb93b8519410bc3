"""A missing peer ends the engine's join within AGNOSTIC_JOIN_SECONDS, with a
message naming it; rank 0's listeners (torch's store, JAX's coordinator) are
bound to the job's address, read from /proc/net/tcp while rank 0 waits.
Real processes and sockets; one process of a job of two, the other absent."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from agnostic.launch.processes import free_port
from tests.conftest import ROOT, engine_or_skip

# Bounds in seconds: run alone, not beside other tests (tox: -m serial).
pytestmark = pytest.mark.serial

JOIN_SECONDS = 5
PROGRAM = """
import keras
import agnostic
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
agnostic.backend_agnostic_compile(model, optimizer="sgd", loss="mse")
print("compiled")
"""


def listening(port):
    """The local addresses a TCP socket listens on at `port`, from /proc."""
    found = []
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            with open(name) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                # /proc prints each 32-bit word in the host's (little-endian) order.
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                shown = socket.inet_ntop(socket.AF_INET if width == 8 else socket.AF_INET6, raw)
                # An IPv6 socket bound to an IPv4 address (gRPC's): that address.
                found.append(shown[len("::ffff:"):] if shown.startswith("::ffff:") and
                             "." in shown else shown)
    return found


def start_alone(backend, port):
    """Rank 0 of a job of two whose rank 1 never comes."""
    env = dict(os.environ, PYTHONPATH=ROOT, KERAS_BACKEND=backend,
               AGNOSTIC_JOIN_SECONDS=str(JOIN_SECONDS), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("AGNOSTIC_CPU_DEVICES", None)
    if backend == "tensorflow":
        env["TF_CONFIG"] = ('{"cluster": {"worker": ["127.0.0.1:%d", "127.0.0.1:%d"]}, '
                            '"task": {"type": "worker", "index": 0}}' % (port, free_port()))
    else:
        env.update(RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_missing_peer_ends_the_join_in_time_and_is_named():
    engine_or_skip()
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend not in ("tensorflow", "jax", "torch"):
        pytest.skip(f"{backend} has no multi-process join")
    port = free_port()
    process = start_alone(backend, port)
    try:
        addresses, began = [], time.monotonic()
        while not addresses and process.poll() is None and time.monotonic() - began < 120:
            addresses = listening(port)
            time.sleep(0.05)
        listened = time.monotonic()
        _, err = process.communicate(timeout=JOIN_SECONDS + 60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    ended = time.monotonic() - listened
    assert addresses, f"rank 0 never listened on {port}: {err[-3000:]}"
    assert process.returncode != 0 and "compiled" not in err
    # Within the bound, with slack for the probes and the exit.
    assert ended < JOIN_SECONDS + 5, (ended, err[-3000:])
    if backend == "tensorflow":
        # TensorFlow's gRPC server listens on every interface (its own choice).
        assert f"Not answering: worker 1 at 127.0.0.1:" in err, err[-3000:]
    else:
        assert addresses == ["127.0.0.1"], addresses  # not 0.0.0.0 or ::
        expected = "Rank 1 of the 2 processes" if backend == "torch" else "process 1"
        assert expected in err and (f"within {JOIN_SECONDS} s" in err
                                    or f"waited {JOIN_SECONDS} s" in err), err[-3000:]


def test_torch_store_listens_on_the_job_address_and_names_an_absent_rank_0():
    # One process plays each side in turn: rank 0's store alone, then rank 1
    # with no rank 0 at all.
    if os.environ.get("KERAS_BACKEND") != "torch":
        pytest.skip("torch's store")
    engine_or_skip()
    from agnostic import cluster, errors
    from agnostic.cluster import torch_join

    port = free_port()
    chief = cluster.Environment("rank-variables", 2, 0, coordinator="localhost", port=port)
    raised, began = [], time.monotonic()

    def alone():
        try:
            torch_join.store(chief, 2)
        except errors.LaunchError as error:
            raised.append(error)

    waiting = threading.Thread(target=alone)
    waiting.start()
    addresses = []
    while not addresses and waiting.is_alive():
        addresses = listening(port)
        time.sleep(0.02)
    waiting.join()
    assert time.monotonic() - began < 4 and "Rank 1 of the 2 processes" in str(raised[0])
    assert addresses in (["127.0.0.1"], ["::1"])  # "localhost": loopback only
    worker = cluster.Environment("rank-variables", 2, 1, coordinator="127.0.0.1",
                                 port=free_port())
    began = time.monotonic()
    with pytest.raises(errors.LaunchError, match="could not reach rank 0 at 127.0.0.1"):
        torch_join.store(worker, 2)
    assert time.monotonic() - began < 4
