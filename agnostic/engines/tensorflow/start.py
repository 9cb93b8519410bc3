"""TensorFlow's set-up as it is imported (agnostic._startup dispatches here
by name): the CPU split into logical devices, and a job's workers joined in
one MultiWorkerMirroredStrategy, made before TensorFlow's runtime starts."""
from agnostic import cluster as cluster_lib
from agnostic import errors
from agnostic.cluster import listen
from agnostic.compat import tf_collective_server
from agnostic.launch import watchdog
from agnostic.plan import per_process

# The workers' strategy, made as TensorFlow is imported: the strategy (or
# the error that prevented it) under "strategy" / "error".
WORKERS = {}


def split(tf, count):
    cpus = tf.config.list_physical_devices("CPU")
    configured = len(tf.config.get_logical_device_configuration(cpus[0]) or ())
    if count > 1 and configured != count:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * count
        )


def join(tf, environment):
    # The strategy configures the engine's collective runtime, which
    # TensorFlow accepts only before it has run anything: the user's script
    # builds its model before calling backend_agnostic_compile.
    if WORKERS:
        return
    try:
        workers = worker_addresses(environment)
    except errors.LaunchError as error:
        WORKERS["error"] = error
        return
    # The engine waits, without limit, until every worker has started: at
    # the bound, the workers whose servers do not answer are named.
    seconds = cluster_lib.join_seconds_at_start()
    others = listen.resolved([a for r, a in enumerate(workers) if r != environment.rank])

    def message():
        missing = listen.unreachable(others)
        named = ", ".join(f"worker {workers.index(a)} at {a}" for a in missing[:20])
        return (
            f"agnostic: TensorFlow worker {environment.rank} of {len(workers)} (from "
            f"{environment.name}) did not reach every worker within {seconds} s, so "
            "nothing was trained. " + (
                f"Not answering: {named}{', ...' if len(missing) > 20 else ''}. "
                if missing else f"Every worker's port answers ({', '.join(workers)}), but "
                "not every worker joined. ") +
            "Start every worker (or use `agnostic launch`, which starts them together), "
            "check the addresses and that their ports are open, or set "
            f"{cluster_lib.JOIN_VARIABLE} to wait longer.")

    stop = watchdog.start(seconds, message)
    try:
        # One collective runtime in this process, also where the program
        # makes its own strategy for the same workers before or after this one.
        tf_collective_server.serve_once()
        # Every process is a worker, the chief first: a TFJob's chief too.
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": workers}), task_type="worker",
            task_id=environment.rank, rpc_layer="grpc")
        with tf_collective_server.patient_heartbeats():
            WORKERS["strategy"] = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver)
    except Exception as error:  # the engine raises several types here
        WORKERS["error"] = error
    finally:
        watchdog.stop(stop)


def worker_addresses(environment):
    """Each worker's HOST:PORT, in rank order, as the plan decides them
    (plan/per_process.py), the hosts shared through torchrun's store where
    only it knows them."""
    joining = per_process.joining("tensorflow", environment)
    if joining.workers is not None:
        return list(joining.workers)
    from agnostic.cluster import torchrun

    hosts = torchrun.exchange_hosts(environment, cluster_lib.join_seconds_at_start())
    return list(per_process.addressed(hosts, environment))
