"""torch's View of the global batch in a process's step
(agnostic/fit/global_batch.py), through torch.distributed on a process group of
its own (its collectives, some in backward passes, then never interleave
with DistributedDataParallel's buckets).

Parts of a batch differ in size by a row at most; torch gathers equal
sizes, so each part is padded to the largest and cut back after.
"""
import functools
import types


def maker(world_size):
    """A function giving each step its View; made by every process at the
    same point (a new process group is a collective)."""
    import torch.distributed as dist

    group = dist.new_group(list(range(world_size)))
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"

    def make():
        return View(group, dist.get_rank(), world_size, device)

    return make


class View:
    def __init__(self, group, index, replicas, device):
        self.group, self.index, self.replicas, self.device = group, index, replicas, device

    def is_tensor(self, value):
        import torch

        return torch.is_tensor(value)

    def leading(self, value):
        return value.shape[0]

    def rows(self, value):
        return value.shape[0]

    def gather_data(self, data):
        """Every process's rows of the step's data, in rank order."""
        import keras
        import numpy as np
        import torch

        def tensor(value):
            if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
                return torch.as_tensor(value)
            return value

        data = keras.tree.map_structure(tensor, data)
        first = next((value for value in keras.tree.flatten(data)
                      if self.is_tensor(value) and value.dim()), None)
        if first is None:
            return data
        rows = first.shape[0]
        counts = _all_gather(self.group, torch.tensor([rows], device=self.device),
                             [1] * self.replicas).tolist()

        def gathered(value):
            if self.is_tensor(value) and value.dim() and value.shape[0] == rows:
                return _all_gather(self.group, value.to(self.device), counts).to(value.device)
            return value

        return keras.tree.map_structure(gathered, data)

    def counts(self, rows):
        """Each process's rows of `rows`: the first processes take one more
        where they do not divide."""
        base, extra = divmod(rows, self.replicas)
        return [base + (index < extra) for index in range(self.replicas)]

    def split(self, rows):
        """This process's rows of `rows`, (start, stop)."""
        counts = self.counts(rows)
        start = sum(counts[:self.index])
        return start, start + counts[self.index]

    def part(self, value, start, stop):
        if not value.requires_grad:
            return value[start:stop]
        return _functions().Part.apply(value, start, stop, self)

    def gather(self, value, start, stop, rows):
        if not value.requires_grad:
            return _all_gather(self.group, value, self.counts(rows))
        return _functions().Gather.apply(value, start, stop, self.counts(rows), self)

    def when_rows(self, rows, part_rows, if_equal, otherwise):
        """`if_equal()` where `rows` (a draw's first dimension) is this
        process's rows, else `otherwise()`."""
        return if_equal() if int(rows) == part_rows else otherwise()

    def noise_shape(self, inputs, noise_shape):
        """Dropout's noise shape with the inputs' dimensions where it has None."""
        given = noise_shape if noise_shape is not None else [None] * inputs.dim()
        return [inputs.shape[i] if size is None else size for i, size in enumerate(given)]

    def ones(self, shape, like):
        import torch

        return torch.ones(tuple(int(size) for size in shape), dtype=like.dtype,
                          device=like.device)

    def weighted_sum(self, value, start, stop, rows):
        import torch.distributed as dist

        if stop == start:  # no rows: 0, not the NaN of a mean over none
            value = value.nan_to_num(0.0)
        weighted = value * ((stop - start) / rows)
        summed = weighted.detach().clone()
        dist.all_reduce(summed, group=self.group)
        local = weighted * self.replicas
        return (summed - local).detach() + local


def _all_gather(group, value, counts):
    """Every process's `value` (process i's has counts[i] rows), joined."""
    import torch
    import torch.distributed as dist

    kind = value.dtype
    if kind == torch.bool:  # not every backend gathers booleans
        value = value.to(torch.uint8)
    largest = max(counts)
    if value.shape[0] < largest:
        padding = value.new_zeros((largest - value.shape[0],) + tuple(value.shape[1:]))
        value = torch.cat([value, padding])
    value = value.contiguous()
    parts = [torch.empty_like(value) for _ in counts]
    dist.all_gather(parts, value, group=group)
    return torch.cat([part[:count] for part, count in zip(parts, counts)]).to(kind)


@functools.lru_cache(maxsize=None)
def _functions():
    """The autograd Functions, made when a step first needs one (they
    subclass torch's, and importing agnostic imports no engine)."""
    import torch

    class Gather(torch.autograd.Function):
        """Forward: every process's part, joined. Backward: this process's
        part of the gradient, N times (every process computed the same)."""

        @staticmethod
        def forward(ctx, value, start, stop, counts, view):
            ctx.start, ctx.stop, ctx.replicas = start, stop, view.replicas
            return _all_gather(view.group, value, counts)

        @staticmethod
        def backward(ctx, upstream):
            return upstream[ctx.start:ctx.stop] * ctx.replicas, None, None, None, None

    class Part(torch.autograd.Function):
        """Forward: this process's rows. Backward: every process's part of
        the gradient, joined, divided by the processes (each carries the
        whole loss): one device's gradient of the input, everywhere."""

        @staticmethod
        def forward(ctx, value, start, stop, view):
            ctx.view, ctx.rows = view, value.shape[0]
            return value[start:stop].clone()

        @staticmethod
        def backward(ctx, upstream):
            view = ctx.view
            whole = _all_gather(view.group, upstream, view.counts(ctx.rows))
            return whole / view.replicas, None, None, None

    return types.SimpleNamespace(Gather=Gather, Part=Part)
