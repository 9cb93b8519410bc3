"""Each engine's strategies and helpers, one folder per engine with the same
module names where they do the same thing (batch_view, device_parallel,
sharded, ...), as Keras's own backend folders are laid out. Nothing here is
imported until the registry (agnostic.strategies) names a strategy, or the
start-up set-up names an engine: each folder imports its engine."""
