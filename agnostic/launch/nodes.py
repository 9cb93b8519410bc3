"""`agnostic launch`: the processes of one node, with each engine's own
distributed runtime configured through its own variables:

- torch: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (as torchrun);
- TensorFlow: TF_CONFIG for MultiWorkerMirroredStrategy;
- JAX: KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES, _PROCESS_ID, read by
  `keras.distribution.initialize` (which calls `jax.distributed.initialize`).

The launcher runs no training itself: it checks what it was asked (before
meeting the other nodes), then starts, watches and stops.
"""
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time

from agnostic.launch import local, rendezvous
from agnostic.launch.settings import JAX_PORT_OFFSET, TORCH_PORT_OFFSET, check_command

logger = logging.getLogger("agnostic")


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


def run(command, launch):
    """Starts this node's processes for `command` (what follows `python`:
    a script and its arguments, or -m and a module) with the `Settings`
    `launch`, and returns the exit status for the node."""
    check_command(command)
    party, cluster = _meet(launch)
    processes = [_start(command, cluster, launch, local_rank)
                 for local_rank in range(launch.nproc)]
    return _supervise(processes, cluster.first_rank(launch.node_rank), party, launch.node_rank)


def _meet(launch):
    """(the rendezvous party or None, the whole cluster)."""
    if launch.nnodes == 1:
        node = rendezvous.Node(0, launch.host, rendezvous.free_ports(launch.nproc))
        return None, rendezvous.Cluster((node,))
    if launch.node_rank == 0:
        party = rendezvous.Leader(launch.host, launch.port, launch.nnodes, launch.nproc)
    else:
        party = rendezvous.Member(launch.host, launch.port, launch.node_rank,
                                  launch.nnodes, launch.nproc)
    return party, party.gather()


def _start(command, cluster, launch, local_rank):
    variables = environment(cluster, launch.node_rank, local_rank, launch.host, launch.port)
    chief = cluster.first_rank(launch.node_rank) + local_rank == 0
    # As on one machine: the chief's output alone; every process's errors.
    return subprocess.Popen(
        [sys.executable] + list(command), env=dict(os.environ, **variables),
        preexec_fn=local._die_with_parent, stdout=None if chief else subprocess.DEVNULL,
    )


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
