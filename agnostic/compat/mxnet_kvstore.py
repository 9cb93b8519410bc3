"""keras-mxnet 2.2.4.3 reads its key-value store (where the contexts'
gradients are summed) only from `Model(..., kvstore=...)`, into `_kvstore`,
and uses it when it binds, at the first batch."""


def use_kvstore(model, kvstore):
    model._kvstore = kvstore
