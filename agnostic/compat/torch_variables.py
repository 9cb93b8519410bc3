"""torch, Keras 3.13-3.16: variables whose reads and assigns agnostic sees
first (torch-sharded's split weights, engines/torch/weight_shards.py).

Keras's torch `Variable` keeps its `torch.nn.Parameter` in `_value`, returns
it from the `value` property (what Keras's ops read, through
`convert_to_tensor` and `__torch_function__`) and writes it in
`_direct_assign` (what `assign` calls outside a stateless scope). A layer's
own variables are its `_trainable_variables` and `_non_trainable_variables`;
`_flatten_layers` reaches every layer of a model.

`intercept` gives one variable a subclass of its own class (on that
instance only; the class itself is untouched) whose `value` asks its holder
first and whose `_direct_assign` goes through it; `release` puts the class
back.
"""
import os
import sys

from agnostic.compat import versions

# Keras's torch trainer: between backward and the optimizer's update, its
# train_step reads each weight's gradient, `variable.value.grad`, and no
# weight's values (`reads_only_gradients`).
TRAINER = os.path.join("keras", "src", "backend", "torch", "trainer.py")

# The variable's key in its __dict__ for its holder.
HOLDER = "_agnostic_held"
_subclasses = {}  # a Keras variable class: its intercepting subclass
_originals = {}  # an intercepting subclass: its Keras class


def parameter(variable):
    """The torch parameter a Keras variable holds (its layer's, its module's)."""
    return variable._value


def own_variables(layer):
    """The variables `layer` made itself (not its nested layers')."""
    return list(layer._trainable_variables) + list(layer._non_trainable_variables)


def layers(model):
    """`model` and every layer in it, nested ones included."""
    return list(model._flatten_layers(include_self=True))


def reads_only_gradients(frame):
    """Whether the code of `frame` (a variable's reader) is Keras's torch
    trainer, which reads weights only for their gradients after backward."""
    return frame.f_code.co_filename.endswith(TRAINER)


def intercept(variable, holder):
    """`variable`'s reads call `holder.wanted(reader)` first (`reader`: the
    reading code's frame); its assigns call `holder.assigned(assign, value)`,
    `assign` being Keras's own."""
    variable.__dict__[HOLDER] = holder
    variable.__class__ = _subclass(type(variable))


def release(variable):
    """`variable` as Keras made it again."""
    variable.__dict__.pop(HOLDER, None)
    variable.__class__ = _originals.get(type(variable), type(variable))


def _subclass(kind):
    if kind in _originals:
        return kind
    if kind not in _subclasses:
        def value(self):
            holder = self.__dict__.get(HOLDER)
            if holder is not None:
                holder.wanted(sys._getframe(1))
            return kind.value.fget(self)

        def _direct_assign(self, new):
            holder = self.__dict__.get(HOLDER)
            if holder is None:
                return kind._direct_assign(self, new)
            return holder.assigned(lambda given: kind._direct_assign(self, given), new)

        made = type(kind.__name__, (kind,), {
            "value": property(value), "_direct_assign": _direct_assign,
            "__module__": kind.__module__, "__doc__": kind.__doc__})
        _subclasses[kind], _originals[made] = made, kind
    return _subclasses[kind]


def probe(keras):
    """What this module relies on (agnostic/compat/registry.py)."""
    import torch

    class Holder:
        reads, assigns = 0, 0

        def wanted(self, reader):
            self.reads += 1
            self.reader = reader.f_code.co_filename

        def assigned(self, assign, value):
            self.assigns += 1
            assign(value)

    dense = keras.layers.Dense(2)
    model = keras.Sequential([keras.Input((3,)), dense])
    kernel = dense.kernel
    if not isinstance(getattr(kernel, "_value", None), torch.nn.Parameter):
        raise versions.moved("Variable._value (the torch Parameter a variable holds)")
    if not isinstance(getattr(type(kernel), "value", None), property) or \
            not callable(getattr(type(kernel), "_direct_assign", None)):
        raise versions.moved("Variable.value (a property) and Variable._direct_assign")
    if [id(v) for v in own_variables(dense)] != [id(dense.kernel), id(dense.bias)] or \
            own_variables(model):
        raise versions.moved("Layer._trainable_variables and _non_trainable_variables "
                             "(a layer's own variables)")
    if dense not in layers(model) or model not in layers(model):
        raise versions.moved("Layer._flatten_layers(include_self=True)")
    holder = Holder()
    intercept(kernel, holder)
    try:
        keras.ops.matmul(keras.ops.ones((1, 3)), kernel)
        kernel.assign(keras.ops.zeros((3, 2)))
        if holder.reads < 1 or holder.assigns != 1 or float(keras.ops.sum(kernel)) != 0 \
                or not holder.reader.startswith(os.path.dirname(keras.__file__)):
            raise versions.moved("Variable.value read by ops and _direct_assign called by "
                                 "assign")
        if kernel.value is not parameter(kernel):
            raise versions.moved("Variable.value returning the parameter itself")
    finally:
        release(kernel)
    if type(kernel) is not keras.Variable and type(kernel).__mro__[1] in _originals:
        raise versions.moved("a released variable's class")
    _probe_trainer()


def _probe_trainer():
    import inspect

    from keras.src.backend.torch import trainer

    source = inspect.getsource(trainer)
    if not inspect.getsourcefile(trainer).endswith(TRAINER) or \
            ".value.grad for v in trainable_weights" not in source:
        raise versions.moved("the torch trainer's train_step reading `v.value.grad` after "
                             "backward")
