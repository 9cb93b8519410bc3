"""How the launchers of several nodes meet before any process starts.

Node 0's launcher (the leader) listens on the master address; every other
node's launcher (a member) connects, proves it holds the job's secret, says
who it is and how many processes it runs, and gets back the whole cluster:
each node's address and its processes' ports. The connections stay open for
the run: they carry "a worker failed" from any node to all nodes, so that
every process ends, and a node whose launcher vanishes ends the run too.
Plain TCP and JSON lines: no engine is involved.

Every line after a greeting is signed with the job's secret (channel.py).
Whatever else arrives (garbage, a line without the secret, a connection that
stays silent) costs that connection and one warning: never the job, a node's
slot, or more time than the join's bound.
"""
import dataclasses
import logging
import secrets
import select
import socket
import time
from typing import List, Optional, Tuple

from agnostic import errors
from agnostic.cluster import join_seconds
from agnostic.launch import channel, processes
from agnostic.cluster import listen as listen_lib
from agnostic.cluster.listen import host_port

logger = logging.getLogger("agnostic")

ANSWER_SECONDS = 10  # for a new connection to prove the secret
MAX_WAITING = 64  # connections still to prove it; the oldest goes first
CLUSTER_LIMIT = 1 << 24  # bytes in the line that holds the cluster


@dataclasses.dataclass(frozen=True)
class Node:
    rank: int
    host: str
    ports: Tuple[int, ...]  # one free port per local process (TensorFlow workers)


@dataclasses.dataclass(frozen=True)
class Cluster:
    nodes: Tuple[Node, ...]
    # Where node 0 listens (known on node 0 only; not part of the cluster's identity).
    listen_host: Optional[str] = dataclasses.field(default=None, compare=False)

    @property
    def world_size(self):
        return sum(len(node.ports) for node in self.nodes)

    def first_rank(self, node_rank):
        return sum(len(node.ports) for node in self.nodes[:node_rank])

    def worker_addresses(self):
        return [host_port(node.host, port) for node in self.nodes for port in node.ports]


def listen_socket(host, port, listen=None):
    """The socket node 0 listens on, bound to the job's own address: the
    master host, or `listen` (--listen-addr; 0.0.0.0 or :: for every
    interface, only when asked for). A name is resolved here; one that
    resolves to no address of this machine is refused, as the other nodes
    could not reach node 0 there (cluster/listen.py)."""
    named = listen_lib.Named(
        "Node 0", host, "--master-addr", listen, "--listen-addr",
        f"Pick a free one with --master {host_port(host, 'PORT')} on every node.",
        route=False)
    return listen_lib.listen_socket(named, port)


def _peer(address):
    return host_port(address[0], address[1])


@dataclasses.dataclass
class _Newcomer:
    lines: channel.Lines
    nonce: bytes
    peer: str
    host: str
    until: float
    link: object = None


class Leader:
    """Node 0: waits for the other nodes, then serves the failure channel."""

    def __init__(self, host, port, nnodes, nproc, secret, listen=None):
        self.nnodes, self.nproc, self.host, self.secret = nnodes, nproc, host, secret
        self.links: List[channel.Link] = []
        self.ranks = {}  # Link -> rank
        self.listener = listen_socket(host, port, listen)
        self.listen_host = self.listener.getsockname()[0]
        self.listener.listen(min(nnodes + MAX_WAITING, 1024))

    def gather(self):
        seconds = join_seconds()
        deadline = time.monotonic() + seconds
        nodes = {0: Node(0, self.host, processes.free_ports(self.nproc))}
        waiting = {}  # socket -> _Newcomer
        try:
            while len(nodes) < self.nnodes:
                now = time.monotonic()
                if now >= deadline:
                    missing = sorted(set(range(self.nnodes)) - set(nodes))
                    raise errors.LaunchError(
                        f"Node(s) {missing} did not join within {seconds} s "
                        f"(--nnodes {self.nnodes}). Start `agnostic launch` with the same "
                        "--master and job secret on every node, each with its --node-rank."
                    )
                for newcomer in [n for n in waiting.values() if n.until <= now]:
                    self._drop(waiting, newcomer, f"silent for {ANSWER_SECONDS} s")
                until = min([deadline] + [n.until for n in waiting.values()])
                watched = [self.listener] + list(waiting) + self.links
                readable, _, _ = select.select(watched, [], [], max(0.0, until - now))
                for ready in readable:
                    if ready is self.listener:
                        self._accept(waiting, min(deadline, now + ANSWER_SECONDS))
                    elif ready in waiting:
                        self._hear(waiting, waiting[ready], nodes)
                    elif ready in self.ranks:  # not one dropped just now
                        self._lost(ready, nodes)
        finally:
            for newcomer in list(waiting.values()):
                self._drop(waiting, newcomer, "still silent when the join ended")
            self.listener.close()
        cluster = Cluster(tuple(nodes[r] for r in range(self.nnodes)), self.listen_host)
        message = {"cluster": [dataclasses.asdict(n) for n in cluster.nodes]}
        for link in self.links:
            try:
                link.send(message)
            except OSError as error:
                for other in self.links:
                    other.close()
                raise errors.LaunchError(
                    f"Node {self.ranks[link]} ({link.peer}) left as the cluster was sent "
                    f"({error}); nothing was started. Start every node again.") from error
        for link in self.links:
            link.connection.settimeout(ANSWER_SECONDS)  # sends never hang the run
        return cluster

    def _accept(self, waiting, until):
        try:
            connection, address = self.listener.accept()
        except OSError as error:  # the peer gave up already, or no descriptor left
            logger.warning("agnostic launch: node 0 could not accept a connection: %s", error)
            return
        if len(waiting) >= MAX_WAITING:
            oldest = min(waiting.values(), key=lambda n: n.until)
            self._drop(waiting, oldest, f"one of more than {MAX_WAITING} connections waiting")
        nonce = secrets.token_bytes(channel.NONCE_BYTES)
        try:
            connection.settimeout(ANSWER_SECONDS)
            connection.sendall(channel.greeting(nonce))
        except OSError as error:
            connection.close()
            logger.warning("agnostic launch: node 0 dropped a connection from %s: %s.",
                           _peer(address), error)
            return
        waiting[connection] = _Newcomer(channel.Lines(connection), nonce, _peer(address),
                                        address[0], until)

    def _drop(self, waiting, newcomer, reason):
        waiting.pop(newcomer.lines.connection, None)
        newcomer.lines.connection.close()
        logger.warning("agnostic launch: node 0 dropped a connection from %s that did not "
                       "prove the job's secret: %s.", newcomer.peer, reason)

    def _hear(self, waiting, newcomer, nodes):
        try:
            newcomer.lines.fill()
            hello = None
            while hello is None:
                line = newcomer.lines.take()
                if line is None:
                    return
                if newcomer.link is None:
                    key = channel.key(self.secret, newcomer.nonce, channel.nonce_of(line))
                    newcomer.link = channel.Link(newcomer.lines, key, channel.LEADER,
                                                 newcomer.peer)
                else:
                    hello = newcomer.link.open(line)
        except OSError as error:  # channel.ChannelError too
            self._drop(waiting, newcomer, error)
            return
        # Signed with the job's secret: a launcher of this job said this.
        waiting.pop(newcomer.lines.connection)
        link = newcomer.link
        problem = self._check(hello, nodes, newcomer.peer)
        if problem:
            try:
                link.send({"error": problem})
            except OSError:
                pass
            link.close()
            raise errors.LaunchError(problem)
        rank = hello["node_rank"]
        try:
            link.send({"joined": rank})
        except OSError as error:
            link.close()
            logger.warning("agnostic launch: node %d (%s) left as it joined: %s",
                           rank, link.peer, error)
            return
        nodes[rank] = Node(rank, newcomer.host, tuple(hello["ports"]))
        self.links.append(link)
        self.ranks[link] = rank

    def _lost(self, link, nodes):
        # A node that joined says nothing until it has the cluster: it left.
        rank = self.ranks.pop(link)
        self.links.remove(link)
        link.close()
        del nodes[rank]
        logger.warning("agnostic launch: node %d (%s) left before every node had joined; "
                       "waiting for it again.", rank, link.peer)

    def _check(self, hello, nodes, peer):
        rank, nnodes, nproc, ports = (hello.get(k) for k in ("node_rank", "nnodes", "nproc",
                                                               "ports"))
        if not (all(type(v) is int for v in (rank, nnodes, nproc)) and type(ports) is list
                and all(type(p) is int and 0 < p < 65536 for p in ports)
                and len(ports) == nproc):
            return (f"Node 0 cannot read the hello of the launcher at {peer}: {hello!r}. "
                    "Start every node with the same version of agnostic.")
        if nnodes != self.nnodes or nproc != self.nproc:
            return (
                f"Node {rank} was started with --nnodes {nnodes} --nproc-per-node {nproc}, "
                f"but node 0 with --nnodes {self.nnodes} --nproc-per-node {self.nproc}. "
                "Start every node with the same numbers."
            )
        if rank in nodes or not 0 < rank < self.nnodes:
            return (f"Two nodes were started with --node-rank {rank}; "
                    "give each node its own rank from 0 to --nnodes - 1.")
        return None


class Member:
    """Nodes 1..M-1: join node 0 (each proving the job's secret to the other)
    and receive the cluster. An answer at the master's port that is not node
    0's (without the secret) is refused with a warning, and the member tries
    again until the join's bound."""

    def __init__(self, host, port, node_rank, nnodes, nproc, secret):
        self.host, self.port, self.secret = host, port, secret
        self.hello = {"node_rank": node_rank, "nnodes": nnodes, "nproc": nproc,
                      "ports": list(processes.free_ports(nproc))}
        seconds = join_seconds()
        deadline = time.monotonic() + seconds
        last, doubt, said = None, None, None
        while True:
            try:
                self.link = self._join(deadline)
                return
            except channel.ChannelError as error:
                last = doubt = error
                if str(error) != said:  # once, not at every try
                    said = str(error)
                    logger.warning("agnostic launch: node %d could not join at the "
                                   "master %s: %s; trying again.", node_rank,
                                   host_port(host, port), error)
            except OSError as error:
                last = error
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(0.5, left))
        if doubt is not None:
            raise errors.LaunchError(
                f"Cannot join the master {host_port(host, port)} within {seconds} s; the "
                f"last answer there: {doubt} (last try: {last}). So it goes when node 0 "
                "has another job secret, or another process holds that port. Give every "
                "node the same secret (--secret-file or AGNOSTIC_JOB_SECRET), and check "
                "that node 0's launcher listens there.")
        raise errors.LaunchError(
            f"Cannot reach the master {host_port(host, port)} within {seconds} s "
            f"({last}). Start node 0 first, and check the address, the port and any "
            "firewall between the nodes.")

    def _join(self, deadline):
        until = min(deadline, time.monotonic() + ANSWER_SECONDS)
        connection = socket.create_connection(
            (self.host, self.port), timeout=max(0.1, min(5.0, until - time.monotonic())))
        try:
            nonce = secrets.token_bytes(channel.NONCE_BYTES)
            connection.sendall(channel.greeting(nonce))
            lines = channel.Lines(connection)
            key = channel.key(self.secret, channel.nonce_of(lines.read(until)), nonce)
            link = channel.Link(lines, key, channel.MEMBER, host_port(self.host, self.port))
            link.send(self.hello)
            answer = link.receive(until)
        except BaseException:
            connection.close()
            raise
        if "error" in answer:  # signed: node 0 refuses this node
            connection.close()
            raise errors.LaunchError(str(answer["error"]))
        return link

    def gather(self):
        self.link.lines.limit = CLUSTER_LIMIT
        try:
            reply = self.link.receive(time.monotonic() + join_seconds() + ANSWER_SECONDS)
        except OSError as error:
            self.link.close()
            raise errors.LaunchError(f"Node 0 did not send the cluster: {error}") from error
        self.link.connection.settimeout(ANSWER_SECONDS)  # sends never hang the run
        try:
            return Cluster(tuple(Node(int(n["rank"]), str(n["host"]),
                                      tuple(int(p) for p in n["ports"]))
                                 for n in reply["cluster"]))
        except (KeyError, TypeError, ValueError) as error:
            self.link.close()
            raise errors.LaunchError(
                f"Node 0 sent a cluster this launcher cannot read ({error!r}). Start every "
                "node with the same version of agnostic.") from error


def links_of(party) -> List[channel.Link]:
    """The open connections that carry failures (node 0: all; others: one)."""
    if isinstance(party, Leader):
        return party.links
    return [party.link]
