"""What tf-device-parallel and torch-device-parallel share: each call placed
with agnostic.device() runs on its device.

Each placed layer's variables are made again (torch: moved) in the device
scope of its first call, so they live there (a layer called again under
another device is read from there, as TensorFlow does); then every call of
the copy runs each placed node in its own device scope. TensorFlow copies
tensors between devices itself; on torch, the node's tensor inputs are
moved to its device (an unplaced call's to torch's default device), the
model's outputs back to where its inputs came from, and each optimizer slot
is made on its weight's device.
"""
from agnostic.plan import placement
from agnostic import methods
from agnostic.compat import keras_nodes, keras_variables


def placed_model(plan, model, compile_call, rank=0):
    """`model`, compiled, with each placed call on its device:
    replica `rank`'s devices stand in for the first replica's, which the
    plan's placements name."""
    import keras

    on_torch = plan.backend == "torch"
    per_replica = len(plan.devices) // plan.num_replicas
    own = dict(zip(plan.devices[:per_replica],
                   plan.devices[rank * per_replica:(rank + 1) * per_replica]))

    def engine_name(name):
        name = own.get(name, name)
        return _torch_device(name) if on_torch else name

    placed = {call: engine_name(name) for call, name in plan.placements}
    calls = keras_nodes.ordered_calls(model)
    devices = {id(node): placed[call] for call, node in calls if call in placed}
    if on_torch:
        # An unplaced call runs on torch's default device, with its inputs
        # moved there from a placed call's device.
        default = _torch_default_device()

        def run_of_node(node):
            return _moved_to(devices.get(id(node), default))
    else:
        def run_of_node(node):
            name = devices.get(id(node))
            return None if name is None else _scoped(name)

    keras_nodes.run_nodes_in(model, run_of_node)
    first = {layer: engine_name(name) for layer, name in
             placement.first_devices(calls, plan.placements).items()}
    for layer in model.layers:
        if layer.name in first:
            with keras.device(first[layer.name]):
                for variable in layer.variables:
                    if on_torch:
                        keras_variables.moved(variable, first[layer.name])
                    else:
                        keras_variables.made_again(variable)
    compile_call(model)
    if on_torch:
        methods.wrap_method(model, "call", _outputs_beside_inputs)
        methods.wrap_method(model.optimizer, "add_variable_from_reference", _beside_reference)
    return model


def _torch_device(name):
    """A plan's device name as torch names it: the CPU devices of a machine
    without accelerators ("cpu:1") are all torch's one CPU."""
    return name if name.startswith("cuda") else "cpu"


def _torch_default_device():
    import torch

    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"


def _beside_reference(add_variable_from_reference):
    """torch: an optimizer's slot (momentum, Adam's moments) is made on its
    weight's device, where the update reads both (TensorFlow colocates them
    itself)."""
    import keras

    def add(reference_variable, *args, **kwargs):
        device = getattr(getattr(reference_variable, "value", None), "device", None)
        if device is None:
            return add_variable_from_reference(reference_variable, *args, **kwargs)
        with keras.device(str(device)):
            return add_variable_from_reference(reference_variable, *args, **kwargs)

    return add


def _scoped(name):
    import keras

    def run(operation, args, kwargs):
        with keras.device(name):
            return operation(*args, **kwargs)

    return run


def _moved_to(name):
    """torch: `_scoped`, with the tensor inputs moved to the device first."""
    import keras
    import torch

    scoped = _scoped(name)

    def move(value):
        return value.to(name) if isinstance(value, torch.Tensor) else value

    def run(operation, args, kwargs):
        return scoped(operation, *keras.tree.map_structure(move, (args, kwargs)))

    return run


def _outputs_beside_inputs(call):
    """The outputs of the last placed calls go back to the device the inputs
    came from, where Keras's loss has the targets."""
    import keras
    import torch

    def run(inputs, *args, **kwargs):
        outputs = call(inputs, *args, **kwargs)
        first = next((x for x in keras.tree.flatten(inputs) if isinstance(x, torch.Tensor)),
                     None)
        if first is None:
            return outputs
        return keras.tree.map_structure(
            lambda y: y.to(first.device) if isinstance(y, torch.Tensor) else y, outputs)

    return run
