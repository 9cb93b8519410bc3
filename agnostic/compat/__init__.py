"""Every reach into an engine's private internals, and every patch of an
engine's behaviour (a metric variable's add, a step's logs, the model's
forward pass through DistributedDataParallel), each in a module named for
what it fixes, with the Keras versions it applies to and a test that fails
loudly, naming the version, when the internal moves: registry.py lists them,
each with the probe (its module's `probe`) that tests/compat/ runs.

Outside this package agnostic overrides only documented, public methods on
the instances it returns, as Keras's guides do in a subclass (`train_step`,
`get_metrics_result`, `fit`, `save`, the optimizer's `apply`).
"""
