"""keras-mxnet 2.2.4.3 reads its key-value store (where the contexts'
gradients are summed) only from `Model(..., kvstore=...)`, into `_kvstore`,
and uses it when it binds, at the first batch."""
from agnostic.compat import versions


def use_kvstore(model, kvstore):
    model._kvstore = kvstore


def probe(keras):
    """What `use_kvstore` relies on (agnostic/compat/registry.py): a model
    holds its store in `_kvstore` ("device" unless given), which the MXNet
    model's bind passes to `init_optimizer` (read from its source)."""
    import inspect

    inputs = keras.layers.Input((2,))
    model = keras.models.Model(inputs, keras.layers.Dense(1)(inputs))
    versions.expect(vars(model).get("_kvstore") == "device",
                    "keras-mxnet's Model._kvstore (its key-value store)")
    versions.expect("init_optimizer(kvstore=self._kvstore" in inspect.getsource(type(model)),
                    "keras-mxnet binding the model with init_optimizer(kvstore=self._kvstore)")
