"""TensorFlow: tf.distribute strategies (mirrored, central storage, multi-worker)
and the global view of a step through the replica context."""
