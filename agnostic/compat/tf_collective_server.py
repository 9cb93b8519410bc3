"""One collective runtime per TensorFlow worker process.

Each MultiWorkerMirroredStrategy that TensorFlow 2.21 makes in eager mode
starts the process's collective runtime with `enable_collective_ops`: the
first one starts the worker's server, a later one (agnostic's, made as the
worker joins its job, beside the one the program makes itself, as Ray's and
TensorFlow's guides do) starts it again over the running server. A worker
whose first all-reduce reached this process before that second start waits
for ever: its request went to the runtime that was replaced (measured: the
chief 6 s late to its second strategy, the other worker never returns).

`serve_once` keeps the runtime that serves the job: once this process's
runtime serves a cluster, starting it again for the same cluster, task and
protocol does nothing. A server definition that differs still goes to
TensorFlow. The change is made on this process's context object, only in a
worker that agnostic joined to a job.

`patient_heartbeats`: the strategy also starts TensorFlow's coordination
service, which ends the whole job when a worker's heartbeat is 10 s late
(its default). A worker that is alive but starved of CPU for that long (a
busy host, a paused process) then ends a job that would have gone on: seen
on a 2-core machine under load, a worker's step aborted with "Task ...
heartbeat timeout" by a chief that was still running. Agnostic's workers
wait 100 s, the bound JAX's coordination service (the same service) uses
by default. The change lasts while agnostic makes its strategy: the service
is configured once per process, by the first strategy.
"""
import contextlib

from agnostic.compat import versions

_MARK = "_agnostic_serves_once"
# How long a worker's heartbeats may be late before the job ends: JAX's
# default (jax.distributed.initialize(heartbeat_timeout_seconds=100)).
HEARTBEAT_SECONDS = 100


def serve_once():
    """From now on, this process's collective runtime is started once for
    a given cluster and task (see the module's docstring)."""
    from tensorflow.python.eager import context as tf_context

    context = tf_context.context()
    if getattr(context, _MARK, False):
        return
    start = context.enable_collective_ops

    def enable_collective_ops(server_def):
        current = getattr(context, "_collective_ops_server_def", None)
        if current is not None and same_server(current, server_def):
            return
        start(server_def)

    context.enable_collective_ops = enable_collective_ops
    setattr(context, _MARK, True)


@contextlib.contextmanager
def patient_heartbeats(seconds=HEARTBEAT_SECONDS):
    """While it lasts, the coordination service a strategy configures waits
    `seconds` for a worker's late heartbeat, where the strategy leaves
    TensorFlow's default (see the module's docstring)."""
    from tensorflow.python.eager import context as tf_context

    context = tf_context.context()
    configure = context.configure_coordination_service

    def configure_coordination_service(service_type, *args, **kwargs):
        if not kwargs.get("heartbeat_timeout_in_ms"):
            kwargs["heartbeat_timeout_in_ms"] = int(seconds * 1000)
        return configure(service_type, *args, **kwargs)

    context.configure_coordination_service = configure_coordination_service
    try:
        yield
    finally:
        del context.configure_coordination_service  # the class's own again


def same_server(first, second):
    """Whether two ServerDefs describe the same worker of the same cluster."""
    return (first.cluster == second.cluster and first.job_name == second.job_name
            and first.task_index == second.task_index and first.protocol == second.protocol)


def probe(keras):
    """What `serve_once` relies on (agnostic/compat/registry.py): the
    strategy starts the runtime through `context.context().enable_collective_ops`,
    which records the server's definition in `_collective_ops_server_def`."""
    import inspect

    from tensorflow.python.distribute import collective_all_reduce_strategy as strategies
    from tensorflow.python.eager import context as tf_context

    source = inspect.getsource(strategies.CollectiveAllReduceExtended._initialize_multi_worker)
    versions.expect("context.context().enable_collective_ops(server_def)" in source,
                    "MultiWorkerMirroredStrategy starting the collective runtime through "
                    "context.enable_collective_ops (TensorFlow)")
    versions.expect("context.context().configure_coordination_service(" in source
                    and "context.context().coordination_service is None" in source,
                    "MultiWorkerMirroredStrategy configuring the coordination service "
                    "through context.configure_coordination_service, once (TensorFlow)")
    parameters = inspect.signature(tf_context.Context.configure_coordination_service).parameters
    versions.expect("heartbeat_timeout_in_ms" in parameters,
                    "Context.configure_coordination_service(heartbeat_timeout_in_ms=...) "
                    "(TensorFlow)")
    recorder = inspect.getsource(tf_context.Context.enable_collective_ops)
    versions.expect(hasattr(tf_context.context(), "_collective_ops_server_def")
                    and "self._collective_ops_server_def = server_def" in recorder,
                    "the eager context recording the collective server's definition in "
                    "_collective_ops_server_def (TensorFlow)")
