"""The program's own keras.metrics.Metric subclass (keras.io "Creating
custom metrics"), passed to compile and read by the program itself after
fit and after evaluate, on every process: its variables hold one device's
state, not one replica's share of it."""
from harness import compile, digits, finish, path  # noqa: I001

import json
import os

import keras
from keras import ops


class CategoricalTruePositives(keras.metrics.Metric):
    def __init__(self, name="categorical_true_positives", **kwargs):
        super().__init__(name=name, **kwargs)
        self.true_positives = self.add_variable(shape=(), name="ctp", initializer="zeros")
        self.seen = self.add_variable(shape=(), name="seen", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = ops.argmax(y_pred, axis=1)
        values = ops.cast(ops.equal(ops.cast(ops.reshape(y_true, (-1,)), "int32"),
                                    ops.cast(y_pred, "int32")), "float32")
        if sample_weight is not None:
            values = ops.multiply(values, ops.cast(sample_weight, "float32"))
        self.true_positives.assign_add(ops.sum(values))
        self.seen.assign_add(ops.cast(ops.shape(y_true)[0], "float32"))

    def result(self):
        return self.true_positives / ops.maximum(self.seen, 1.0)

    def reset_state(self):
        self.true_positives.assign(0.0)
        self.seen.assign(0.0)


keras.utils.set_random_seed(3)
x, y = digits(320)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
metric = CategoricalTruePositives()
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=[metric])
history = model.fit(x, y, batch_size=33, epochs=2, shuffle=False, verbose=0)
after_fit = [float(ops.convert_to_numpy(v)) for v in metric.variables]
after_fit.append(float(ops.convert_to_numpy(metric.result())))
evaluation = model.evaluate(x[:100], y[:100], batch_size=33, verbose=0, return_dict=True)
after_evaluate = [float(ops.convert_to_numpy(v)) for v in metric.variables]
after_evaluate.append(float(ops.convert_to_numpy(metric.result())))
# Each process writes what its own metric holds; the test reads them all.
with open(path(f"metric-{os.getpid()}.json"), "w") as handle:
    json.dump({"after_fit": after_fit, "after_evaluate": after_evaluate}, handle)
finish(model, history, evaluation, after_fit=after_fit, after_evaluate=after_evaluate)
