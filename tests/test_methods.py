"""agnostic/methods.py: a strategy's wrappers, applied on the instance only,
in one place, and undone when the model is compiled again."""
from agnostic import methods


class Step:
    def train_step(self, data):
        return [data]


def tagged(name):
    def wrapper(original):
        def run(data):
            return original(data) + [name]

        return run

    return wrapper


def test_wraps_apply_in_their_order_the_first_innermost_and_come_off_again():
    step, other = Step(), Step()
    methods.wrap_all([(step, "train_step", tagged("gradients")),
                      (step, "train_step", tagged("global batch"))])
    assert step.train_step(0) == [0, "gradients", "global batch"]
    assert other.train_step(0) == [0]  # the instance only, never the class
    assert Step.train_step(step, 0) == [0]
    methods.unwrap(step)
    assert step.train_step(0) == [0] and "train_step" not in vars(step)


class Compiled:
    def compile(self, optimizer, loss=None):
        return ("keras", optimizer, loss)


def test_compiling_again_runs_what_start_again_was_given_and_keras_stays_reachable():
    model, calls = Compiled(), []
    methods.start_again(model, again=lambda *args, **kwargs: calls.append((args, kwargs)))
    model.compile("adam", loss="mse")
    assert calls == [((model, "adam"), {"loss": "mse"})]
    assert methods.original(model, "compile")("sgd") == ("keras", "sgd", None)
    # The wrapper keeps compile's signature, which backend_agnostic_compile checks.
    import inspect
    assert list(inspect.signature(model.compile).parameters) == ["optimizer", "loss"]
    methods.start_again(model)  # compiled again, or a compile that failed: nothing left
    assert model.compile("sgd") == ("keras", "sgd", None) and "compile" not in vars(model)
    assert methods.original(model, "compile")("sgd") == ("keras", "sgd", None)
