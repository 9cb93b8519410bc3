"""agnostic/cluster/listen.py on real sockets: whether a port of this
machine is held by another process, as JAX's coordinator would find it, and
where rank 0 listens (the launcher's node 0: tests/launch/test_rendezvous.py)."""
import dataclasses
import socket

import pytest

from agnostic import cluster, errors
from agnostic.cluster import listen


def test_a_free_port_is_free_and_a_listened_one_is_held():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        assert listen.held("127.0.0.1", port) is not None  # bound, not listening yet
        holder.listen()
        error = listen.held("127.0.0.1", port)
        assert isinstance(error, OSError) and "Address already in use" in str(error)
    assert listen.held("127.0.0.1", port) is None  # closed: free again


def test_a_port_left_by_a_closed_connection_is_free():
    # The server side of a connection it closed first lingers in TIME_WAIT:
    # JAX's listener (SO_REUSEADDR) can take it, so it is not held.
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's end closes first: TIME_WAIT on `port`
        client.close()
    assert listen.held("127.0.0.1", port) is None


def rank_0_of(name, coordinator):
    return cluster.Environment(name, 2, 0, coordinator=coordinator, port=0)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_rank_0_listens_on_the_coordinators_address_only(monkeypatch):
    monkeypatch.delenv(listen.LISTEN_VARIABLE, raising=False)
    for coordinator in ("127.0.0.1", "localhost"):
        with listen.listen_socket(listen.rank_0(rank_0_of("torchrun", coordinator)),
                                  free_port()) as listener:
            assert listener.getsockname()[0] == "127.0.0.1"
    monkeypatch.setenv(listen.LISTEN_VARIABLE, "0.0.0.0")  # every interface: asked for
    with listen.listen_socket(listen.rank_0(rank_0_of("torchrun", "127.0.0.1")),
                              free_port()) as listener:
        assert listener.getsockname()[0] == "0.0.0.0"


def test_an_address_of_no_machine_here_is_refused_naming_where_it_came_from(monkeypatch):
    # 192.0.2.7 (TEST-NET) is an address of no machine.
    monkeypatch.setenv(listen.LISTEN_VARIABLE, "192.0.2.7")
    with pytest.raises(errors.LaunchError, match=(
            r"Rank 0 cannot listen on 192\.0\.2\.7 \(192\.0\.2\.7\): not an address of "
            r"this machine\..*Received: the first node of SLURM_JOB_NODELIST=127\.0\.0\.1, "
            r"AGNOSTIC_LISTEN_ADDR=192\.0\.2\.7")):
        listen.listen_socket(listen.rank_0(rank_0_of("slurm", "127.0.0.1")), free_port())


def test_a_coordinator_in_front_of_this_machine_is_listened_for_on_the_route_to_it(
        monkeypatch):
    # A service address (192.0.2.7 here) that forwards to this machine: rank 0
    # listens on its own address on the route there, not on every interface.
    monkeypatch.delenv(listen.LISTEN_VARIABLE, raising=False)
    named = listen.rank_0(rank_0_of("torchrun", "192.0.2.7"))
    route = listen._route_to("192.0.2.7")
    if route is None:  # a machine without a route there refuses, saying why
        with pytest.raises(errors.LaunchError, match=r"Received: MASTER_ADDR=192\.0\.2\.7"):
            listen.local_address(named)
        return
    with listen.listen_socket(named, free_port()) as listener:
        assert listener.getsockname()[0] == route != "0.0.0.0"
    refused = dataclasses.replace(named, route=False)  # agnostic launch's --master-addr
    with pytest.raises(errors.LaunchError, match="not an address of this machine"):
        listen.local_address(refused)


def test_a_port_held_by_another_process_is_named_with_the_fix(monkeypatch):
    monkeypatch.delenv(listen.LISTEN_VARIABLE, raising=False)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(errors.LaunchError, match=(
                rf"Rank 0 cannot listen on port {port} at 127\.0\.0\.1 \(.*in use.*\).* "
                rf"MASTER_PORT\. Received: MASTER_ADDR=127\.0\.0\.1, port {port}")):
            listen.listen_socket(listen.rank_0(rank_0_of("torchrun", "127.0.0.1")), port)
