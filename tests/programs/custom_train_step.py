"""The Keras guide "Customizing what happens in fit()": a subclassed model
with its own train_step and test_step, a loss tracker and a metric, in the
variant for the engine that runs it; PROGRAM_ROWS digits (256) in batches
of PROGRAM_BATCH rows (32),
evaluated in batches of twice as many and one, which no device count
divides."""
from harness import ENGINE, compile, digits, finish  # noqa: I001

import os

import keras
from keras import ops

OWN_OPTIMIZER = os.environ.get("PROGRAM_OWN_OPTIMIZER") == "1"
BATCH = int(os.environ.get("PROGRAM_BATCH", "32"))
ROWS = int(os.environ.get("PROGRAM_ROWS", "256"))


class CustomModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.seen = keras.metrics.Sum(name="seen")  # samples trained on: a count
        self.loss_fn = keras.losses.MeanSquaredError()
        # As a GAN's step applies its own optimizers (TensorFlow variant).
        self.own_optimizer = keras.optimizers.SGD(0.1) if OWN_OPTIMIZER else None

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric, self.seen]

    def train_step(self, *arguments):
        if ENGINE == "jax":
            return self.jax_train_step(*arguments)
        x, y = arguments[0]
        if ENGINE == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.loss_fn(y, y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            optimizer = self.own_optimizer or self.optimizer
            optimizer.apply(gradients, self.trainable_variables)
        else:  # torch
            import torch

            self.zero_grad()
            y_pred = self(x, training=True)
            loss = self.loss_fn(y, y_pred)
            loss.backward()
            weights = list(self.trainable_weights)
            with torch.no_grad():
                self.optimizer.apply([w.value.grad for w in weights], weights)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        self.seen.update_state(ops.cast(ops.shape(x)[0], "float32"))
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, *arguments):
        if ENGINE == "jax":
            return self.jax_test_step(*arguments)
        x, y = arguments[0]
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(self.loss_fn(y, y_pred))
        self.mae_metric.update_state(y, y_pred)
        self.seen.update_state(ops.cast(ops.shape(x)[0], "float32"))
        return {m.name: m.result() for m in self.metrics}

    # The guide's JAX variant: stateless, the state passed in and returned.
    def compute_loss_and_updates(self, trainable, non_trainable, x, y, training=False):
        y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x,
                                                    training=training)
        return self.loss_fn(y, y_pred), (y_pred, non_trainable)

    def jax_train_step(self, state, data):
        import jax

        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y = data
        gradient_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
        (loss, (y_pred, non_trainable)), gradients = gradient_fn(
            trainable, non_trainable, x, y, training=True)
        trainable, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, gradients, trainable)
        logs, metrics_variables = self.stateless_metrics(metrics_variables, loss, x, y, y_pred)
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)

    def jax_test_step(self, state, data):
        trainable, non_trainable, metrics_variables = state
        x, y = data
        loss, (y_pred, non_trainable) = self.compute_loss_and_updates(
            trainable, non_trainable, x, y)
        logs, metrics_variables = self.stateless_metrics(metrics_variables, loss, x, y, y_pred)
        return logs, (trainable, non_trainable, metrics_variables)

    def stateless_metrics(self, variables, loss, x, y, y_pred):
        logs, updated, start = {}, [], 0
        for metric, arguments in ((self.loss_tracker, (loss,)), (self.mae_metric, (y, y_pred)),
                                  (self.seen, (ops.cast(ops.shape(x)[0], "float32"),))):
            own = variables[start:start + len(metric.variables)]
            start += len(metric.variables)
            own = metric.stateless_update_state(own, *arguments)
            logs[metric.name] = metric.stateless_result(own)
            updated += own
        return logs, updated


keras.utils.set_random_seed(3)
x, digit = digits(ROWS)
y = ops.one_hot(digit, 10)
y = keras.ops.convert_to_numpy(y).astype("float32")
inputs = keras.Input((64,))
hidden = keras.layers.Dense(32, activation="relu")(inputs)
model = CustomModel(inputs, keras.layers.Dense(10)(hidden))
model = compile(model, optimizer=keras.optimizers.SGD(0.1))
history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=2 * BATCH + 1, verbose=0, return_dict=True)
finish(model, history, evaluation)
