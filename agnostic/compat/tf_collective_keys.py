"""TensorFlow's MirroredStrategy numbers its all-reduce groups from
`_collective_key_base` (TensorFlow 2.21, "set only in tests"); the runtime
remembers a group's size for the whole process, so a strategy over 4 devices
made after one over 2 fails mid-step ("joining a group with size 4, but that
group has size 2") unless each strategy has its own range of numbers."""


def mirrored_strategy(devices, cross_device_ops, key_base):
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
    strategy._collective_key_base = key_base
    strategy.__init__(devices=list(devices), cross_device_ops=cross_device_ops)
    return strategy
