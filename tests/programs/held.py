"""The bytes of a model's weights and of its optimizer's state that each
device holds, by device: {"weights": ..., "optimizer": ...}. JAX: the
addressable shards of every array; TensorFlow: each device's component of
every variable; torch: this process's tensors (a process per device, named
by its rank). Used by the programs' harness, tests/scripts/sharded.py and
benchmarks/memory.py."""


def bytes_per_device(model):
    import keras

    optimizer = getattr(model, "optimizer", None)
    parts = {"weights": list(model.variables),
             "optimizer": list(getattr(optimizer, "variables", []))}
    held = {}
    for part, variables in parts.items():
        for variable in variables:
            for device, size in _pieces(keras.backend.backend(), variable.value):
                held.setdefault(device, {"weights": 0, "optimizer": 0})[part] += size
    return held


def _pieces(engine, value):
    """(device, bytes) of each piece of a variable's value."""
    if engine == "jax":
        return [(str(shard.device), shard.data.nbytes) for shard in value.addressable_shards]
    if engine == "tensorflow":
        return [(component.device, component.shape.num_elements() * component.dtype.size)
                for component in getattr(value, "values", (value,))]
    return [(f"process {rank()}", value.numel() * value.element_size())]


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
