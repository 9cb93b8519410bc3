"""torch-sharded's optimizer state: each process keeps the optimizer's slots
(Adam's two moments, a momentum, an average) for its own slice of each large
weight, as ZeRO does. The gradients are whole; DistributedDataParallel
averages them as in torch-ddp.

A weight of SMALLEST values or more is split, flattened, into one contiguous
slice per process (the first processes one value more where the count does
not divide). The optimizer is built on Keras variables whose storage is this
process's slice of each weight, so it makes each slot the size of a slice
and its update writes that slice. Where the weight is split itself
(engines/torch/weight_shards.py: trainable weights), the slice is the
one it keeps and the weight is freed after the update, to be gathered when
next read; else the slice is a view of the whole weight, and after the update
the processes exchange their slices (one all_gather), so every such weight
is whole again everywhere. Smaller weights are updated whole, by every
process.

A save assembles each slot on the chief for the time of the write, so the
file is a plain Keras file that loads on any device count, engine, or plain
Keras; a load takes this process's slice of each slot. Only optimizers whose
update is per value are split (ELEMENTWISE); clipping by a norm runs on the
whole gradients first (compat/optimizer_slices.py).
"""
import contextlib

from agnostic import errors, methods
from agnostic.compat import optimizer_slices

# Fewer values than this: updated whole, by every process.
SMALLEST = 1024
# Keras's optimizers whose update of a value reads only that value's
# gradient and slots (so a slice updates as the whole weight would).
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta",
               "Ftrl", "Lion")


def refusal(optimizer):
    """Why `optimizer` (an instance, or a name compile takes) cannot have its
    state split, or None."""
    import keras

    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    name = type(optimizer).__name__
    if getattr(optimizer, "inner_optimizer", None) is not None:
        return (f"a {name} (mixed precision) rescales every gradient by a check over "
                "all of them at once")
    kinds = tuple(getattr(keras.optimizers, kind) for kind in ELEMENTWISE)
    if not isinstance(optimizer, kinds) or not type(optimizer).__module__.startswith("keras."):
        return f"{name}'s update of a value may read other values (only Keras's own " \
               f"{', '.join(ELEMENTWISE)} are known not to)"
    if optimizer.gradient_accumulation_steps and (optimizer.clipnorm or
                                                  optimizer.global_clipnorm):
        return (f"{name} clips the norm of gradients it accumulates over "
                f"{optimizer.gradient_accumulation_steps} steps, inside its update")
    return None


class Split:
    """One weight's values, flattened, in a slice per process."""

    def __init__(self, size, world):
        base, extra = divmod(size, world)
        self.size = size
        self.counts = [base + (index < extra) for index in range(world)]
        self.starts = [sum(self.counts[:index]) for index in range(world)]

    def of(self, flat, rank):
        return flat[self.starts[rank]:self.starts[rank] + self.counts[rank]]


def shards_of(optimizer, rank, world, weights=None):
    """`optimizer`'s Shards: the ones made for it before, where it is
    compiled again (its slots are kept by slice), else new ones. `weights`:
    the model's split weights (engines/torch/weight_shards.py), whose
    slices the optimizer updates in place of views of whole weights."""
    made = optimizer.__dict__.get("_agnostic_shards")
    if made is None or (made.rank, made.world) != (rank, world):
        made = optimizer.__dict__["_agnostic_shards"] = Shards(optimizer, rank, world)
    made.weights = weights
    return made


class Shards:
    """One optimizer's state, split by weight slices over the processes."""

    def __init__(self, optimizer, rank, world):
        self.optimizer, self.rank, self.world = optimizer, rank, world
        self.splits = {}  # id(weight): Split, for the weights split
        self.parts = {}  # id(weight): the variable that is this process's slice
        self.weight_of = {}  # id(part): its weight
        self.built_on = []  # the weights, as the program gave them
        self.slots = {}  # id(slot): (Split, the weight's shape), for slots of slices
        self.whole_slots = None  # id(slot): the whole slot, on the chief, while saving
        self.weights = None  # the model's split weights, if any

    def install(self):
        for name, wrapper in (("build", self._build), ("apply", self._apply),
                              ("add_variable_from_reference", self._made),
                              ("finalize_variable_values", self._finalize),
                              ("save_own_variables", self._save),
                              ("load_own_variables", self._load)):
            methods.wrap_method(self.optimizer, name, wrapper)

    def part(self, weight):
        """The variable the optimizer updates for `weight`: a view of this
        process's slice, or the weight itself where it is small."""
        import keras
        import torch

        if id(weight) in self.weight_of:
            return weight
        if id(weight) in self.parts:
            return self.parts[id(weight)]
        held = self.weights.holds(weight) if self.weights is not None else None
        if held is not None:  # the weight's slice, kept apart from its freed storage
            split, view = held.split, held.part
        else:
            value = weight.value.data
            if value.numel() < SMALLEST or not value.is_contiguous():
                return weight
            split = Split(value.numel(), self.world)
            view = split.of(value.view(-1), self.rank)
        part = keras.Variable(torch.nn.Parameter(view, requires_grad=False), name=weight.name,
                              dtype=weight.dtype, trainable=False)
        self.splits[id(weight)], self.parts[id(weight)] = split, part
        self.weight_of[id(part)] = weight
        optimizer_slices.exclude_like(self.optimizer, [(weight, part)])
        return part

    def _build(self, build):
        def run(variables):
            self.built_on = [self.weight_of.get(id(v), v) for v in variables]
            return build([self.part(variable) for variable in variables])

        return run

    def _made(self, make):
        def run(reference, *args, **kwargs):
            slot = make(reference, *args, **kwargs)
            weight = self.weight_of.get(id(reference))
            if weight is not None:
                self.slots[id(slot)] = (self.splits[id(weight)], tuple(weight.shape))
            return slot

        return run

    def _apply(self, apply):
        def run(grads, trainable_variables=None):
            weights = list(trainable_variables if trainable_variables is not None
                           else self.built_on)
            grads = self._whole_gradients_prepared(list(grads))
            parts = [self.part(weight) for weight in weights]
            self._check_views(weights)
            sliced = [self._slice(grad, weight) for grad, weight in zip(grads, weights)]
            with self._settings(clipnorm=None, global_clipnorm=None, loss_scale_factor=None):
                result = apply(sliced, parts)
            self.exchange(weights)
            for weight in weights:  # on the whole weight, as Keras applies it
                if id(weight) in self.splits and weight.constraint is not None:
                    weight.assign(weight.constraint(weight))
            return result

        return run

    def _check_views(self, weights):
        """Each slice the optimizer updates is still the weight's own storage
        (a weight whose tensor was replaced, not assigned, is not)."""
        for weight in weights:
            split = self.splits.get(id(weight))
            if split is None or self._held(weight):
                continue
            start = weight.value.data.view(-1)[split.starts[self.rank]:]
            if self.parts[id(weight)].value.data_ptr() != start.data_ptr():
                raise errors.AgnosticError(
                    f"The tensor of weight {weight.path!r} was replaced after "
                    "backend_agnostic_compile(..., shard=True) split its optimizer state "
                    "(torch-sharded updates slices of the weights' own tensors). Assign "
                    "new values with variable.assign(...), which keeps the tensor, or "
                    "compile again. Received: a weight whose tensor is not the one "
                    "compiled")

    def _whole_gradients_prepared(self, grads):
        """What Keras does to the gradients before its per-value update and
        that needs all of them: unscaling, and clipping by a norm."""
        optimizer = self.optimizer
        scale = optimizer.loss_scale_factor
        if scale is not None:
            grads = [grad if grad is None else grad / scale for grad in grads]
        if (optimizer.clipnorm or optimizer.global_clipnorm) \
                and not optimizer.gradient_accumulation_steps:
            present = [index for index, grad in enumerate(grads) if grad is not None]
            clipped = optimizer_slices.clip(optimizer, [grads[index] for index in present])
            for index, grad in zip(present, clipped):
                grads[index] = grad
        return grads

    @contextlib.contextmanager
    def _settings(self, **values):
        optimizer = self.optimizer
        kept = {name: getattr(optimizer, name) for name in values}
        if optimizer.gradient_accumulation_steps:
            values = {"loss_scale_factor": None}  # it clips what it accumulates
        for name, value in values.items():
            setattr(optimizer, name, value)
        try:
            yield
        finally:
            for name, value in kept.items():
                setattr(optimizer, name, value)

    def _slice(self, grad, weight):
        split = self.splits.get(id(weight))
        if grad is None or split is None:
            return grad
        return split.of(grad.reshape(-1), self.rank)

    def _held(self, weight):
        return self.weights.holds(weight) if self.weights is not None else None

    def exchange(self, weights):
        """Every process's slices of `weights` (updated there) into every
        process's whole weights: one all_gather. Split weights are freed
        instead (read again, they gather the new slices)."""
        import torch
        import torch.distributed as dist

        if self.weights is not None:  # updated in their slices: whole nowhere now
            self.weights.free([self._held(weight) for weight in weights if self._held(weight)])
        split = [(weight, self.splits[id(weight)]) for weight in weights
                 if id(weight) in self.splits and not self._held(weight)]
        if not split:
            return
        with torch.no_grad():
            flats = [weight.value.data.view(-1) for weight, _ in split]
            sizes = [sum(s.counts[rank] for _, s in split) for rank in range(self.world)]
            send = padded([s.of(flat, self.rank) for flat, (_, s) in zip(flats, split)],
                           max(sizes))
            received = [torch.empty_like(send) for _ in range(self.world)]
            dist.all_gather(received, send)
            for rank, values in enumerate(received):
                if rank == self.rank:
                    continue
                offset = 0
                for flat, (_, s) in zip(flats, split):
                    s.of(flat, rank).copy_(values[offset:offset + s.counts[rank]])
                    offset += s.counts[rank]

    def _finalize(self, finalize):
        def run(var_list):
            weights = list(var_list)
            result = finalize([self.part(weight) for weight in weights])
            if self.optimizer.use_ema:  # the averages went into the slices
                self.exchange(weights)
            return result

        return run

    @contextlib.contextmanager
    def gathered(self):
        """Within: the chief has every split slot whole (every process must
        enter: the slots are gathered to the chief)."""
        slots = [slot for slot in self.optimizer.variables if id(slot) in self.slots]
        if not slots:
            yield
            return
        self.whole_slots = {}
        try:
            for kind in sorted({slot.dtype for slot in slots}):  # the same order everywhere
                self._gather([slot for slot in slots if slot.dtype == kind])
            yield
        finally:
            self.whole_slots = None

    def _gather(self, slots):
        import torch
        import torch.distributed as dist

        splits = [self.slots[id(slot)][0] for slot in slots]
        sizes = [sum(s.counts[rank] for s in splits) for rank in range(self.world)]
        send = padded([slot.value.detach().reshape(-1) for slot in slots], max(sizes))
        received = [torch.empty_like(send) for _ in range(self.world)] if self.rank == 0 \
            else None
        dist.gather(send, received, dst=0)
        if self.rank != 0:
            return
        offsets = [0] * self.world
        for slot, split in zip(slots, splits):
            whole = torch.empty(split.size, dtype=send.dtype, device=send.device)
            for rank, values in enumerate(received):
                split.of(whole, rank).copy_(values[offsets[rank]:offsets[rank] +
                                                   split.counts[rank]])
                offsets[rank] += split.counts[rank]
            shape = self.slots[id(slot)][1]
            self.whole_slots[id(slot)] = whole.reshape(shape).cpu().numpy()

    def _save(self, save):
        def run(store):
            if not self.slots:
                return save(store)
            if self.whole_slots is None:
                raise errors.NotSupportedError(
                    f"The state of optimizer {self.optimizer.name!r} is split over the "
                    f"{self.world} processes (shard=True): it is saved whole only by the "
                    "model's save or save_weights, which every process calls. Received: "
                    "a save of the optimizer by another path (keras.saving.save_model, "
                    "a trackable's save_own_variables). Call model.save(...) instead.")
            for index, slot in enumerate(self.optimizer.variables):
                whole = self.whole_slots.get(id(slot))
                store[str(index)] = slot.numpy() if whole is None else whole

        return run

    def _load(self, load):
        def run(store):
            if not self.slots:
                return load(store)
            return load(_SlicedStore(store, self))

        return run


def padded(pieces, size):
    """`pieces` joined, then zeros up to `size` values: what a process sends
    where every process must send as many (torch's all_gather and gather)."""
    import torch

    joined = torch.cat(pieces)
    return torch.cat([joined, joined.new_zeros(size - joined.numel())])


class _SlicedStore:
    """A saved optimizer's values, each split slot cut to this process's slice."""

    def __init__(self, store, shards):
        self.store, self.shards = store, shards
        self.slots = shards.optimizer.variables

    def keys(self):
        return self.store.keys()

    def __getitem__(self, key):
        import numpy as np

        value = self.store[key]
        index = int(key)
        if index >= len(self.slots) or id(self.slots[index]) not in self.shards.slots:
            return value
        split, shape = self.shards.slots[id(self.slots[index])]
        value = np.asarray(value)
        if value.size != split.size:
            raise ValueError(
                f"Optimizer variable {index} ({self.slots[index].path}) of the saved file "
                f"has {value.size} values, and its weight {shape} has {split.size}: the "
                f"file was saved from another model. Received: shape {value.shape}")
        return split.of(value.reshape(-1), self.shards.rank)
