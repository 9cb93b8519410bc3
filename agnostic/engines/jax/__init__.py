"""JAX: keras.distribution (data parallel, model parallel, sharded weights)."""
