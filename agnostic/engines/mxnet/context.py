"""mxnet-context: keras-mxnet's `compile(context=[...])` over the plan's devices.

Keras 2.2 on MXNet (keras-mxnet 2.2.4.3, mxnet 1.9.1, Python 3.8) trains one
model on several contexts itself, so the model is compiled in place.
"""
from agnostic.fit import pipeline
from agnostic.compat import mxnet_kvstore
from agnostic.strategies import base


class MxnetContextStrategy(base.Strategy):
    name = "mxnet-context"

    def compile(self, model, call):
        # cpu_merge: the key-value store that sums the gradients: "local" on
        # the CPU (the legacy merge), "device" on the accelerators.
        kvstore = "local" if self.cpu_merge else "device"
        call(model, context=list(self.plan.devices))
        # keras-mxnet reads the store only from Model(..., kvstore=...) and
        # uses it when it binds, at the first batch; set it for this model.
        mxnet_kvstore.use_kvstore(model, kvstore)
        # Each context's loss is the mean over its slice of the batch, and the
        # store sums the contexts' gradients: N times the one-device gradient.
        # Rescaling by 1/N gives exactly the one-device step.
        model.optimizer.rescale_grad = 1.0 / self.plan.num_replicas
        pipeline.wrap(model, self.plan.num_replicas)
        return model
