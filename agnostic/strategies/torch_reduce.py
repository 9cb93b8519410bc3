"""Summing torch tensors across processes, for torch-ddp.

Gradients are summed in buckets (one collective per bucket, as torch's
DistributedDataParallel does), and a bucket is sent as soon as backward has
produced all of its gradients, so that communication overlaps the rest of
backward instead of following it. Buckets follow the reverse order of the
model's weights (the order backward produces their gradients), the first one
small so that it can leave early.
"""
BUCKET_BYTES = 25 * 1024 * 1024
FIRST_BUCKET_BYTES = 1024 * 1024


def buckets(tensors, first_bytes=None):
    """Consecutive groups of `tensors` of at least BUCKET_BYTES (the first:
    `first_bytes`), the last one smaller."""
    bucket, size, limit = [], 0, first_bytes or BUCKET_BYTES
    for tensor in tensors:
        bucket.append(tensor)
        size += tensor.numel() * tensor.element_size()
        if size >= limit:
            yield bucket
            bucket, size, limit = [], 0, BUCKET_BYTES
    if bucket:
        yield bucket


def flat(bucket):
    import torch

    return torch.cat([t.detach().reshape(-1) for t in bucket])


def unflatten_into(values, bucket):
    offset = 0
    for tensor in bucket:
        count = tensor.numel()
        tensor.copy_(values[offset:offset + count].view_as(tensor))
        offset += count


def broadcast(tensors):
    """Every process gets rank 0's values of `tensors`, in place."""
    import torch
    import torch.distributed as dist

    with torch.no_grad():
        for bucket in buckets(tensors):
            values = flat(bucket)
            dist.broadcast(values, src=0)
            unflatten_into(values, bucket)


def all_reduce_sum(tensors):
    """Every process gets the sum of `tensors` over all processes, in place."""
    import torch.distributed as dist

    pending = []
    for bucket in buckets(tensors):
        values = flat(bucket)
        pending.append((dist.all_reduce(values, async_op=True), values, bucket))
    for work, values, bucket in pending:
        work.wait()
        unflatten_into(values, bucket)


def all_reduce_mean(tensors, world_size):
    """Every process gets the mean of `tensors` over all processes, in place."""
    all_reduce_sum(tensors)
    for tensor in tensors:
        tensor.div_(world_size)


class GradientReducer:
    """Averages a model's gradients across processes, overlapping backward.

    `step()` wraps one training step: while it runs, a hook on each weight
    notes its gradient, and a bucket whose gradients are all there is sent
    (buckets leave in order, so every process issues the same collectives
    in the same order). `average(gradients, variables)`, called just before
    the optimizer applies them, sends what is left, waits, and writes the
    means into the gradients. When a step is not the plain one (a weight got
    its gradient twice, as in gradient accumulation, or the optimizer gets
    other tensors than the weights' gradients), the early sums are dropped
    and the given gradients are summed there and then.
    """

    def __init__(self, variables, world_size):
        self.world_size = world_size
        self.weights = [v.value for v in variables]
        order = list(reversed(self.weights))
        self.buckets = list(buckets(order, FIRST_BUCKET_BYTES))
        self.bucket_of = {}
        for index, bucket in enumerate(self.buckets):
            for weight in bucket:
                self.bucket_of[id(weight)] = index
        self.active = False
        self.applied = False  # the optimizer got the step's gradients
        self.warned = False
        self.early = 0  # buckets sent during the last step's backward
        self.hooks = [
            weight.register_post_accumulate_grad_hook(self._gradient_ready)
            for weight in self.weights
            # torch >= 2.1; without the hook every bucket leaves after backward.
            if weight.requires_grad and hasattr(weight, "register_post_accumulate_grad_hook")
        ]

    def close(self):
        """Removes the hooks (the model is being compiled again)."""
        for hook in self.hooks:
            hook.remove()
        self.hooks = []

    def step(self, run, name="train_step"):
        self.active, self.plain, self.applied = True, True, False
        self.noted, self.ready = set(), [0] * len(self.buckets)
        self.sent, self.early = [], 0
        try:
            result = run()
        finally:
            # After an error (Ctrl-C in backward, say) the other processes
            # may never send their part of what this one sent: no waiting.
            self.active = False
        self._wait()
        if self.noted and not self.applied and not self.warned:
            self._warn_unaveraged(name)
        return result

    def _warn_unaveraged(self, name):
        import warnings

        from agnostic import errors

        self.warned = True
        warnings.warn(
            f"{name} ran backward but did not pass the gradients to the model's "
            "optimizer (self.optimizer.apply or apply_gradients), where agnostic "
            f"averages them across the {self.world_size} processes: the weights "
            "it updated some other way (another optimizer, a manual update) "
            "train differently from one device and drift apart between "
            "processes. Apply gradients through self.optimizer.",
            errors.UnaveragedGradientsWarning, stacklevel=2,
        )

    def _gradient_ready(self, weight):
        if not self.active:
            return
        if id(weight) in self.noted:
            self.plain = False
            return
        self.noted.add(id(weight))
        self.ready[self.bucket_of[id(weight)]] += 1
        while self.plain and len(self.sent) < len(self.buckets):
            index = len(self.sent)
            if self.ready[index] < len(self.buckets[index]):
                break
            self._send(index)
            self.early += 1

    def _send(self, index):
        import torch.distributed as dist

        gradients = [w.grad for w in self.buckets[index] if w.grad is not None]
        values = flat(gradients) if gradients else None
        work = dist.all_reduce(values, async_op=True) if gradients else None
        self.sent.append((work, values, gradients))

    def _wait(self):
        for work, _, _ in self.sent:
            if work is not None:
                work.wait()
        sent, self.sent = self.sent, []
        return sent

    def average(self, gradients, variables):
        self.applied = True
        present = [g for g in gradients if g is not None]
        own = [v.value.grad for v in variables] if variables is not None else None
        plain = (self.active and self.plain and own is not None
                 and len(own) == len(gradients) == len(self.weights)
                 and all(g is o for g, o in zip(gradients, own))
                 and all(v.value is w for v, w in zip(variables, self.weights)))
        if not plain:
            self._wait()
            all_reduce_mean(present, self.world_size)
            return
        while len(self.sent) < len(self.buckets):
            self._send(len(self.sent))
        for work, values, bucket in self._wait():
            if work is not None:
                values.div_(self.world_size)
                unflatten_into(values, bucket)
