"""The Keras guide "Customizing what happens in fit()": a subclassed model
with its own train_step and test_step, a loss tracker and a metric, in the
variant for the engine that runs it."""
from harness import ENGINE, compile, digits, finish  # noqa: I001

import keras
from keras import ops


class CustomModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")
        self.loss_fn = keras.losses.MeanSquaredError()

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]

    def train_step(self, data):
        x, y = data
        if ENGINE == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.loss_fn(y, y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply(gradients, self.trainable_variables)
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
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(self.loss_fn(y, y_pred))
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}


keras.utils.set_random_seed(3)
x, digit = digits()
y = ops.one_hot(digit, 10)
y = keras.ops.convert_to_numpy(y).astype("float32")
inputs = keras.Input((64,))
hidden = keras.layers.Dense(32, activation="relu")(inputs)
model = CustomModel(inputs, keras.layers.Dense(10)(hidden))
model = compile(model, optimizer=keras.optimizers.SGD(0.1))
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
finish(model, history, evaluation)
