"""The user's model trains on every device itself: compiled with the
program's own arguments inside the plan's scope, its existing state moved
into that scope.

Nothing is cloned: the model the program holds is the one `fit` trains,
with its layers as written (custom layers, Lambda, adapted preprocessing),
its trainable flags, its own `compile` signature and its steps. Its state
made before the call (weights, adapted statistics, seed generators, the
optimizers and metrics passed to compile or held by the model) is made
again in the scope; state made later (a lazily built model, the optimizer's
slots) is made there by Keras itself, since the model's steps run in it.
"""
from agnostic import methods
from agnostic.compat import keras_variables


class CompileCall:
    """The program's arguments to compile, passed on as given; `before` and
    `after`: what the strategy does to the model right before and after
    Keras compiles it (see `around`)."""

    def __init__(self, args, kwargs, before=(), after=()):
        self.args, self.kwargs = tuple(args), dict(kwargs)
        self.before, self.after = tuple(before), tuple(after)

    def __call__(self, model, **extra):
        """Keras's compile (the model's own, not the wrapper that compiles it
        through agnostic again)."""
        for step in self.before:
            step(model)
        methods.original(model, "compile")(*self.args, **self.kwargs, **extra)
        for step in self.after:
            step(model)

    def around(self, before=None, after=None):
        """This call with `before(model)` run right before Keras's compile
        (what compile reads) and `after(model)` right after it (what compile
        sets), wherever the strategy compiles."""
        return CompileCall(self.args, self.kwargs, self.before + ((before,) if before else ()),
                           self.after + ((after,) if after else ()))

    def objects(self, kind):
        """The instances of `kind` among the arguments, nested ones included."""
        found = []

        def visit(value):
            if isinstance(value, kind):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    visit(item)
            elif isinstance(value, dict):
                for item in value.values():
                    visit(item)

        visit(list(self.args) + list(self.kwargs.values()))
        return found

    def optimizers(self):
        """The optimizers given: instances, nested ones included, and a name
        passed as compile's `optimizer` ("adam"), as compile takes it."""
        import keras

        given = self.objects(keras.optimizers.Optimizer)
        named = self.kwargs.get("optimizer", self.args[0] if self.args else None)
        if isinstance(named, str):
            given.append(named)
        return given


def optimizers(model, call):
    """Every optimizer the model trains with: compile's, the arguments', the
    model's own attributes (a GAN's two), a loss-scale optimizer's inner one."""
    import keras

    found = call.objects(keras.optimizers.Optimizer)
    found += [getattr(model, "optimizer", None)]
    found += [value for value in vars(model).values()
              if isinstance(value, keras.optimizers.Optimizer)]
    found += [getattr(optimizer, "inner_optimizer", None) for optimizer in found]
    return methods.unique(found)


def mean_trackers(model):
    """The model's keras.metrics.Mean trackers (the guides' `loss_tracker`):
    a step of the program's own updates them with one value for its batch,
    and no weight."""
    import keras

    found = list(model.metrics) + [value for value in vars(model).values()
                                   if isinstance(value, keras.metrics.Metric)]
    return methods.unique([metric for metric in found if type(metric) is keras.metrics.Mean])


def state(model, call):
    """Every Keras variable the model's training reads or writes."""
    import keras

    variables = list(model.variables)
    metrics = call.objects(keras.metrics.Metric) + list(model.metrics)
    metrics += [value for value in vars(model).values()
                if isinstance(value, keras.metrics.Metric)]
    for metric in methods.unique(metrics):
        variables += metric.variables
    for optimizer in optimizers(model, call):
        variables += optimizer.variables
    return methods.unique(variables)


def compile_in(model, scope, call, placed=None):
    """Compiles `model` inside `scope` and makes its existing state again
    there (each variable for which `placed(variable)` is not true). Returns
    the optimizers the model trains with (`optimizers`) and its Mean
    trackers (`mean_trackers`), found once compiled."""
    with scope:
        call(model)
        trained_with = optimizers(model, call)
        trackers = mean_trackers(model)
        for variable in state(model, call):
            if placed is None or not placed(variable):
                keras_variables.made_again(variable)
    return trained_with, trackers
