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

from agnostic import preemption
from agnostic.launch import local, rendezvous, secret
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
        # Its processes are known by it (agnostic.cluster.agnostic_launch).
        "AGNOSTIC_LAUNCH_NODE_RANK": str(node_rank),
        # torch's store listens where node 0's launcher does (--listen-addr).
        **({"AGNOSTIC_LISTEN_ADDR": cluster.listen_host} if cluster.listen_host else {}),
        # JAX's coordinator (process 0) listens there, not on every interface.
        "JAX_COORDINATOR_BIND_ADDRESS": os.environ.get(
            "JAX_COORDINATOR_BIND_ADDRESS", _host_port(cluster.listen_host or master_host,
                                                       master_port + JAX_PORT_OFFSET)),
    }


def _host_port(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run(command, launch, secret_file=None, listen_addr=None):
    """Starts this node's processes for `command` (what follows `python`:
    a script and its arguments, or -m and a module) with the `Settings`
    `launch`, and returns the exit status for the node. `secret_file` and
    `listen_addr`: --secret-file and --listen-addr, for several nodes."""
    check_command(command)
    preemption.signals()  # a bad AGNOSTIC_PREEMPT_SIGNAL: said before meeting
    party, cluster = _meet(launch, secret_file, listen_addr)
    processes = [_start(command, cluster, launch, local_rank)
                 for local_rank in range(launch.nproc)]
    return _supervise(processes, cluster.first_rank(launch.node_rank), party, launch.node_rank)


def _meet(launch, secret_file=None, listen_addr=None):
    """(the rendezvous party or None, the whole cluster). A single node
    opens no channel; several need the job's secret, checked first."""
    if launch.nnodes == 1:
        node = rendezvous.Node(0, launch.host, rendezvous.free_ports(launch.nproc))
        return None, rendezvous.Cluster((node,))
    job_secret = secret.for_launch(launch.nnodes, secret_file)
    rendezvous.join_seconds()  # a bad AGNOSTIC_JOIN_SECONDS refused before listening
    if launch.node_rank == 0:
        party = rendezvous.Leader(launch.host, launch.port, launch.nnodes, launch.nproc,
                                  job_secret, listen_addr)
    else:
        party = rendezvous.Member(launch.host, launch.port, launch.node_rank,
                                  launch.nnodes, launch.nproc, job_secret)
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
    """Watches this node's processes until they end; returns the node's status.

    SIGTERM (and AGNOSTIC_PREEMPT_SIGNAL) is passed on to them: they stop
    after the same step (agnostic/preemption.py; their collectives carry the
    stop to the other nodes' processes, whose launchers need no message) and
    end with status 128 + the signal's number, which is then this node's: a
    preempted process is no failure, and the others are left to finish
    their step and backup."""
    links = rendezvous.links_of(party) if party is not None else []
    caught = []

    def forward(signum, frame):
        caught.append(signum)
        for process in processes:
            if process.poll() is None:
                try:
                    process.send_signal(signum)
                except OSError:
                    pass

    previous = preemption.handle(forward)
    try:
        while True:
            forwarded = caught[0] if caught else None
            for index, process in enumerate(processes):
                code = process.poll()
                if code not in (None, 0) and not preemption.is_preempted_status(code, forwarded):
                    message = (f"worker process {process.pid} (rank {first_rank + index}, "
                               f"node {node_rank}) exited with status {code}")
                    logger.error("agnostic: %s; stopping every process.", message)
                    _tell(links, message)
                    local.stop_processes(processes)
                    return local.exit_status(code)
            if all(p.poll() is not None for p in processes):  # none failed
                _tell(links, None)
                ended = [p.returncode for p in processes if p.returncode != 0]
                if caught or ended:
                    return preemption.status(caught[0] if caught else _signal_of(ended[0]))
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
    finally:
        preemption.restore(previous)


def _signal_of(code):
    """The signal a preempted process's status names (128 + it, or -it)."""
    return -code if code < 0 else code - 128


def _tell(links, message):
    for link in links:
        try:
            link.send({"failed": message} if message else {"done": True})
        except OSError:
            pass


def _listen(links, timeout):
    """A failure reported by another node, or a vanished node, else None."""
    if not links:
        time.sleep(timeout)
        return None
    readable, _, _ = select.select(links, [], [], timeout)
    for link in readable:
        try:
            messages = link.poll()
        except OSError as error:  # closed, or a line without the secret
            links.remove(link)
            link.close()
            return f"another node's launcher ({link.peer}) stopped answering ({error})"
        for message in messages:
            if message.get("failed"):
                return str(message["failed"])
            if message.get("done"):  # that node is done
                links.remove(link)
                link.close()
                break
    return None
