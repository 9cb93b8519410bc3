"""torch-ddp: one process per device, gradients averaged across processes.

Keras 3.13-3.15 have no multi-device `fit` on torch, so this strategy supplies the
data-parallel parts around Keras's own training loop: the same initial weights
everywhere (broadcast from rank 0), a shard of each global batch per process,
gradients averaged by torch's DistributedDataParallel while backward runs,
each share weighted by its rows (engines.torch.gradients), and what each
process computes from its rows combined (engines.torch.combined). The job
itself is joined once per process (engines.torch.join). Keras 3.16 does the
averaging and the metrics itself (compat.torch_keras_ddp), and agnostic adds
only the weights. Only the chief prints or writes files.
"""
import logging

from agnostic.engines.torch import batch_view, combined, gradients, join
from agnostic import collectives
from agnostic.fit import batch_norm, global_batch, in_place, pipeline
from agnostic.strategies import base

logger = logging.getLogger("agnostic")


class TorchDDPStrategy(base.Strategy):
    name = "torch-ddp"
    # Whether each process's replica spans several devices (device
    # parallelism within, see device_parallel): DistributedDataParallel then
    # takes no device ids.
    multi_device = False

    def replica(self, model, call, rank):
        """This process's model, compiled: the program's own."""
        call(model)
        return model

    def compile(self, model, call):
        import torch.distributed as dist

        group = join.join(self.plan)
        world = group.world_size
        model = self.replica(model, call, group.rank)
        # Decided by the plan, from the model: who averages the gradients.
        keras_ddp = self.plan.keras_ddp
        by_keras = self.plan.gradients_by == "keras"
        if by_keras:
            logger.info("Keras %s trains under DistributedDataParallel itself; "
                        "its gradient averaging is used.", keras_version())
        # Not yet where Keras 3.16 trains under DistributedDataParallel
        # itself: its processes compute on their own shares there.
        global_view = self.global_view and not keras_ddp
        optimizers = in_place.optimizers(model, call)
        trackers = [] if global_view else in_place.mean_trackers(model)
        moving, synchronized = batch_norm.synchronize(model, "torch", self.sync_batch_norm)
        # What the processes combine, from rank 0's weights on. Under the
        # global view every process's metrics and logs are the whole batch's.
        combined.broadcast([v.value for v in model.variables])
        statistics = [] if synchronized else \
            combined.average_moving_statistics(model, moving, world)
        layer_state = combined.combine_layer_state(model, moving, world)
        metrics = [] if global_view or keras_ddp else combined.aggregate_metrics(model)
        logs = [] if global_view else combined.global_step_logs(model)
        # Before the gradients' averaging wraps the optimizers: it runs first.
        # Its own wraps apply last (outermost).
        outermost = self.split_state(model, optimizers, group.rank, world)
        averaged = gradients.average(model, world, self.multi_device, optimizers, trackers,
                                     by_keras, global_view)
        # The step's wrappers, innermost first, applied by pipeline.wrap.
        wraps = statistics + averaged + metrics + logs + gradients.empty_shares(model) \
            + layer_state
        if global_view:
            wraps += global_batch.see_the_global_batch(model, batch_view.maker(world))
        wraps += outermost
        processes = pipeline.Processes(group.rank, world, barrier=dist.barrier,
                                       share=collectives.torch_share)
        pipeline.wrap(model, world, processes=processes, even_shares=False,
                      per_replica_calls=True, wraps=wraps)
        return model

    def split_state(self, model, optimizers, rank, world_size):
        """Where each process keeps part of the weights and optimizer state
        (torch-sharded), and the wraps that keep them so; here every process
        keeps all of them."""
        return []


def keras_version():
    import keras

    return keras.__version__
