"""The bytes of a model's weights and of its optimizer's state that each
device holds, by device: {"weights": ..., "optimizer": ...}. JAX: the
addressable shards of every array; TensorFlow: each device's component of
every variable; torch: this process's tensors (a process per device, named
by its rank). Used by the programs' harness, tests/scripts/sharded.py and
benchmarks/memory.py."""


def watch(model):
    """Records what each device holds after each training step of `model`
    (compiled): on torch under shard=True, weights are split between steps
    and whole again once fit returns. bytes_per_device then reports the
    largest total a step left."""
    import keras

    if keras.backend.backend() != "torch":
        return
    largest = model.__dict__["_held_during_fit"] = {}
    train_step = model.train_step

    def run(*args, **kwargs):
        logs = train_step(*args, **kwargs)
        for device, sizes in bytes_per_device(model, during_fit=False).items():
            if sum(sizes.values()) > sum(largest.get(device, {}).values()):
                largest[device] = sizes
        return logs

    model.train_step = run


def bytes_per_device(model, during_fit=True):
    import keras

    if during_fit and model.__dict__.get("_held_during_fit"):
        return model.__dict__["_held_during_fit"]
    optimizer = getattr(model, "optimizer", None)
    parts = {"weights": list(model.variables),
             "optimizer": list(getattr(optimizer, "variables", []))}
    held = {}
    for part, variables in parts.items():
        for variable in variables:
            for device, size in _pieces(keras.backend.backend(), _stored(variable)):
                held.setdefault(device, {"weights": 0, "optimizer": 0})[part] += size
    return held


def _stored(variable):
    """What `variable` holds, without reading it (on torch, under
    shard=True, a read gathers a split weight): its torch tensor, and this
    process's slice where its storage is freed between steps."""
    import keras

    if keras.backend.backend() != "torch":
        return variable.value
    held = variable.__dict__.get("_agnostic_held")
    return (variable._value, held.part if held is not None else None)


def _pieces(engine, value):
    """(device, bytes) of each piece of a variable's value."""
    if engine == "jax":
        return [(str(shard.device), shard.data.nbytes) for shard in value.addressable_shards]
    if engine == "tensorflow":
        return [(component.device, component.shape.num_elements() * component.dtype.size)
                for component in getattr(value, "values", (value,))]
    return [(f"process {rank()}", tensor.untyped_storage().nbytes())
            for tensor in value if tensor is not None]


def rank():
    """This process's rank: torch's process group's, JAX's process index, else 0."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        return jax.process_index()
    if keras.backend.backend() != "torch":
        return 0
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0
