"""TensorFlow's MirroredStrategy numbers its all-reduce groups from
`_collective_key_base` (TensorFlow 2.21, "set only in tests"); the runtime
remembers a group's size for the whole process, so a strategy over 4 devices
made after one over 2 fails mid-step ("joining a group with size 4, but that
group has size 2") unless each strategy has its own range of numbers."""
from agnostic.compat import versions


def probe(keras):
    """What `mirrored_strategy` relies on (agnostic/compat/registry.py): a
    MirroredStrategy numbers its groups from the `_collective_key_base` set
    before its __init__ (one made here on one CPU: nothing runs)."""
    strategy = mirrored_strategy(["/cpu:0"], None, 4321)
    keys = getattr(strategy.extended, "_collective_keys", None)
    devices = list(strategy.extended.worker_devices)
    versions.expect(keys is not None and keys.get_group_key(devices) == 4322,
                    "MirroredStrategy numbering its all-reduce groups from "
                    "_collective_key_base (TensorFlow)")


def mirrored_strategy(devices, cross_device_ops, key_base):
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    strategy._collective_key_base = key_base
    strategy.__init__(devices=list(devices), cross_device_ops=cross_device_ops)
    return strategy
