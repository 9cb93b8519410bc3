"""Each engine's own tests run in that engine's tox environment only."""
import os

ENGINE_TESTS = {
    "tensorflow": ("test_tf_mirrored.py", "test_tf_multi_worker.py"),
    "jax": ("test_jax_data_parallel.py",),
    "mxnet": ("test_mxnet_context.py",),
    "torch": ("test_torch_ddp.py",),
}
collect_ignore = [
    name for engine, names in ENGINE_TESTS.items() for name in names
    if engine != os.environ.get("KERAS_BACKEND")
]
