"""`agnostic launch`: the processes of one node, with each engine's own
distributed runtime configured through its own variables:

- torch: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (as torchrun);
- TensorFlow: TF_CONFIG for MultiWorkerMirroredStrategy;
- JAX: KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES, _PROCESS_ID, read by
  `keras.distribution.initialize` (which calls `jax.distributed.initialize`).

The launcher runs no training itself: it starts, watches and stops.
"""
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time

from agnostic import errors
from agnostic.launch import local, rendezvous

logger = logging.getLogger("agnostic")
TORCH_PORT_OFFSET = 1
JAX_PORT_OFFSET = 2


def parse_master(master):
    host, _, port = (master or "").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise errors.LaunchError(
            "--master must be HOST:PORT, the address of node 0 and a free port "
            f"on it, such as 10.0.0.1:29400. Received: --master {master!r}"
        )
    return host, int(port)


def check_arguments(nproc, nnodes, node_rank):
    if nproc < 1 or nnodes < 1:
        raise errors.LaunchError(
            "--nproc-per-node and --nnodes must be at least 1. Received: "
            f"--nproc-per-node {nproc} --nnodes {nnodes}"
        )
    if not 0 <= node_rank < nnodes:
        raise errors.LaunchError(
            f"--node-rank {node_rank} is out of range for --nnodes {nnodes}: "
            f"use 0 to {nnodes - 1}, node 0 being the one at --master."
        )


def environment(cluster, node_rank, local_rank, master_host, master_port):
    rank = cluster.first_rank(node_rank) + local_rank
    world = cluster.world_size
    return {
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(len(cluster.nodes[node_rank].ports)),
        "MASTER_ADDR": master_host, "MASTER_PORT": str(master_port + TORCH_PORT_OFFSET),
        "TF_CONFIG": json.dumps({"cluster": {"worker": cluster.worker_addresses()},
                                 "task": {"type": "worker", "index": rank}}),
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": f"{master_host}:{master_port + JAX_PORT_OFFSET}",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": str(world),
        "KERAS_DISTRIBUTION_PROCESS_ID": str(rank),
    }


def run(command, nproc, nnodes=1, node_rank=0, master="127.0.0.1:29400"):
    """Starts this node's processes and returns the exit status for the node."""
    check_arguments(nproc, nnodes, node_rank)
    host, port = parse_master(master)
    if not command:
        raise errors.LaunchError("agnostic launch needs a script: agnostic launch "
                                 "--nproc-per-node N train.py [args...]")
    if nnodes == 1:
        party = None
        cluster = rendezvous.Cluster((rendezvous.Node(0, host, rendezvous.free_ports(nproc)),))
    elif node_rank == 0:
        party = rendezvous.Leader(host, port, nnodes, nproc)
        cluster = party.gather()
    else:
        party = rendezvous.Member(host, port, node_rank, nnodes, nproc)
        cluster = party.gather()
    processes = []
    for local_rank in range(nproc):
        env = dict(os.environ, **environment(cluster, node_rank, local_rank, host, port))
        chief = cluster.first_rank(node_rank) + local_rank == 0
        # As on one machine: the chief's output alone; every process's errors.
        processes.append(subprocess.Popen(
            [sys.executable] + list(command), env=env, preexec_fn=local._die_with_parent,
            stdout=None if chief else subprocess.DEVNULL,
        ))
    return _supervise(processes, cluster.first_rank(node_rank), party, node_rank)


def _supervise(processes, first_rank, party, node_rank):
    links = rendezvous.links_of(party) if party is not None else []
    try:
        while True:
            for index, process in enumerate(processes):
                code = process.poll()
                if code not in (None, 0):
                    message = (f"worker process {process.pid} (rank {first_rank + index}, "
                               f"node {node_rank}) exited with status {code}")
                    logger.error("agnostic: %s; stopping every process.", message)
                    _tell(links, message)
                    local.stop_processes(processes)
                    return local.exit_status(code)
            if all(p.poll() == 0 for p in processes):
                _tell(links, None)
                return 0
            notice = _listen(links, timeout=0.2)
            if notice:
                if isinstance(party, rendezvous.Leader):
                    _tell(links, notice)
                logger.error("agnostic: %s; stopping this node's processes.", notice)
                local.stop_processes(processes)
                return 1
    except KeyboardInterrupt:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        _tell(links, f"node {node_rank} was interrupted")
        local.stop_processes(processes)
        return 130


def _tell(links, message):
    for connection, _ in links:
        try:
            rendezvous._send(connection, {"failed": message} if message else {"done": True})
        except OSError:
            pass


def _listen(links, timeout):
    """A failure reported by another node, or a vanished node, else None."""
    if not links:
        time.sleep(timeout)
        return None
    readable, _, _ = select.select([c for c, _ in links], [], [], timeout)
    for connection in readable:
        stream = next(s for c, s in links if c is connection)
        try:
            message = rendezvous._receive(stream)
        except (OSError, ValueError):
            links[:] = [(c, s) for c, s in links if c is not connection]
            return "another node's launcher stopped answering"
        if message.get("failed"):
            return message["failed"]
        links[:] = [(c, s) for c, s in links if c is not connection]  # that node is done
    return None
