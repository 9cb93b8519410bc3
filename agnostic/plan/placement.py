"""Device parallelism: `agnostic.device(i)` records the device of each layer
call made under it while a functional model is built (the legacy guides'
`with tf.device('/gpu:1'): encoded_b = shared_lstm(input_b)`), and
`decide` turns a model's placements into a plan.

TensorFlow and torch run each recorded call on its device, with each
layer's variables on the device of its first call; JAX compiles one program
for all its devices, so the placed layers are laid out over the placed
devices instead (keras.distribution.ModelParallel).
"""
import contextlib
import dataclasses
import warnings
import weakref
from typing import Iterator, Union

from agnostic import errors

HOST = "cpu"
# The strategy that runs placements on each engine.
DEVICE_PARALLEL = {
    "tensorflow": "tf-device-parallel",
    "torch": "torch-device-parallel",
    "jax": "jax-model-parallel",
}
_PLACED = weakref.WeakKeyDictionary()  # graph node -> device id or HOST


@contextlib.contextmanager
def device(device_id: Union[int, str]) -> Iterator[None]:
    """Runs the layer calls made inside on device `device_id`.

    Use it while building a functional model; `backend_agnostic_compile`
    reads the placements and trains each call on its device.

    Args:
        device_id: a device id, as in `gpus` (0 for the first accelerator,
            or the first simulated CPU device), or "cpu" for the host.

    Example:
        >>> with agnostic.device(0):
        ...     encoded_a = shared_lstm(input_a)
        >>> with agnostic.device(1):
        ...     encoded_b = shared_lstm(input_b)
        >>> with agnostic.device("cpu"):
        ...     merged = keras.layers.concatenate([encoded_a, encoded_b])
    """
    _check_device_id(device_id)
    from agnostic import devices as devices_lib

    if devices_lib.current_backend() == "mxnet":
        warnings.warn(
            f"agnostic.device({device_id!r}) is ignored on MXNet: keras-mxnet binds the "
            "whole model to one list of contexts, so a layer cannot run on a device of "
            "its own. The model trains as without it (data parallelism over "
            "`gpus`); to place layers, use KERAS_BACKEND=tensorflow, torch or jax.",
            errors.PlacementWarning, stacklevel=3,
        )
        yield
        return
    from agnostic.compat import keras_nodes

    keras_nodes.check()
    with keras_nodes.recording(lambda node: _PLACED.__setitem__(node, device_id)):
        yield


def _check_device_id(device_id):
    if device_id == HOST or (isinstance(device_id, int) and not isinstance(device_id, bool)
                             and device_id >= 0):
        return
    raise errors.DeviceRequestError(
        "agnostic.device() takes a device id, as `gpus` does (0, 1, ...), or "
        f"'cpu' for the host. Received: device_id={device_id!r}"
    )


def requested(model):
    """The model's placed calls in the order its call runs them: a tuple of
    (call label, device id or "cpu"); empty for a model built without
    agnostic.device(), and for no model (None)."""
    if not _PLACED or model is None:
        return ()
    from agnostic.compat import keras_nodes

    if any(node in _PLACED for node in keras_nodes.nodes_outside_the_graph(model)):
        raise errors.NotSupportedError(
            f"The layers of this {type(model).__name__} were called under "
            "agnostic.device(), and only functional models keep those calls: "
            "Keras calls a Sequential's layers again as they are added, and a "
            "subclassed model's in its own call. Build it with the functional API "
            "(keras.Input, then call each layer, then keras.Model(inputs, outputs))."
        )
    return tuple((label, _PLACED[node]) for label, node in keras_nodes.ordered_calls(model)
                 if node in _PLACED)


def first_devices(calls, placements):
    """{layer name: device name of its first placed call}, of a model's
    `calls` (keras_nodes.ordered_calls): where each placed layer keeps its
    variables, as TensorFlow keeps them where it made them."""
    placed, first = dict(placements), {}
    for label, node in calls:
        if label in placed:
            first.setdefault(node.operation.name, placed[label])
    return first


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where the placements run: `devices` in the plan's order (the first
    replica's first), how many data-parallel `replicas` of them, and the
    warning to give, if any."""

    devices: tuple
    replicas: int
    reason: str
    warning: str = None
    processes: int = 1  # torch: one per replica
    rank: int = 0


def decide(backend, listing, gpus, environment, placements):
    """The devices that run a model's `placements` (see requested) on
    `backend`, or raises before anything starts."""
    from agnostic import devices as devices_lib

    found = listing.devices
    labels = {}
    for label, device_id in placements:
        labels.setdefault(device_id, label)
    missing = sorted(i for i in labels if i != HOST and i >= len(found))
    if missing:
        raise errors.DeviceRequestError(
            f"agnostic.device({missing[0]}) places the call {labels[missing[0]]!r} on "
            f"device id {missing[0]}, which does not exist. The devices are "
            f"{devices_lib.device_names(found)} (ids 0 to {len(found) - 1}).{devices_lib.cpu_hint(listing)}"
        )
    world = environment.world_size if environment is not None else listing.num_processes
    if world > 1 and backend != "torch":
        raise errors.NotSupportedError(
            f"This model places its layers with agnostic.device(), and this process is one "
            f"of {world} that train together. On {backend}, device parallelism runs in one "
            "process; combining it with data parallelism over processes is supported on "
            "torch only so far. Start one process, or build the model without "
            "agnostic.device() to train data-parallel over every process."
        )
    chosen = devices_lib.choose(found, gpus, listing)
    ids = sorted(i for i in labels if i != HOST)
    outside = [i for i in ids if found[i] not in chosen]
    if outside:
        raise errors.DeviceRequestError(
            f"agnostic.device({outside[0]}) places the call {labels[outside[0]]!r} on device "
            f"id {outside[0]}, which gpus={gpus!r} leaves out. Pass gpus=None, or a "
            "list of device ids that includes every placed one."
        )
    placed = [found[i] for i in ids]
    spare = [name for name in chosen if name not in placed]
    if backend == "jax":
        return _jax_layout(gpus, placed, spare, HOST in labels)
    if backend == "torch":
        return _torch_layout(listing, gpus, placed, spare, environment)
    host = [listing.host] if HOST in labels and listing.host not in placed else []
    reason = f"{len(placements)} placed call(s) on {len(placed) + len(host)} device(s)."
    warning = None
    if spare:
        if gpus is not None:
            raise errors.NotSupportedError(
                f"gpus={gpus!r} asks for {len(chosen)} devices, and the model's "
                f"agnostic.device() placements use {len(placed)} (ids {_ids(ids)}). Combining "
                f"device parallelism with data parallelism is not supported on {backend} "
                f"yet (on JAX and torch it is). Pass gpus=None or gpus={ids!r}."
            )
        warning = (
            f"The model's agnostic.device() placements use device ids {_ids(ids)}; "
            f"{', '.join(spare)} stay idle: combining device parallelism with data "
            f"parallelism is not supported on {backend} yet (on JAX and torch it is)."
        )
        reason += " Idle: " + ", ".join(spare) + "."
    return Layout(tuple(placed + host), 1, reason, warning)


def _replicas(gpus, placed, spare, world=None):
    """Replicas of the placed devices over the others, as many as they hold
    (or `world`, one per process of a job): (devices in replica order, the
    number of replicas, the devices left idle, the devices per replica)."""
    size = max(1, len(placed))
    if not placed:  # only 'cpu' placements: one device per replica
        placed, spare = [spare[0]], spare[1:]
    total = len(placed) + len(spare)
    replicas = total // size if world is None else world
    if replicas * size > total:
        raise errors.DeviceRequestError(
            f"This process is one of {world} processes, each training a replica of the "
            f"model's {size} placed devices: {world * size} devices are needed, and this "
            f"process sees {total}. Start {total // size} process(es), or make more "
            "devices visible to each."
        )
    idle = spare[(replicas - 1) * size:]
    if idle and gpus is not None and world is None:
        raise errors.DeviceRequestError(
            f"gpus={gpus!r} gives {total} devices, which do not split into replicas of "
            f"the {size} placed devices. Pass a multiple of {size}."
        )
    return tuple(placed + spare[:(replicas - 1) * size]), replicas, idle, size


def _torch_layout(listing, gpus, placed, spare, environment):
    """torch: one process per replica of the placed devices."""
    world = environment.world_size if environment is not None else None
    devices, replicas, idle, size = _replicas(gpus, placed, spare, world)
    reason = f"{replicas} replica(s) x {size} device(s), one process per replica."
    if not listing.accelerators:
        reason += " On CPU devices every placement runs on the one CPU torch has."
    warning = None
    if idle:
        warning = (f"The model's agnostic.device() placements use {size} device(s) per "
                   f"replica; {', '.join(idle)} stay idle.")
    rank = environment.rank if environment is not None else 0
    return Layout(devices, replicas, reason, warning, processes=replicas, rank=rank)


def _jax_layout(gpus, placed, spare, on_host):
    """JAX: a mesh of (replicas, placed devices), as many replicas as the
    chosen devices hold."""
    devices, replicas, idle, size = _replicas(gpus, placed, spare)
    placed = list(devices[:size])
    reason = (f"{replicas} replica(s) x {size} device(s): the placed layers' variables "
              "laid out over the placed devices of each replica.")
    warning = (
        "JAX compiles one program for all its devices and cannot keep a layer on one "
        f"device of it: the layers placed with agnostic.device() are laid out over "
        f"{', '.join(placed)} instead (their kernels split along the last axis where it "
        "divides, else copied), which spreads their memory and work over the same devices."
    )
    if on_host:
        warning += (" Layers placed on 'cpu' are laid out the same way: a JAX program "
                    "does not run parts of itself on the host.")
    if idle:
        warning += f" Idle: {', '.join(idle)}."
    return Layout(devices, replicas, reason, warning)


def describe(backend, listing):
    """What agnostic.device(i) means on `backend` with these devices."""
    from agnostic import devices as devices_lib

    strategy = DEVICE_PARALLEL.get(backend)
    if strategy is None:
        return f"agnostic.device() placements are ignored on {backend}"
    last = len(listing.devices) - 1
    ids = "0" if last == 0 else f"0 to {last}"
    said = (f"agnostic.device(i), i in {ids}, runs a layer call on device i "
            f"({devices_lib.device_names(listing.devices)}), agnostic.device('cpu') on {listing.host}; "
            f"strategy {strategy}")
    if backend == "jax":
        said += " (the placed layers laid out over the placed devices)"
    return said


def _ids(ids):
    return ", ".join(str(i) for i in ids)
