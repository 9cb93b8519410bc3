"""The program's own `jax.distributed.initialize` in a process agnostic has
joined to its job.

agnostic joins a JAX process to its job as JAX is imported (agnostic/
_startup.py), and a program written from Keras's or JAX's guides to several
processes starts with the same join: `keras.distribution.initialize()`
(which calls `jax.distributed.initialize`) or `jax.distributed.initialize()`
itself. JAX 0.10 refuses a second call ("distributed.initialize should only
be called once"), so the unchanged program failed where agnostic had joined.

`keep_join` makes a later call for this very job (the same number of
processes and this process's id, where the call gives them; a call that
gives neither, as under SLURM, asks JAX to find the job agnostic found)
return without doing anything, and one for another job a clear error. The
change is made on `jax.distributed`, only in a process agnostic has joined.
"""
import functools

from agnostic import errors
from agnostic.compat import versions

_MARK = "_agnostic_keeps_join"


def keep_join(jax, size, rank, source):
    """From now on this process's `jax.distributed.initialize` takes a call
    for its job of `size` processes, as process `rank` (joined from
    `source`, a scheduler's name), as done."""
    distributed = jax.distributed
    initialize = distributed.initialize
    if getattr(initialize, _MARK, False):
        return

    @functools.wraps(initialize)
    def initialize_once(coordinator_address=None, num_processes=None, process_id=None,
                        *arguments, **options):
        if not distributed.is_initialized():
            return initialize(coordinator_address, num_processes, process_id,
                              *arguments, **options)
        if num_processes not in (None, size) or process_id not in (None, rank):
            raise errors.LaunchError(
                f"jax.distributed.initialize was called as process {process_id} of "
                f"{num_processes}, and agnostic had already joined this process to its job "
                f"as process {rank} of {size} (from {source}), as JAX was imported. Give "
                "the program the job's own values, or none (agnostic's join stands), or "
                "set AGNOSTIC_JOIN=0 so that agnostic joins nothing.")
        return None

    setattr(initialize_once, _MARK, True)
    distributed.initialize = initialize_once


def probe(keras):
    """What `keep_join` relies on (agnostic/compat/registry.py): JAX's
    initialize takes the coordinator, the number of processes and this
    process's id first, and says whether it has run; Keras's initialize
    calls it through `jax.distributed`."""
    import inspect

    import jax
    from keras.src.backend.jax import distribution_lib

    names = list(inspect.signature(jax.distributed.initialize).parameters)[:3]
    versions.expect(names == ["coordinator_address", "num_processes", "process_id"]
                    and callable(getattr(jax.distributed, "is_initialized", None)),
                    "jax.distributed.initialize(coordinator_address, num_processes, "
                    "process_id, ...) and jax.distributed.is_initialized (JAX)")
    versions.expect("jax.distributed.initialize(" in inspect.getsource(
                    distribution_lib.initialize),
                    "keras.distribution.initialize calling jax.distributed.initialize")
