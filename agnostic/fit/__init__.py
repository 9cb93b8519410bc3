"""What wraps the user's fit, evaluate and predict once a strategy has
compiled the model: the shares of a batch (batching, sharding), the global
view of what a step computes over the batch (global_batch, layer_state,
batch_norm), the wrapped methods themselves (pipeline, in_place, methods)
and the collectives they use."""
