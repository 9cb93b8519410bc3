"""The channel of `agnostic launch`'s nodes under attack: real launchers (two
"nodes" on 127.0.0.1, each an `agnostic launch` process), real sockets, and a
local process that tries what any process able to reach the port could try.
The scripts launched are tiny and import no engine; only the second
machine's address is faked (both nodes are this machine)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from agnostic import errors
from agnostic.launch import channel, rendezvous, secret, settings
from tests.conftest import ROOT

# Bounds in seconds: run alone, not beside other tests (tox: -m serial);
# no engine in any process (tests/conftest.py: where it runs).
pytestmark = [pytest.mark.serial, pytest.mark.engine_free]

SECRET = "0123456789abcdef-the-job's-secret"
WORKER = """import json, os, sys, time
folder, mode = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
with open(os.path.join(folder, "rank_" + rank), "w") as handle:
    json.dump({"workers": json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"],
               "jax_bind": os.environ["JAX_COORDINATOR_BIND_ADDRESS"]}, handle)
deadline = time.time() + 30
if mode == "wait":  # until the test says "go"
    while not os.path.exists(os.path.join(folder, "go")) and time.time() < deadline:
        time.sleep(0.05)
if mode == "fail":  # rank 1 fails once rank 0 runs; rank 0 would run on
    while rank == "1" and not os.path.exists(os.path.join(folder, "rank_0")):
        time.sleep(0.05)
    if rank == "1":
        sys.exit(3)
    time.sleep(30)
"""


@pytest.fixture
def job(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return tmp_path


def launch(job, rank, port, mode="done", *flags, **variables):
    """One node's `agnostic launch`; its stderr goes to job/stderr_RANK."""
    env = dict(os.environ, AGNOSTIC_JOIN_SECONDS="20", TMPDIR=str(job))  # logs stay there
    env.update(variables)
    env.pop("AGNOSTIC_JOB_SECRET", None)
    env.pop("AGNOSTIC_JOB_SECRET_FILE", None)
    env.pop("JAX_COORDINATOR_BIND_ADDRESS", None)
    flags = flags or ("--secret-file", str(job / "secret"))
    command = [sys.executable, "-m", "agnostic", "launch", "--nnodes", "2", "--node-rank",
               str(rank), "--master", f"127.0.0.1:{port}"] + list(flags) + [
               str(job / "worker.py"), str(job), mode]
    with open(job / f"stderr_{rank}", "w") as stderr:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=stderr, start_new_session=True)


def lines(job, rank, start):
    return [l for l in (job / f"stderr_{rank}").read_text().splitlines() if l.startswith(start)]


def wait_for(condition, seconds=20):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.05)


def listening(port):
    """The local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if os.path.exists(table):
            for row in open(table).read().splitlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                    found.append(local.rsplit(":", 1)[0])
    return found


def finished(processes, seconds=60):
    return [process.wait(seconds) for process in processes]


def greeted(port):
    """A connection to node 0 and the nonce of node 0's greeting."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    reader = channel.Lines(connection)
    return connection, channel.nonce_of(reader.read(time.monotonic() + 10))


def signed_hello(secret_bytes, leader_nonce, member_nonce, rank=1):
    key = channel.key(secret_bytes, leader_nonce, member_nonce)
    body = json.dumps({"node_rank": rank, "nnodes": 2, "nproc": 1, "ports": [1234]}).encode()
    return channel.tag(key, channel.MEMBER, 0, body) + b" " + body + b"\n"


def test_attacks_on_node_0_cost_one_line_each_and_the_job_runs(job):
    port = settings.free_master_port()
    leader = launch(job, 0, port)
    wait_for(lambda: listening(port))
    assert listening(port) == ["0100007F"]  # 127.0.0.1, not 0.0.0.0
    nonce = os.urandom(16)

    def close_at_once(connection):
        pass

    def garbage(connection):
        connection.sendall(b"\xff\x00 garbage {not json\n")

    def old_hello(connection):  # the unsigned hello of before
        connection.sendall(channel.greeting(nonce) + json.dumps(
            {"node_rank": 1, "nnodes": 2, "nproc": 1, "ports": [1]}).encode() + b"\n")

    def failed(connection):
        connection.sendall(channel.greeting(nonce) + b'{"failed": "stop it all"}\n')

    def without_the_secret(connection):  # node 1's slot, with another secret
        connection.sendall(channel.greeting(nonce) + signed_hello(
            b"a guess at the secret", connection.leader_nonce, nonce))

    def replayed(connection):  # the real node's hello, recorded from another connection
        connection.sendall(channel.greeting(nonce) + signed_hello(
            SECRET.encode(), os.urandom(16), nonce))

    def endless(connection):
        connection.sendall(b"x" * (channel.LINE_LIMIT + 10))

    attacks = [close_at_once, garbage, old_hello, failed, without_the_secret, replayed,
               endless]
    silent, _ = greeted(port)  # says nothing, stays open
    for count, attack in enumerate(attacks, 1):
        connection, leader_nonce = greeted(port)
        connection = _Connection(connection, leader_nonce)
        attack(connection)
        if attack is close_at_once:
            connection.close()
        wait_for(lambda: len(lines(job, 0, "agnostic launch: node 0 dropped")) == count, 10)
        connection.close()
    assert leader.poll() is None  # node 0 still waits for node 1
    began = time.monotonic()
    member = launch(job, 1, port)
    assert finished([leader, member]) == [0, 0], (job / "stderr_0").read_text()
    assert time.monotonic() - began < 15  # the silent connection held nothing
    assert silent.recv(10) == b""  # closed by node 0 as the join ended
    dropped = lines(job, 0, "agnostic launch: node 0 dropped")
    assert len(dropped) == len(attacks) + 1, dropped
    for words in ("connection was closed", "not an agnostic launcher's greeting",
                  "not signed with the job's secret", "longer than 65536 bytes",
                  "still silent when the join ended"):
        assert [line for line in dropped if words in line], (words, dropped)
    assert (job / "stderr_0").read_text().count("\n") == len(dropped)  # nothing else
    workers = json.loads((job / "rank_1").read_text())["workers"]
    assert len(workers) == 2 and all(w.startswith("127.0.0.1:") for w in workers)
    chief = json.loads((job / "rank_0").read_text())
    assert chief["workers"] == workers
    assert chief["jax_bind"] == f"127.0.0.1:{port + 2}"  # JAX's coordinator: not [::]


class _Connection:
    def __init__(self, connection, leader_nonce):
        self.connection, self.leader_nonce = connection, leader_nonce

    def sendall(self, data):
        self.connection.sendall(data)

    def close(self):
        self.connection.close()


def test_node_1_refuses_a_fake_node_0_then_joins_the_real_one(job):
    port = settings.free_master_port()
    fake = socket.socket()
    fake.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    fake.bind(("127.0.0.1", port))
    fake.listen(4)
    fake.settimeout(20)
    member = launch(job, 1, port)
    cluster = json.dumps({"cluster": [{"rank": 0, "host": "10.9.9.9", "ports": [1]},
                                      {"rank": 1, "host": "10.9.9.9", "ports": [2]}]})
    def signed_by_a_guess(nonce, member_nonce):
        key = channel.key(b"a guess at the secret", nonce, member_nonce)
        body = cluster.encode()
        return channel.tag(key, channel.LEADER, 0, body) + b" " + body + b"\n"

    answers = [  # each unlike the one before, as a member logs each kind once in a row
        lambda nonce, member_nonce: b"HTTP/1.0 200 OK\n",  # another service
        lambda nonce, member_nonce: cluster.encode() + b"\n",  # unsigned
        lambda nonce, member_nonce: b"",  # a greeting, then closed
        signed_by_a_guess,
    ]
    for count, answer in enumerate(answers, 1):
        connection, _ = fake.accept()
        member_nonce = channel.nonce_of(
            channel.Lines(connection).read(time.monotonic() + 10))
        nonce = os.urandom(16)
        greeting = channel.greeting(nonce) if count > 1 else b""
        connection.sendall(greeting + answer(nonce, member_nonce))
        connection.shutdown(socket.SHUT_WR)
        wait_for(lambda: len(lines(job, 1, "agnostic launch: node 1 could not join")) == count)
        connection.close()
    fake.close()
    assert member.poll() is None and not (job / "rank_1").exists()  # nothing started
    leader = launch(job, 0, port)
    assert finished([leader, member]) == [0, 0], (job / "stderr_1").read_text()
    workers = json.loads((job / "rank_1").read_text())["workers"]
    assert all(w.startswith("127.0.0.1:") for w in workers)  # not the fake's cluster
    # Each refusal said once; besides them, node 1 says only where its output
    # went that the terminal did not show, if anywhere.
    said = lines(job, 1, "agnostic launch")
    assert len([line for line in said if "could not join" in line]) == len(answers), said
    assert [line for line in said if "could not join" not in line] == [
        line for line in said if "what the terminal did not show" in line]


def test_a_silent_connection_does_not_hold_node_0_past_its_bound(job):
    port = settings.free_master_port()
    leader = launch(job, 0, port, AGNOSTIC_JOIN_SECONDS="2")
    wait_for(lambda: listening(port))
    began = time.monotonic()
    silent, _ = greeted(port)
    assert finished([leader], 30) == [2]
    assert time.monotonic() - began < 2 + 3
    assert "Node(s) [1] did not join within 2 s" in (job / "stderr_0").read_text()
    assert silent.recv(10) == b""


def test_another_secret_on_a_node_is_named_and_bounded(job, tmp_path):
    other = job / "other"
    other.write_text("another secret, of another job")
    other.chmod(0o600)
    port = settings.free_master_port()
    leader = launch(job, 0, port, AGNOSTIC_JOIN_SECONDS="3")
    member = launch(job, 1, port, "done", "--secret-file", str(other),
                    AGNOSTIC_JOIN_SECONDS="3")
    assert finished([leader, member]) == [2, 2]
    error = (job / "stderr_1").read_text()
    assert f"Cannot join the master 127.0.0.1:{port} within 3 s" in error
    assert "Give every node the same secret" in error
    assert "not signed with the job's secret" in (job / "stderr_0").read_text()
    assert not (job / "rank_0").exists() and not (job / "rank_1").exists()


def test_failures_done_and_a_vanished_node_still_cross(job):
    # A worker's failure on node 1 ends node 0's workers.
    port = settings.free_master_port()
    nodes = [launch(job, rank, port, "fail") for rank in (0, 1)]
    began = time.monotonic()
    codes = finished(nodes)
    assert codes[0] != 0 and codes[1] == 3 and time.monotonic() - began < 20
    assert "(rank 1, node 1) exited with status 3" in (job / "stderr_0").read_text()
    # A launcher killed outright ends the other node's run.
    port = settings.free_master_port()
    os.remove(job / "rank_0")
    nodes = [launch(job, rank, port, "wait") for rank in (0, 1)]
    wait_for(lambda: (job / "rank_0").exists() and (job / "rank_1").exists())
    assert listening(port) == []  # no listener left once every node joined
    nodes[1].kill()
    assert finished(nodes[:1]) == [1]
    assert "stopped answering" in (job / "stderr_0").read_text()


@pytest.mark.parametrize("how, message", [
    ({}, "--nnodes 2 needs a job secret, the same on every node"),
    ({"mode": 0o644}, "can be read by other users (mode 0644)"),
    ({"AGNOSTIC_JOB_SECRET": "short"}, "The job's secret has 5 characters; it needs at least 16"),
])
def test_a_missing_or_unsafe_secret_is_refused_before_listening(job, how, message):
    port = settings.free_master_port()
    how = dict(how)
    flags = ()
    if "mode" in how:
        (job / "secret").chmod(how.pop("mode"))
        flags = ("--secret-file", str(job / "secret"))
    env = dict(os.environ, **how)
    if not flags and not how:
        env.pop("AGNOSTIC_JOB_SECRET", None)
        env.pop("AGNOSTIC_JOB_SECRET_FILE", None)
    result = subprocess.run(
        [sys.executable, "-m", "agnostic", "launch", "--nnodes", "2", "--master",
         f"127.0.0.1:{port}"] + list(flags) + [str(job / "worker.py"), str(job), "done"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    error = " ".join(result.stderr.split())
    assert error.startswith("agnostic launch: ") and message in error, error
    assert "Traceback" not in result.stderr and not (job / "rank_0").exists()
    if not how and not flags:
        assert "secrets.token_hex(32)" in error and "--secret-file" in error


def test_secret_sources(tmp_path):
    path = tmp_path / "secret"
    path.write_text("  from-the-file-0123456789 \n")
    path.chmod(0o600)
    environ = {secret.VARIABLE: "from-the-variable-0123", secret.FILE_VARIABLE: str(path)}
    assert secret.for_launch(1, None, {}) is None  # one node: no channel
    assert secret.job_secret(None, environ) == b"from-the-file-0123456789"
    assert secret.job_secret(None, {secret.VARIABLE: environ[secret.VARIABLE]}) == \
        b"from-the-variable-0123"
    with pytest.raises(errors.LaunchError, match=r"cannot be read \(No such file"):
        secret.job_secret(str(tmp_path / "missing"), environ)
    path.chmod(0o640)
    with pytest.raises(errors.LaunchError, match=r"mode 0640.*chmod 600"):
        secret.job_secret(None, environ)
    for special in (str(tmp_path), os.devnull):  # a folder, a device
        with pytest.raises(errors.LaunchError, match="not a regular file"):
            secret.job_secret(special, environ)


def test_node_0_listens_on_the_masters_address_only():
    port = settings.free_master_port()
    for host, bound in (("127.0.0.1", "127.0.0.1"), ("localhost", "127.0.0.1")):
        listener = rendezvous.listen_socket(host, port)
        assert listener.getsockname()[0] == bound
        listener.close()
    listener = rendezvous.listen_socket("127.0.0.1", port, listen="0.0.0.0")  # asked for
    assert listener.getsockname()[0] == "0.0.0.0"
    listener.close()
    with pytest.raises(errors.LaunchError, match=r"192\.0\.2\.7 \(192\.0\.2\.7\): not an "
                                                 r"address of this machine.*--listen-addr"):
        rendezvous.listen_socket("192.0.2.7", port)  # TEST-NET: on no machine
