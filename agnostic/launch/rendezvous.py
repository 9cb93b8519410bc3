"""How the launchers of several nodes meet before any process starts.

Node 0's launcher listens on the master port; every other node's launcher
connects, says who it is and how many processes it runs, and gets back the
whole cluster: each node's address and its processes' ports. The connections
stay open for the run: they carry "a worker failed" from any node to all
nodes, so that every process ends, and a node whose launcher vanishes ends
the run too. Plain TCP and JSON lines: no engine is involved.
"""
import dataclasses
import json
import socket
import time
from typing import List, Tuple

from agnostic import errors

JOIN_SECONDS = 60


@dataclasses.dataclass(frozen=True)
class Node:
    rank: int
    host: str
    ports: Tuple[int, ...]  # one free port per local process (TensorFlow workers)


@dataclasses.dataclass(frozen=True)
class Cluster:
    nodes: Tuple[Node, ...]

    @property
    def world_size(self):
        return sum(len(node.ports) for node in self.nodes)

    def first_rank(self, node_rank):
        return sum(len(node.ports) for node in self.nodes[:node_rank])

    def worker_addresses(self):
        return [f"{node.host}:{port}" for node in self.nodes for port in node.ports]


def free_ports(count):
    sockets = []
    try:
        for _ in range(count):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            probe.bind(("", 0))
            sockets.append(probe)
        return tuple(s.getsockname()[1] for s in sockets)
    finally:
        for probe in sockets:
            probe.close()


def _send(connection, message):
    connection.sendall((json.dumps(message) + "\n").encode())


def _receive(stream):
    line = stream.readline()
    if not line:
        raise ConnectionError("the other side closed the connection")
    return json.loads(line)


class Leader:
    """Node 0: waits for the other nodes, then serves the failure channel."""

    def __init__(self, host, port, nnodes, nproc):
        self.links = []
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind(("", port))
        except OSError as error:
            raise errors.LaunchError(
                f"Node 0 cannot listen on the master port {port}: {error}. The "
                "port is in use or not allowed; pick a free one with --master "
                f"{host}:PORT on every node."
            ) from error
        self.listener.listen(nnodes)
        self.nnodes, self.nproc, self.host = nnodes, nproc, host

    def gather(self):
        nodes = {0: Node(0, self.host, free_ports(self.nproc))}
        deadline = time.monotonic() + JOIN_SECONDS
        while len(nodes) < self.nnodes:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(self.nnodes)) - set(nodes))
                raise errors.LaunchError(
                    f"Node(s) {missing} did not join within {JOIN_SECONDS} s "
                    f"(--nnodes {self.nnodes}). Start `agnostic launch` with "
                    "the same --master on every node, each with its --node-rank."
                )
            self.listener.settimeout(left)
            try:
                connection, (address, _) = self.listener.accept()
            except socket.timeout:
                continue
            stream = connection.makefile("r")
            hello = _receive(stream)
            problem = self._check(hello, nodes)
            if problem:
                _send(connection, {"error": problem})
                connection.close()
                raise errors.LaunchError(problem)
            nodes[hello["node_rank"]] = Node(hello["node_rank"], address, tuple(hello["ports"]))
            self.links.append((connection, stream))
        cluster = Cluster(tuple(nodes[r] for r in range(self.nnodes)))
        for connection, _ in self.links:
            _send(connection, {"cluster": [dataclasses.asdict(n) for n in cluster.nodes]})
        return cluster

    def _check(self, hello, nodes):
        if hello.get("nnodes") != self.nnodes or hello.get("nproc") != self.nproc:
            return (
                f"Node {hello.get('node_rank')} was started with --nnodes "
                f"{hello.get('nnodes')} --nproc-per-node {hello.get('nproc')}, but node 0 "
                f"with --nnodes {self.nnodes} --nproc-per-node {self.nproc}. Start "
                "every node with the same numbers."
            )
        if hello.get("node_rank") in nodes:
            return (f"Two nodes were started with --node-rank {hello.get('node_rank')}; "
                    "give each node its own rank from 0 to --nnodes - 1.")
        return None


class Member:
    """Nodes 1..M-1: join node 0 and receive the cluster."""

    def __init__(self, host, port, node_rank, nnodes, nproc):
        deadline = time.monotonic() + JOIN_SECONDS
        while True:
            try:
                self.connection = socket.create_connection((host, port), timeout=5)
                break
            except OSError as error:
                if time.monotonic() > deadline:
                    raise errors.LaunchError(
                        f"Cannot reach the master {host}:{port} within {JOIN_SECONDS} s "
                        f"({error}). Start node 0 first, and check the address, the "
                        "port and any firewall between the nodes."
                    ) from error
                time.sleep(0.5)
        self.connection.settimeout(None)
        self.stream = self.connection.makefile("r")
        _send(self.connection, {"node_rank": node_rank, "nnodes": nnodes, "nproc": nproc,
                                "ports": list(free_ports(nproc))})

    def gather(self):
        self.connection.settimeout(JOIN_SECONDS + 10)
        try:
            reply = _receive(self.stream)
        except (OSError, ValueError) as error:
            raise errors.LaunchError(f"Node 0 did not send the cluster: {error}") from error
        self.connection.settimeout(None)
        if "error" in reply:
            raise errors.LaunchError(reply["error"])
        return Cluster(tuple(Node(n["rank"], n["host"], tuple(n["ports"]))
                             for n in reply["cluster"]))


def links_of(party) -> List[Tuple[socket.socket, object]]:
    """The open connections that carry failures (node 0: all; others: one)."""
    if isinstance(party, Leader):
        return party.links
    return [(party.connection, party.stream)]
