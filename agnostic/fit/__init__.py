"""What wraps the user's fit, evaluate and predict once a strategy has
compiled the model: each process's part of the data (sharding), the global
view of what a step computes over the batch (global_batch, layer_state,
batch_norm) and the wrapped methods themselves (pipeline, in_place). The
pieces every stage uses (methods, batching, collectives) lie below, at the
package's top."""
