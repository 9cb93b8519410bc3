"""torch: one process per device (DistributedDataParallel), the gradients
and the global view of a step across processes, and sharded weights."""
