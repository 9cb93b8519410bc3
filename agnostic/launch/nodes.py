"""`agnostic launch`: the processes of one node, with each engine's own
distributed runtime configured through its own variables:

- torch: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (as torchrun);
- TensorFlow: TF_CONFIG for MultiWorkerMirroredStrategy;
- JAX: KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES, _PROCESS_ID, read by
  `keras.distribution.initialize` (which calls `jax.distributed.initialize`).

The launcher runs no training itself: it checks what it was asked (before
meeting the other nodes), then starts, watches, stops, and restarts up to
--max-restarts times. Where the processes' output goes: launch/output.py.
"""
import json
import logging
import os
import select
import shutil
import signal
import sys
import tempfile
import time

from agnostic import devices
from agnostic.resume import preemption
from agnostic.cluster.listen import host_port
from agnostic.launch import output, processes, rendezvous, secret, stalls
from agnostic.launch.address import JAX_PORT_OFFSET, TORCH_PORT_OFFSET
from agnostic.launch.settings import check_command

logger = logging.getLogger("agnostic")


def environment(cluster, node_rank, local_rank, master_host, master_port):
    rank = cluster.first_rank(node_rank) + local_rank
    world = cluster.world_size
    here = len(cluster.nodes[node_rank].ports)
    return {
        # This node's processes share its cores, unless the user chose.
        **devices.thread_variables(here),
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(here),
        "MASTER_ADDR": master_host, "MASTER_PORT": str(master_port + TORCH_PORT_OFFSET),
        "TF_CONFIG": json.dumps({"cluster": {"worker": cluster.worker_addresses()},
                                 "task": {"type": "worker", "index": rank}}),
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": host_port(master_host,
                                                      master_port + JAX_PORT_OFFSET),
        "KERAS_DISTRIBUTION_NUM_PROCESSES": str(world),
        "KERAS_DISTRIBUTION_PROCESS_ID": str(rank),
        # Its processes are known by it (agnostic.cluster.agnostic_launch).
        "AGNOSTIC_LAUNCH_NODE_RANK": str(node_rank),
        # torch's store listens where node 0's launcher does (--listen-addr).
        **({"AGNOSTIC_LISTEN_ADDR": cluster.listen_host} if cluster.listen_host else {}),
        # JAX's coordinator (process 0) listens there, not on every interface.
        "JAX_COORDINATOR_BIND_ADDRESS": os.environ.get(
            "JAX_COORDINATOR_BIND_ADDRESS", host_port(cluster.listen_host or master_host,
                                                      master_port + JAX_PORT_OFFSET)),
    }


def run(command, launch, secret_file=None, listen_addr=None):
    """Starts this node's processes for `command` (what follows `python`:
    a script and its arguments, or -m and a module) with the `Settings`
    `launch`, and returns the exit status for the node. `secret_file` and
    `listen_addr`: --secret-file and --listen-addr, for several nodes.

    When a process fails and --max-restarts allows, every process of the
    node is stopped and started again (torchrun's TORCHELASTIC_RESTART_COUNT
    says which attempt); a script with BackupAndRestore resumes from its backup."""
    check_command(command)
    preemption.signals()  # a bad AGNOSTIC_PREEMPT_SIGNAL: said before meeting
    stall = stalls.stall_seconds()  # and a bad AGNOSTIC_STALL_SECONDS
    party, cluster = _meet(launch, secret_file, listen_addr)
    first = cluster.first_rank(launch.node_rank)
    ranks = [(first + local_rank, local_rank) for local_rank in range(launch.nproc)]
    logs = _log_folder(launch, ranks)
    attempts = launch.max_restarts + 1
    try:
        for attempt in range(attempts):
            if attempt:  # one node: fresh ports for TensorFlow's workers
                party, cluster = _meet(launch, secret_file, listen_addr)
            streams = output.Streams(launch.output, logs and os.path.join(
                logs.path, f"attempt_{attempt}"))
            finished = tempfile.mkdtemp(prefix="agnostic-finished-")
            try:
                status, failure = _supervise(
                    lambda local_rank: _start(command, cluster, launch, local_rank, streams,
                                              attempt, finished),
                    launch.nproc, first, party, launch.node_rank, finished, stall)
            finally:
                streams.close()
                shutil.rmtree(finished, ignore_errors=True)
            if failure is None:
                return status
            if attempt + 1 < attempts:
                logger.error("agnostic launch: %s; restarting every process of this node: "
                             "attempt %d of %d (--max-restarts %d).", failure,
                             attempt + 2, attempts, launch.max_restarts)
                continue
            tried = (f" on attempt {attempts} of {attempts} (--max-restarts "
                     f"{launch.max_restarts} used up)" if launch.max_restarts else "")
            logger.error("agnostic launch: %s%s; stopping every process.", failure, tried)
            return status
    finally:
        if logs:
            logs.finish()
            kept = logs.kept()
            if kept:
                logger.warning("agnostic launch: %s; --log-dir DIR chooses the folder.", kept)


def _log_folder(launch, ranks):
    """The run's log folder (--log-dir's said at the start; a temporary one
    at the end, if kept); None when no file is needed."""
    if not output.needs_folder(launch.output, ranks):
        return None
    folder = output.Folder(launch.output, launch.run_id)
    if not folder.temporary:
        notice = folder.notice(launch.output, ranks, os.path.join("attempt_<n>", "rank_<r>"))
        logger.warning("agnostic launch: %s.", notice)
    return folder


def _meet(launch, secret_file=None, listen_addr=None):
    """(the rendezvous party or None, the whole cluster). A single node
    opens no channel; several need the job's secret, checked first."""
    if launch.nnodes == 1:
        node = rendezvous.Node(0, launch.host, processes.free_ports(launch.nproc))
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


def _start(command, cluster, launch, local_rank, streams, attempt=0, finished=None):
    variables = environment(cluster, launch.node_rank, local_rank, launch.host, launch.port)
    # As torchrun says them (not TORCHELASTIC_RUN_ID: agnostic would take the
    # processes for torchrun's).
    variables.update(TORCHELASTIC_RESTART_COUNT=str(attempt),
                     TORCHELASTIC_MAX_RESTARTS=str(launch.max_restarts))
    if finished:  # where a worker says it finished its work (processes.mark_finished)
        variables[processes.FINISHED_VARIABLE] = finished
        # and beats (launch/stalls.py), unless AGNOSTIC_STALL_SECONDS=0
        variables[stalls.FOLDER_VARIABLE] = finished
    rank = cluster.first_rank(launch.node_rank) + local_rank
    return streams.popen(rank, local_rank, [sys.executable] + list(command),
                         env=secret.withheld(dict(os.environ, **variables)),
                         preexec_fn=processes.die_with_parent)


def _supervise(start, count, first_rank, party, node_rank, finished=None, stall=0):
    """Starts this node's `count` processes (`start(local_rank)`) and watches
    them until they end; returns the node's status and, when one of them
    failed, what failed (else None). A process killed
    by a signal after it said in `finished` that its work was done (torch's
    gloo threads can abort a process in the interpreter's teardown) ended well.

    SIGTERM (and AGNOSTIC_PREEMPT_SIGNAL) is passed on to them: they stop
    after the same step (agnostic/resume/preemption.py; their collectives carry the
    stop to the other nodes' processes, whose launchers need no message) and
    end with status 128 + the signal's number, which is then this node's: a
    preempted process is no failure, and the others are left to finish
    their step and backup. The signal is handled from before the first
    process starts: one that comes while they start reaches each of them.

    A process silent for `stall` seconds (its heartbeats in `finished`) is
    ended and named, as a failure (launch/stalls.py)."""
    links = rendezvous.links_of(party) if party is not None else []
    caught, started = [], processes.Processes(finished, stall)

    def forward(signum, frame):
        caught.append(signum)
        started.send(signum)

    previous = preemption.handle(forward)
    try:
        for local_rank in range(count):
            started.add(first_rank + local_rank, start(local_rank))
            if caught:  # it came before this one was in the list
                started.send(caught[0], [first_rank + local_rank])
        outcome = started.supervise(lambda: caught[0] if caught else None,
                                    wait=lambda seconds: _listen(links, seconds))
        if outcome.kind == "notice":
            if isinstance(party, rendezvous.Leader):
                _tell(links, outcome.notice)
            logger.error("agnostic: %s; stopping this node's processes.", outcome.notice)
            started.stop()
            return 1, None
        if outcome.kind == "ended":  # none failed
            _tell(links, None)
            ended = [code for code in map(started.code, started.by_rank) if code != 0]
            if caught or ended:
                return preemption.status(caught[0] if caught else _signal_of(ended[0])), None
            return 0, None
        pid = started.by_rank[outcome.rank].pid
        if outcome.kind == "silent":
            message = (f"worker process {pid} (rank {outcome.rank}, node {node_rank}) "
                       f"{outcome.silent.summary(stall)}")
            status = 1
        else:
            status = started.code(outcome.rank)
            message = (f"worker process {pid} (rank {outcome.rank}, node {node_rank}) "
                       f"exited with status {status}")
            status = processes.exit_status(status)
        _tell(links, message)
        started.stop()
        return status, message
    except KeyboardInterrupt:
        started.send(signal.SIGINT)
        _tell(links, f"node {node_rank} was interrupted")
        started.stop()
        return 130, None
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
