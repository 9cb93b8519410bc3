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
"""
from agnostic.compat import versions

_MARK = "_agnostic_serves_once"


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
    recorder = inspect.getsource(tf_context.Context.enable_collective_ops)
    versions.expect(hasattr(tf_context.context(), "_collective_ops_server_def")
                    and "self._collective_ops_server_def = server_def" in recorder,
                    "the eager context recording the collective server's definition in "
                    "_collective_ops_server_def (TensorFlow)")
