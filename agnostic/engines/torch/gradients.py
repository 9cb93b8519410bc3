"""torch-ddp's gradients: each training step's averaged over the processes,
each process's share of the batch weighted by its rows, as on one device.

Used by engines.torch.ddp (and torch-device-parallel, through it), which
applies the wraps each function returns, (owner, method name, wrapper)
triples, in one place (agnostic/methods.py).
"""
import logging

from agnostic import batching, errors, methods
from agnostic.compat import torch_empty_share, torch_keras_ddp, torch_variables
from agnostic.engines.torch import combined

logger = logging.getLogger("agnostic")

# DistributedDataParallel's bucket size (its default): gradients are summed
# one bucket per collective, each sent as soon as backward has filled it.
BUCKET_MB = 25


def _grad(variable):
    """A weight's gradient, read from its parameter (not through its value,
    which under shard=True would gather a freed weight)."""
    return torch_variables.parameter(variable).grad


def average(model, world_size, multi_device=False, optimizers=(), trackers=(), by_keras=False,
            global_view=False):
    """Each training step's gradients averaged over the processes: torch's
    DistributedDataParallel while backward runs, when the step calls the
    model (compat.torch_keras_ddp); else when an optimizer the model trains
    with (`optimizers`: the model's, a GAN's own) gets them. `trackers`: the
    model's Mean trackers (in_place.mean_trackers), whose updates in a step
    are weighted by this process's share. `by_keras`: Keras averages them
    itself; only each share's weight is added, to the loss its train_step
    scales. `global_view`: every process's step sees the whole batch
    (agnostic/fit/global_batch.py), so each share weighs the same (and the
    trackers are left alone)."""
    steps = GradientSteps(model, world_size, multi_device, global_view)
    steps.warned = by_keras  # Keras's own step averages: nothing to warn of

    def step(train_step):
        def run(*args, **kwargs):
            data = batching.step_data(args, kwargs)
            return steps.run(lambda: train_step(*args, **kwargs), data)

        return run

    def apply(original):
        def run(gradients, variables=None):
            steps.average(gradients, variables)
            return original(gradients, variables)

        return run

    def scale_loss(original):
        def run(loss):
            return steps.scale(original(loss))

        return run

    def test_step(original):
        def run(*args, **kwargs):
            data = batching.step_data(args, kwargs)
            return steps.counted(lambda: original(*args, **kwargs), data, early=False)

        return run

    wraps = [(model, "train_step", step), (model, "test_step", test_step)]
    if not global_view:
        wraps += [(tracker, "update_state", steps.weighted_update)
                  for tracker in trackers]
    if not by_keras:
        wraps.append((model, "forward", steps.forward))
    # A loss-scale optimizer averages before its inner one sees the gradients.
    inner = {id(getattr(optimizer, "inner_optimizer", None)) for optimizer in optimizers}
    for optimizer in optimizers:
        if id(optimizer) not in inner:
            wraps.append((optimizer, "scale_loss", scale_loss))
            if not by_keras:
                wraps.append((optimizer, "apply", apply))
    model.__dict__["_agnostic_gradients"] = steps  # read by tests and benchmarks
    return wraps


class GradientSteps:
    """Who averages one training step's gradients.

    The model's forward pass during a step goes through torch's
    DistributedDataParallel (made at the first step, once the model is
    built): its reducer sums the gradients in buckets as backward produces
    them and writes the means into the weights' `.grad`, which Keras's
    train_step hands to the optimizer. A backward pass that runs twice in a
    step (gradient accumulation) is averaged on each pass, so the sum is too.
    A step that never calls the model itself (a GAN's step calls its parts),
    or that gives the optimizer other tensors than the weights' gradients,
    has them averaged when the optimizer gets them; so has every step of a
    model some of whose weights get no gradient (_without_parallel). Forward
    passes outside
    a training step (evaluate, predict, a saliency map) start no collective.
    """

    def __init__(self, model, world_size, multi_device=False, global_view=False):
        self.model, self.world_size = model, world_size
        self.global_view = global_view  # every process's loss is the whole batch's
        self.multi_device = multi_device
        self.parallel = None
        self.whole = True  # every weight gets a gradient: DDP can be used
        self.active = False
        self.forwards = 0  # this step's forward passes through DDP
        self.applied = False
        self.warned = False
        self.at_optimizer = 0  # steps averaged when the optimizer got them
        self.rows = None  # this process's rows in this step
        self.counting = None  # the pending sum of every process's rows
        self.counted_rows = False  # that sum was started in this step
        self.weight = 1.0  # world * rows / every process's rows
        self.scaled = False  # this step's loss carries the weight
        self.in_step = False  # in a train or test step

    def forward(self, own):
        def run(*args, **kwargs):
            import torch

            if self.active and torch.is_grad_enabled():
                if self.parallel is None and self.whole:
                    self.parallel = torch_keras_ddp.parallel_forward(
                        self.model, BUCKET_MB, self.multi_device)
                    if methods.own(self.model, "train_step"):
                        # Keras's own step weights its loss (scale): the
                        # default averaging serves it; a step of the
                        # program's own has its gradients weighted here.
                        self.parallel.register_comm_hook(self, _weighted_mean)
                if self.parallel is not None:
                    self.forwards += 1
                    return self.parallel(*args, **kwargs)
            return own(*args, **kwargs)

        return run

    def run(self, step, data):
        self.active, self.forwards, self.applied, self.scaled = True, 0, False, False
        try:
            result = self.counted(step, data)
        finally:
            self.active = False
        if not self.applied and not self.forwards and not self.warned:
            self._warn_if_unaveraged()
        return result

    def counted(self, step, data, early=True):
        """Runs a train or test step, its rows summed over the processes:
        from the start (`early`: a training step's weight is always needed,
        and the sum then overlaps the forward pass), else when first needed."""
        self.rows, self.weight = batching.num_samples(data), 1.0
        self.counting, self.counted_rows = None, False
        if early and not self.global_view:
            self._count()
        self.in_step = True
        try:
            return step()
        finally:
            self.in_step = False
            self._wait()  # a sum started in a step ends in it

    def weighted_update(self, update_state):
        """A Mean tracker updated in a step with one value and no weight (the
        guides' `loss_tracker.update_state(loss)`) counts it by this
        process's share (world * n_r / n): the mean of the global batches'
        values, as on one device, not of the processes' means. Every process
        makes the same updates, so the sum it needs is taken everywhere."""
        def run(values, sample_weight=None):
            import torch

            if sample_weight is None and self.in_step and torch.is_tensor(values) \
                    and values.numel() == 1:
                sample_weight = torch.full_like(values, self.share())
            return update_state(values, sample_weight=sample_weight)

        return run

    def _count(self):
        import torch
        import torch.distributed as dist

        # The same data structure everywhere, so the same call everywhere.
        if self.rows is not None and not self.counted_rows:
            self.counted_rows = True
            total = torch.tensor([float(self.rows)])
            self.counting = (dist.all_reduce(total, async_op=True), total)

    def _wait(self):
        if self.counting is not None:
            work, total = self.counting
            work.wait()
            self.counting = None
            every = float(total[0])
            self.weight = self.world_size * self.rows / every if every else 0.0

    def share(self):
        """This step's weight of this process's gradients: world * n_r / n
        (1 where every process's loss is the whole batch's)."""
        if self.global_view:
            return 1.0
        self._count()
        self._wait()
        return self.weight

    def scale(self, loss):
        """The step's loss, weighted by this process's share (in a step)."""
        if not self.active:
            return loss
        self.scaled = True
        weight = self.share()
        return loss * weight if weight != 1.0 else loss

    def unscaled_weight(self):
        """What the gradients still need: the share, unless the loss had it."""
        return 1.0 if self.scaled else self.share()

    def average(self, gradients, variables):
        self.applied = True
        if self.forwards and variables is not None and len(gradients) == len(variables) \
                and all(g is _grad(v) for g, v in zip(gradients, variables)):
            if all(g is not None for g in gradients):
                return  # DistributedDataParallel averaged them during backward
            self._without_parallel(variables)
        present = [g for g in gradients if g is not None]
        self.at_optimizer += 1
        if present:
            weight = self.unscaled_weight()
            if weight != 1.0:
                for gradient in present:
                    gradient.mul_(weight)
            combined.all_reduce_sum(present)
            for gradient in present:  # the mean
                gradient.div_(self.world_size)

    def _without_parallel(self, variables):
        """Some weight got no gradient (a model output that no loss uses, say):
        DistributedDataParallel's reducer then never finishes, and fails at the
        next step. This step's gradients are averaged here instead, and so are
        every later step's, without the overlap."""
        unused = [v.path for v in variables if _grad(v) is None]
        logger.info("%d trainable weights of %s got no gradient (%s); its "
                    "gradients are averaged when the optimizer gets them, not "
                    "during backward.", len(unused), self.model.name, ", ".join(unused[:3]))
        self.parallel, self.whole = None, False

    def _warn_if_unaveraged(self):
        import warnings

        if all(w.value.grad is None for w in self.model.trainable_weights):
            return
        self.warned = True
        name = f"{type(self.model).__name__}.train_step"
        warnings.warn(
            f"{name} ran backward without calling the model itself and did not pass "
            "the gradients to the model's optimizer (self.optimizer.apply or "
            "apply_gradients), where agnostic averages them across the "
            f"{self.world_size} processes: the weights it updated some other way "
            "(another optimizer, a manual update) train differently from one "
            "device and drift apart between processes. Call the model as "
            "self(x), or apply gradients through self.optimizer.",
            errors.UnaveragedGradientsWarning, stacklevel=3,
        )


def empty_shares(model):
    """A process given no rows of a batch (one smaller than the processes)
    takes its step with losses of 0 (compat.torch_empty_share)."""
    def wrapper(step):
        def run(*args, **kwargs):
            rows = batching.num_samples(batching.step_data(args, kwargs))
            with torch_empty_share.when(rows == 0):
                return step(*args, **kwargs)

        return run

    return [(model, name, wrapper) for name in ("train_step", "test_step")]


def _weighted_mean(steps, bucket):
    """DistributedDataParallel's communication hook: a bucket of gradients
    averaged over the processes, each weighted by its share of the batch."""
    import torch.distributed as dist

    values = bucket.buffer()
    values.mul_(steps.unscaled_weight() / steps.world_size)
    return dist.all_reduce(values, async_op=True).get_future().then(
        lambda done: done.value()[0])
