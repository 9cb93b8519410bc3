"""The decision: which strategy, on which devices, and why. Starts nothing."""
import dataclasses
from typing import TYPE_CHECKING, Optional, Sequence, Tuple, Union

from agnostic import _startup, cluster, errors
from agnostic import devices as devices_lib
from agnostic.plan import per_process, placement, shards
from agnostic.plan.per_process import PROCESS_PER_DEVICE
from agnostic.plan.request import check_gpus_type, whole_numbers

if TYPE_CHECKING:  # for type checkers only: importing agnostic imports no engine
    import keras

SINGLE_DEVICE = "single-device"
# The strategy that spreads one engine over several devices. An engine that is
# not here trains on one device with a SingleDeviceWarning.
MULTI_DEVICE = {
    "tensorflow": "tf-mirrored",
    "jax": "jax-data-parallel",
    "mxnet": "mxnet-context",
    "torch": "torch-ddp",
}
# TensorFlow's other runtimes, named for what runs: several workers (each
# process a worker of MultiWorkerMirroredStrategy), or the variables kept once
# on the CPU (cpu_relocation=True: CentralStorageStrategy).
TF_MULTI_WORKER = "tf-multi-worker"
TF_CENTRAL_STORAGE = "tf-central-storage"
# Why cpu_relocation=True changes nothing with a strategy.
NOT_RELOCATED = {
    SINGLE_DEVICE: "the one device already holds the only copy of the variables",
    TF_MULTI_WORKER: "each TensorFlow worker keeps its own copy of the variables",
    "jax-data-parallel": "keras.distribution keeps the variables on every device",
    "torch-ddp": "each process keeps its own copy of the variables on its device",
    "mxnet-context": "keras-mxnet keeps the parameters on every context",
}
# Said in the plan's reason, so that the log carries it.
NOTES = {
    "mxnet": (
        " MXNet is retired upstream (keras-mxnet 2.2.4.3 and mxnet 1.9.1 are "
        "the last releases); this path keeps existing keras-mxnet code working."
    ),
}
NO_ENVIRONMENT = "none"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What `backend_agnostic_compile` will do, decided before anything is built.

    Example:
        >>> plan = agnostic.resolve(gpus=2)
        >>> plan.strategy, plan.devices
        ('tf-mirrored', ('/device:GPU:0', '/device:GPU:1'))
    """

    backend: str
    strategy: str
    devices: Tuple[str, ...]
    num_replicas: int
    num_processes: int = 1
    process_id: int = 0
    reason: str = ""
    # The multi-process job this process is part of (agnostic.cluster), by
    # name: "slurm", "torchrun", "tf-config"...; "none" for a plain process.
    environment: str = NO_ENVIRONMENT
    # single-device on a device that is not the engine's default (gpus=[2]
    # on torch): the model is rebuilt in the engine's device scope.
    device_scope: bool = False
    # The warning to give when this plan is used, if any (not part of equality).
    fallback_warning: Optional[str] = dataclasses.field(
        default=None, compare=False, repr=False
    )
    # Why cpu_relocation=True, asked for, changes nothing here (else None).
    relocation_unused: Optional[str] = dataclasses.field(
        default=None, compare=False, repr=False
    )
    # Device parallelism: (call label, device name) for each call placed
    # with agnostic.device(), in the order the model runs them.
    placements: Tuple[Tuple[str, str], ...] = ()
    # Why the placements do not run as written, if so (not part of equality).
    placement_warning: Optional[str] = dataclasses.field(
        default=None, compare=False, repr=False
    )
    # The intra-op threads agnostic gives each process of this machine (torch,
    # several processes, the user chose none), else None; and why, said in
    # the plan line (the user's OMP_NUM_THREADS, cores shared, ...).
    threads: Optional[int] = dataclasses.field(default=None, compare=False)
    threads_reason: str = dataclasses.field(default="", compare=False, repr=False)
    # The job this process belongs to (an agnostic.cluster.Environment, found
    # once, here), or None: then the processes a strategy needs, if several,
    # are started by agnostic (torch-ddp) at the compile line, this process
    # rank 0, each on its device index (LOCAL_RANK) of `device_indexes`.
    job: Optional[cluster.Environment] = dataclasses.field(
        default=None, compare=False, repr=False)
    device_indexes: Tuple[int, ...] = dataclasses.field(default=(), compare=False)
    # The most training steps per call into the engine, where the strategy
    # cannot run the program's steps_per_execution (tf-multi-worker: 1).
    steps_per_execution: Optional[int] = dataclasses.field(default=None, compare=False)
    # torch, from the model: who averages each training step's gradients
    # over the processes, "keras" (3.16's trainer under DistributedDataParallel
    # itself, with Keras's own train_step) or "agnostic"; and whether Keras
    # sums the metrics over the processes itself (3.16). None and False
    # elsewhere, and without a model.
    gradients_by: Optional[str] = dataclasses.field(default=None, compare=False)
    keras_ddp: bool = dataclasses.field(default=False, compare=False)

    @property
    def starts_processes(self):
        """Whether agnostic starts this plan's processes itself: several
        processes (torch), and no job (a scheduler, a launcher, Ray) that
        started them."""
        return self.num_processes > 1 and self.job is None

    @property
    def joining(self):
        """How this process joins its job's engine (a per_process.Joining:
        JAX's coordinator and local devices, TensorFlow's worker
        addresses), as the engine's start-up does it; None without a job."""
        return None if self.job is None else per_process.joining(self.backend, self.job)

    @property
    def process_group(self):
        """torch's process-group backend for several processes: NCCL across
        GPUs, gloo on the CPU; None with one process or another engine."""
        if self.backend != "torch" or self.num_processes < 2:
            return None
        return "nccl" if self.devices[0].startswith("cuda") else "gloo"

    def _placed(self):
        if not self.placements:
            return ""
        return " placements=[" + ", ".join(
            f"{call} -> {device}" for call, device in self.placements) + "]"

    def line(self):
        """The plan line said as training starts: the engine, the strategy and
        the devices (the threads and the reason too: describe())."""
        where = "" if self.environment == NO_ENVIRONMENT else f" environment={self.environment}"
        return (f"plan: backend={self.backend} strategy={self.strategy} "
                f"replicas={self.num_replicas} processes={self.num_processes}{where} "
                f"devices=[{', '.join(self.devices)}]{self._placed()}")

    def describe(self):
        """The plan in full, with the threads, the job and why (`agnostic
        info`, and the "agnostic" logger at DEBUG)."""
        threads = f" threads={self.threads_reason}" if self.threads_reason else ""
        return (
            f"plan: backend={self.backend} strategy={self.strategy} "
            f"replicas={self.num_replicas} processes={self.num_processes}{threads} "
            f"environment={self.environment} devices=[{', '.join(self.devices)}]"
            f"{self._placed()}: {self.reason}")


def resolve(gpus: Optional[Union[int, Sequence[int]]] = None, cpu_relocation: bool = False,
            model: Optional["keras.Model"] = None, shard: bool = False) -> Plan:
    """Looks at the engine and its devices and decides how to train.

    Args:
        gpus: None for every visible accelerator, an int for that many, or a
            list of device ids (the legacy `multi_gpu_model` meaning).
        cpu_relocation: as for backend_agnostic_compile (TensorFlow on one
            machine: tf-central-storage).
        model: the model to train, when it places its layers with
            agnostic.device(): the plan then says where each placed call runs.
        shard: True: split each large weight and its optimizer state over
            the devices (JAX: jax-sharded) or the processes (torch:
            torch-sharded), instead of copying them. ("auto" needs the
            compile call's optimizer: backend_agnostic_compile decides it.)

    Returns:
        A frozen `Plan`.

    Raises:
        DeviceRequestError: `gpus` asks for devices that do not exist.
        EngineUnavailableError: Keras or its engine is not installed.
        LaunchError: a scheduler's variables are wrong.
    """
    gpus = whole_numbers(gpus)
    check_gpus_type(gpus)
    # A bad value of a variable agnostic reads: its error, before anything.
    devices_lib.requested_cpu_devices(warn=True)
    _startup.check_variables()
    backend = devices_lib.current_backend()
    job = cluster.job(backend)
    plan = decide(backend, devices_lib.list_devices(backend, job), gpus, job, cpu_relocation,
                  placement.requested(model))
    if backend == "torch" and model is not None:
        # Who averages the gradients over the processes, and whether Keras
        # sums the metrics itself: decided by the model's class and Keras.
        from agnostic.compat import torch_keras_ddp

        by, keras_ddp = torch_keras_ddp.who_averages(model)
        plan = dataclasses.replace(plan, gradients_by=by, keras_ddp=keras_ddp)
    return shards.sharded(plan) if shard is True else plan


def decide(backend, listing, gpus=None, environment=None, cpu_relocation=False,
           placements=()):
    """The pure decision: engine name, devices found, `gpus`, the job of
    several processes this one belongs to (an agnostic.cluster.Environment),
    cpu_relocation and the model's agnostic.device() placements (see
    placement.requested), to a Plan naming what will run."""
    check_gpus_type(gpus)
    if placements and backend in placement.DEVICE_PARALLEL:
        plan = _placed(backend, listing, gpus, environment, placements, cpu_relocation)
        return _started_here(dataclasses.replace(plan, job=environment))
    plan = _runtime(_decide(backend, listing, gpus, environment), cpu_relocation)
    plan = per_process.threads(plan, listing, environment)
    if placements:
        plan = dataclasses.replace(plan, placement_warning=(
            f"The model's agnostic.device() placements are ignored: Keras engine "
            f"'{backend}' has no device placement in agnostic. Use KERAS_BACKEND="
            f"{', '.join(sorted(placement.DEVICE_PARALLEL))} to place layers."))
    if environment is None:
        return _started_here(plan)
    return dataclasses.replace(plan, environment=environment.name, job=environment)


def _started_here(plan):
    """A plan whose processes agnostic starts, with each one's device index:
    refused now where rank 0 (this process) would not be on device 0."""
    if not plan.starts_processes:
        return plan
    return dataclasses.replace(plan, device_indexes=tuple(per_process.device_indexes(plan)))


def _placed(backend, listing, gpus, environment, placements, cpu_relocation):
    layout = placement.decide(backend, listing, gpus, environment, placements)
    names = {placement.HOST: listing.host}
    names.update((i, name) for i, name in enumerate(listing.devices))
    unused = None
    if cpu_relocation:
        unused = "each placed layer keeps its variables on the device of its first call"
    return Plan(backend, placement.DEVICE_PARALLEL[backend], layout.devices, layout.replicas,
                num_processes=layout.processes, process_id=layout.rank,
                reason=layout.reason, relocation_unused=unused,
                environment=environment.name if environment is not None else NO_ENVIRONMENT,
                placements=tuple((call, names[i]) for call, i in placements),
                placement_warning=layout.warning)


def _runtime(plan, cpu_relocation):
    """TensorFlow's replication by what runs: several workers, or the
    variables kept on the CPU; and why cpu_relocation does nothing, if so."""
    strategy = plan.strategy
    if strategy == MULTI_DEVICE["tensorflow"]:
        if plan.num_processes > 1:
            strategy = TF_MULTI_WORKER
        elif cpu_relocation and plan.num_replicas > 1:
            strategy = TF_CENTRAL_STORAGE
    unused = None
    if cpu_relocation and strategy != TF_CENTRAL_STORAGE:
        unused = NOT_RELOCATED.get(strategy, NOT_RELOCATED[SINGLE_DEVICE])
    # Keras's loop of several steps in one call into TensorFlow fails under
    # MultiWorkerMirroredStrategy (3.13-3.16).
    steps = 1 if strategy == TF_MULTI_WORKER else None
    return dataclasses.replace(plan, strategy=strategy, relocation_unused=unused,
                               steps_per_execution=steps)


def _decide(backend, listing, gpus, environment):
    found = listing.devices
    strategy = MULTI_DEVICE.get(backend)
    if environment is not None:
        per_process.check_tasks_per_node(backend, listing, environment)
    if environment is not None and strategy in PROCESS_PER_DEVICE:
        return _join(backend, strategy, listing, gpus, environment)
    if strategy is None:
        note = (
            f"Keras engine '{backend}' has no multi-device path in agnostic; "
            f"training on {listing.host}."
        )
        asks_one = gpus == 1 or (not isinstance(gpus, int) and len(gpus or ()) == 1)
        warn = None if asks_one else note
        if warn:
            warn += (
                " To use several devices, set KERAS_BACKEND to one of: "
                f"{', '.join(sorted(MULTI_DEVICE))}."
            )
        return _single(backend, listing.host, note, warn)
    if listing.num_processes > 1:
        return _spanning(backend, strategy, listing, gpus)
    chosen = devices_lib.choose(found, gpus, listing)
    if len(chosen) < 2:
        if gpus is None:
            note = (
                f"{backend} sees {_count(found, listing)}; "
                f"training on {chosen[0]}."
            )
            warn = note + (
                " To train on several devices, run on a machine with "
                "several accelerators, or set AGNOSTIC_CPU_DEVICES=N before "
                "starting Python to split the CPU into N devices."
            )
            return _single(backend, chosen[0], note, warn)
        return _one_chosen(backend, strategy, chosen[0], listing, gpus)
    kind = "simulated CPU devices" if listing.simulated else "devices"
    reason = f"{len(chosen)} {kind} of {len(found)} found, gpus={gpus!r}."
    processes = len(chosen) if strategy in PROCESS_PER_DEVICE else 1
    if processes > 1:
        reason += f" One process per device: this one and {processes - 1} started by agnostic."
    return Plan(backend, strategy, tuple(chosen), len(chosen), num_processes=processes,
                reason=reason + NOTES.get(backend, ""))


def _one_chosen(backend, strategy, device, listing, gpus):
    """One device that `gpus` names: the engine's default device (or the one
    CPU) takes the model as it is; another device, only the engine's
    placement (torch's device scope) or its own strategy over that one
    device (TensorFlow, JAX, MXNet) can hold it."""
    reason = f"gpus={gpus!r} asks for one device."
    if device == listing.devices[0] or not listing.accelerators \
            and strategy in PROCESS_PER_DEVICE:
        return _single(backend, device, reason)
    if strategy in PROCESS_PER_DEVICE:
        return dataclasses.replace(_single(backend, device, reason), device_scope=True)
    reason += f" Not the engine's default device ({listing.devices[0]}): {strategy} places it."
    return Plan(backend, strategy, (device,), 1, reason=reason + NOTES.get(backend, ""))


def _spanning(backend, strategy, listing, gpus):
    """An engine runtime spanning several processes (JAX): every device of
    every process trains."""
    found = listing.devices
    asked = None if gpus is None else (gpus if isinstance(gpus, int) else len(gpus))
    if asked is not None and asked != len(found):
        raise errors.DeviceRequestError(
            f"This process is one of {listing.num_processes} processes that train "
            f"together on {len(found)} devices ({devices_lib.device_names(found)}); "
            f"gpus={gpus!r} asks "
            f"for {asked}. Pass gpus=None, or start the processes with "
            f"{asked} devices in all."
        )
    reason = (f"process {listing.process_id} of {listing.num_processes}, "
              f"{len(found)} devices in all.")
    return Plan(backend, strategy, found, len(found), num_processes=listing.num_processes,
                process_id=listing.process_id, reason=reason)


def _join(backend, strategy, listing, gpus, environment):
    """A process that a scheduler (or agnostic) started: the job decides."""
    world = environment.world_size
    asked = None if gpus is None else (gpus if isinstance(gpus, int) else len(gpus))
    if asked is not None and asked != world:
        raise errors.DeviceRequestError(
            f"This process is one of {world} processes started by {environment.name}, "
            f"but gpus={gpus!r} asks for {asked} devices. Pass gpus=None, or start "
            f"{asked} processes."
        )
    if listing.accelerators:
        devices = tuple(listing.devices[i % len(listing.devices)] for i in range(world))
    else:
        devices = tuple(f"cpu:{i}" for i in range(world))
    reason = (f"process {environment.rank} of {world} ({environment.name}), "
              f"coordinator {environment.coordinator}:{environment.port}.")
    return Plan(backend, strategy, devices, world, num_processes=world,
                process_id=environment.rank, reason=reason)


def _single(backend, device, reason, warning=None):
    return Plan(
        backend, SINGLE_DEVICE, (device,), 1, reason=reason + NOTES.get(backend, ""),
        fallback_warning=warning,
    )


def _count(found, listing):
    if not listing.accelerators and len(found) <= 1:
        return f"no accelerator and one CPU device ({listing.host})"
    return f"{len(found)} device(s): {', '.join(found)}"
