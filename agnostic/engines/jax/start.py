"""JAX's set-up as it is imported (agnostic._startup dispatches here by
name): the CPU split into devices, and a job's processes joined
(jax.distributed.initialize) before JAX's backend starts."""
import os

from agnostic import cluster as cluster_lib
from agnostic import errors
from agnostic.cluster import listen
from agnostic.compat import jax_joined
from agnostic.launch import watchdog
from agnostic.plan import per_process


def split(jax, count):
    if count > 1 and jax.config.jax_num_cpu_devices != count:
        jax.config.update("jax_num_cpu_devices", count)


def join(jax, environment):
    # The processes meet before JAX starts its backend, as
    # keras.distribution.initialize would make them, as the plan decides
    # (plan/per_process.py): under SLURM JAX's own detection would give
    # each process one device, while one process per node drives all of the
    # node's.
    # JAX aborts the process when its own bound passes, without naming
    # anyone: a watchdog ends it first, saying who is missing where it can.
    # Process 0's coordinator listens on the job's address (cluster.listen),
    # unless JAX_COORDINATOR_BIND_ADDRESS (JAX's own variable) says where.
    import inspect

    if jax.distributed.is_initialized():
        return
    joining = per_process.joining("jax", environment)
    local_devices = joining.local_device_ids and list(joining.local_device_ids)
    seconds = cluster_lib.join_seconds_at_start()
    size, rank = environment.world_size, environment.rank
    coordinator = joining.coordinator
    options = {}
    if rank == 0 and not os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
        address = listen.local_address(listen.rank_0(environment))
        bind = listen.host_port(address, environment.engine_port)
        # A port another process holds, said before JAX tries it: JAX raises
        # a bare "Failed to start RPC server", or, where the holder shares
        # ports as gRPC servers do (SO_REUSEPORT), waits for its bound.
        holding = listen.held(address, environment.engine_port)
        if holding is not None:
            raise _port_held(bind, size, environment, holding)
        if "coordinator_bind_address" in inspect.signature(
                jax.distributed.initialize).parameters:
            options["coordinator_bind_address"] = bind
    reach = listen.resolved([coordinator])

    def message():
        if rank == 0:
            who = ("process 1 did not arrive" if size == 2 else
                   f"some of processes 1 to {size - 1} did not arrive (JAX does not say which)")
        elif listen.unreachable(reach):
            who = f"process 0's coordinator at {coordinator} does not answer: process 0 is missing"
        else:
            who = (f"process 0's coordinator at {coordinator} answers, but not all of "
                   f"the {size} processes joined it")
        return (f"agnostic: JAX process {rank} of {size} (from {environment.name}) waited "
                f"{seconds} s for the others, so nothing was trained: {who}. Start every "
                "process, check the address and that the port is open between the "
                f"machines, or set {cluster_lib.JOIN_VARIABLE} to wait longer.")

    stop = watchdog.start(seconds, message)
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator, num_processes=size, process_id=rank,
            local_device_ids=local_devices, initialization_timeout=seconds + 10, **options)
        # The program's own join, as Keras's and JAX's guides write it, is this one.
        jax_joined.keep_join(jax, size, rank, environment.name)
    except Exception as error:  # JAX's XlaRuntimeError: said plainly when it is the port
        if rank == 0 and "failed to start rpc server" in str(error).lower():
            where = options.get("coordinator_bind_address", coordinator)
            raise _port_held(where, size, environment, f"JAX said: {error}") from None
        raise
    finally:
        watchdog.stop(stop)


def _port_held(where, size, environment, cause):
    return errors.LaunchError(
        f"agnostic: JAX process 0 of {size} (from {environment.name}) could not "
        f"listen on {where} for the job's coordinator, so nothing was trained: "
        f"another process holds that port ({cause}). The port comes from MASTER_PORT, "
        "or, where it is not set, from the job's id. Set MASTER_PORT to a port that "
        "is free on the first node, the same for every process of the job "
        "(JAX's coordinator takes it, or the one after it under torchrun).")
