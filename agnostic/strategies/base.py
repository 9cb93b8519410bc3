"""What every strategy shares: the interface and the helpers that patch one
model's methods."""
import functools


class Strategy:
    """Executes a Plan: distributes the program's model, in place, and
    compiles it with the program's arguments (an in_place.CompileCall)."""

    name = ""

    def __init__(self, plan, cpu_merge=True, cpu_relocation=False, sync_batch_norm=True):
        self.plan = plan
        self.cpu_merge = cpu_merge
        self.cpu_relocation = cpu_relocation
        self.sync_batch_norm = sync_batch_norm

    def compile(self, model, call):
        raise NotImplementedError


def scope_replicas():
    """The number of replicas of the tf.distribute strategy in scope."""
    import tensorflow as tf

    return tf.distribute.get_strategy().num_replicas_in_sync


def wrap_method(model, name, wrapper):
    """Replaces `model.name` on this instance by `wrapper(original)`;
    `unwrap(model)` puts back what was there before agnostic."""
    original = getattr(model, name)
    originals = model.__dict__.setdefault("_agnostic_originals", {})
    originals.setdefault(name, model.__dict__.get(name))  # None: the class's
    setattr(model, name, functools.wraps(original)(wrapper(original)))


def unwrap(model):
    """Undoes every wrap_method on `model` (compiling again starts clean)."""
    for name, original in model.__dict__.pop("_agnostic_originals", {}).items():
        if original is None:
            model.__dict__.pop(name, None)
        else:
            setattr(model, name, original)


def start_again(model):
    """`model` without the wrappers of an earlier backend_agnostic_compile
    (fine-tuning: freeze layers, compile again), which would otherwise apply
    twice; its weights, flags and state are its own throughout."""
    unwrap(model)
    optimizers = [value for value in vars(model).values()
                  if "_agnostic_originals" in getattr(value, "__dict__", {})]
    for optimizer in optimizers + [getattr(o, "inner_optimizer", None) for o in optimizers]:
        if optimizer is not None:
            unwrap(optimizer)
    return model
