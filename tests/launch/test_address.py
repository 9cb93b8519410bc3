"""IPv6 masters: given in brackets with a port ([::1]:29500) or bare with
--master-addr, kept without brackets, and bracketed again wherever the
launcher writes HOST:PORT for an engine. Two real launchers meeting on the
IPv6 loopback, where this machine has one."""
import json
import os
import socket

import pytest

from agnostic.cluster import listen
from agnostic.launch import address, nodes, rendezvous, settings
from tests.launch.launching import start

# Starts no engine in any process (tests/conftest.py: where it runs).
pytestmark = pytest.mark.engine_free


@pytest.mark.parametrize("host, port, written", [
    ("::1", 29502, "[::1]:29502"), ("2001:db8::5", 1, "[2001:db8::5]:1"),
    ("10.0.0.1", 29502, "10.0.0.1:29502"), ("node0.example", 7, "node0.example:7")])
def test_host_port_brackets_ipv6(host, port, written):
    assert listen.host_port(host, port) == written


@pytest.mark.parametrize("master, host", [("[::1]:29600", "::1"),
                                          ("[fe80::1%eth0]:29600", "fe80::1%eth0"),
                                          ("10.0.0.1:29600", "10.0.0.1")])
def test_master_in_brackets_is_read_without_them(master, host):
    assert settings.parse_master(master) == (host, 29600)


def test_the_processes_variables_bracket_an_ipv6_master():
    cluster = rendezvous.Cluster((rendezvous.Node(0, "::1", (2222,)),
                                  rendezvous.Node(1, "2001:db8::5", (2223,))))
    env = nodes.environment(cluster, 1, 0, "::1", 29500)
    assert env["MASTER_ADDR"] == "::1" and env["MASTER_PORT"] == "29501"  # torch: bare
    assert env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "[::1]:29502"
    assert json.loads(env["TF_CONFIG"])["cluster"]["worker"] == ["[::1]:2222",
                                                                 "[2001:db8::5]:2223"]
    if "JAX_COORDINATOR_BIND_ADDRESS" not in os.environ:  # else it is the user's
        assert env["JAX_COORDINATOR_BIND_ADDRESS"] == "[::1]:29502"


def has_ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


REPORTS = """import json, os, sys
names = ("RANK", "MASTER_ADDR", "MASTER_PORT", "KERAS_DISTRIBUTION_JOB_ADDRESSES", "TF_CONFIG")
with open(os.path.join(sys.argv[1], "rank_" + os.environ["RANK"]), "w") as handle:
    json.dump({name: os.environ[name] for name in names}, handle)
"""


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_two_nodes_meet_on_the_ipv6_loopback(tmp_path):
    (tmp_path / "reports.py").write_text(REPORTS)
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
    secret = {"AGNOSTIC_JOB_SECRET": "the ipv6 test's job secret"}
    launchers = [
        start(tmp_path, "--nnodes", "2", "--node-rank", "0", "--master", f"[::1]:{port}",
              "reports.py", tmp_path, **secret),
        start(tmp_path, "--nnodes", "2", "--node_rank", "1", "--master-addr", "::1",
              "--master-port", port, "reports.py", tmp_path, **secret)]
    try:
        ended = [launcher.communicate(timeout=120) for launcher in launchers]
    finally:
        for launcher in launchers:
            if launcher.poll() is None:
                launcher.kill()
    assert [launcher.returncode for launcher in launchers] == [0, 0], ended
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank_{rank}").read_text())
        assert report["MASTER_ADDR"] == "::1" and report["MASTER_PORT"] == str(port + 1)
        assert report["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == f"[::1]:{port + 2}"
        workers = json.loads(report["TF_CONFIG"])["cluster"]["worker"]
        assert len(workers) == 2 and all(w.startswith("[::1]:") for w in workers)


def test_an_ipv6_master_is_refused_without_brackets_before_any_work(tmp_path):
    (tmp_path / "reports.py").write_text(REPORTS)
    launcher = start(tmp_path, "--master", "::1:29500", "reports.py", tmp_path)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 2
    assert b"--master ::1:29500 is ambiguous" in err and b"--master [::1]:29500" in err
    assert not list(tmp_path.glob("rank_*"))
