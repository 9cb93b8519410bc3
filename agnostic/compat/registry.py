"""Every module of this package, with what it fixes, the engines and Keras
versions it applies to, and its probe: a quick check, on the installed
Keras, that the internals the module relies on are there and behave as it
expects (tests/compat/ runs each probe that applies).

A probe takes the imported `keras` module and returns None, or raises
CompatError naming what moved; `check` runs one and names the entry and the
Keras version in whatever it raises. The engines are imported inside the
probes only: importing this module imports none.
"""
import dataclasses
from typing import Callable, Tuple

from agnostic import errors
from agnostic.compat import (batch_norm_moments, fit_resume, jax_joined, jax_on_batch,
                             jax_uneven_batches, keras_fit, keras_nodes, keras_variables, layer_losses,
                             mxnet_kvstore, optimizer_slices, random_draws,
                             shuffle_order, step_logs, tf_central_metrics, tf_collective_keys,
                             tf_collective_server, tf_first_batch, tf_loss_scaling,
                             tf_on_batch, tf_worker_logs,
                             torch_empty_share, torch_keras_ddp, torch_variables, versions)

# (first, last) of the versions tested, kept in one place (versions.py).
KERAS_3 = (versions.TESTED_KERAS[0], versions.TESTED_KERAS[-1])
KERAS_MXNET = (versions.TESTED_KERAS_MXNET[0], versions.TESTED_KERAS_MXNET[-1])
ENGINES = ("tensorflow", "jax", "torch")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One compat module. `keras`: (first, last) (major, minor) versions,
    both included."""

    name: str
    fixes: str
    engines: Tuple[str, ...]
    keras: Tuple[Tuple[int, int], Tuple[int, int]]
    probe: Callable


ENTRIES = (
    Entry("tf_loss_scaling", "Losses left as one device computes them, and one apply "
          "across replicas, in agnostic's tf.distribute steps.", ("tensorflow",), KERAS_3,
          tf_loss_scaling.probe),
    Entry("tf_first_batch", "The model is built before training from the data's spec, "
          "without reading a batch.", ("tensorflow",), KERAS_3, tf_first_batch.probe),
    Entry("tf_on_batch", "train_on_batch, test_on_batch and predict_on_batch split their "
          "batch over the replicas.", ("tensorflow",), KERAS_3, tf_on_batch.probe),
    Entry("tf_central_metrics", "Metric totals stored once add each device's part once "
          "(tf-central-storage).", ("tensorflow",), KERAS_3, tf_central_metrics.probe),
    Entry("tf_collective_keys", "Each MirroredStrategy numbers its all-reduce groups from "
          "a range of its own.", ("tensorflow",), KERAS_3, tf_collective_keys.probe),
    Entry("tf_collective_server", "A worker's collective runtime is started once, also "
          "where the program makes its own MultiWorkerMirroredStrategy, and waits 100 s "
          "for a late heartbeat.", ("tensorflow",),
          KERAS_3, tf_collective_server.probe),
    Entry("tf_worker_logs", "A step's logs average over the workers whatever their shape "
          "(tf-multi-worker).", ("tensorflow",), KERAS_3, tf_worker_logs.probe),
    Entry("step_logs", "A step of the program's own returning its metrics' results, the "
          "compiled ones nested, reports them over every replica.", ("tensorflow", "torch"),
          KERAS_3, step_logs.probe),
    Entry("layer_losses", "What a layer adds with add_loss is kept by the replica that "
          "added it, in a step over the global batch.", ("tensorflow", "torch"), KERAS_3,
          layer_losses.probe),
    Entry("random_draws", "A layer's draws for its rows are one device's, in a step over "
          "the global batch.", ("tensorflow", "torch"), KERAS_3, random_draws.probe),
    Entry("batch_norm_moments", "BatchNormalization's moments over the global batch, with "
          "one device's formula.", ("tensorflow", "torch"), KERAS_3, batch_norm_moments.probe),
    Entry("torch_empty_share", "A Keras loss over no rows is 0 where a process's share of "
          "the batch is empty.", ("torch",), KERAS_3, torch_empty_share.probe),
    Entry("torch_keras_ddp", "The forward pass runs through DistributedDataParallel where "
          "Keras does not (3.16 does in its own step).", ("torch",), KERAS_3,
          torch_keras_ddp.probe),
    Entry("optimizer_slices", "An optimizer updating a slice of each weight clips and "
          "decays as on the whole weights (torch-sharded).", ("torch",), KERAS_3,
          optimizer_slices.probe),
    Entry("torch_variables", "A split weight's variable gathers it when read and keeps "
          "this process's slice when assigned (torch-sharded).", ("torch",), KERAS_3,
          torch_variables.probe),
    Entry("jax_joined", "The program's own jax.distributed.initialize, where agnostic has "
          "joined the job, is that join.", ("jax",), KERAS_3, jax_joined.probe),
    Entry("jax_on_batch", "train_on_batch and test_on_batch under a keras.distribution "
          "without a sample_weight.", ("jax",), ((3, 13), (3, 14)), jax_on_batch.probe),
    Entry("jax_uneven_batches", "A batch that does not divide over one process's devices "
          "runs whole on each.", ("jax",), KERAS_3, jax_uneven_batches.probe),
    Entry("keras_fit", "Resuming fit at an epoch, fit's own validation, and every nested "
          "layer.", ENGINES, KERAS_3, keras_fit.probe),
    Entry("fit_resume", "fit's train function wrapped to resume within an epoch and to stop "
          "after a step.", ENGINES, KERAS_3, fit_resume.probe),
    Entry("keras_nodes", "agnostic.device() placements recorded per graph node and run in "
          "their device scope.", ENGINES, KERAS_3, keras_nodes.probe),
    Entry("keras_variables", "The user's variables made again where the strategy's scope "
          "puts new ones.", ENGINES, KERAS_3, keras_variables.probe),
    Entry("shuffle_order", "Several processes take fit(shuffle=True)'s samples in one "
          "device's order.", ("jax", "torch"), KERAS_3, shuffle_order.probe),
    Entry("mxnet_kvstore", "keras-mxnet sums the contexts' gradients in the key-value store "
          "agnostic chooses.", ("mxnet",), KERAS_MXNET, mxnet_kvstore.probe),
)


def applies(entry, backend, keras_version):
    """Whether `entry` applies to the engine `backend` and the Keras version
    string `keras_version` (such as "3.16.0.dev2026102704")."""
    version = versions.parts(keras_version)
    first, last = entry.keras
    return backend in entry.engines and version is not None and first <= version <= last


def check(entry, keras):
    """Runs `entry`'s probe on `keras`; raises CompatError naming the entry
    and the Keras version when an internal it relies on has moved (the
    probe's own CompatError, or the AttributeError, ImportError, TypeError
    or AssertionError of a reach that failed)."""
    version = getattr(keras, "__version__", "unknown")
    try:
        entry.probe(keras)
    except errors.CompatError as error:
        raise errors.CompatError(_named(entry, version, str(error))) from error
    except (AttributeError, ImportError, TypeError, AssertionError) as error:
        raise errors.CompatError(_named(
            entry, version, f"an internal it relies on has moved in Keras {version} "
                            f"({type(error).__name__}: {error})")) from error


def _named(entry, version, message):
    if version not in message:
        message = f"{message} (Keras {version})"
    return f"agnostic.compat.{entry.name} ({entry.fixes.rstrip('.')}): {message}"
