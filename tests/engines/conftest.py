"""Each engine's own tests (tests/engines/<engine>/, as agnostic/engines/)
run in that engine's tox environment only."""
import os

ENGINES = ("tensorflow", "jax", "mxnet", "torch")
collect_ignore = [engine for engine in ENGINES if engine != os.environ.get("KERAS_BACKEND")]
