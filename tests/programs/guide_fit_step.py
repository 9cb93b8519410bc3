"""keras.io's "Customizing what happens in fit()" guide as it is written today,
for the engine that runs it: a functional CustomModel whose train_step and
test_step compute the loss with `self.compute_loss`, update every metric in
`self.metrics` (the loss tracker, and the metrics `compile` was given, which
Keras keeps in one "compile_metrics" container) and return
`{m.name: m.result() for m in self.metrics}`: the compiled metrics nested in
one dict. Digits in batches of 33 (shares of different sizes), evaluated in
batches of 65; the logs after each batch recorded by a callback."""
from harness import ENGINE, compile, digits, finish  # noqa: I001

import keras


class CustomModel(keras.Model):
    def train_step(self, *arguments):
        if ENGINE == "jax":
            return self.jax_train_step(*arguments)
        x, y = arguments[0]
        if ENGINE == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                loss = self.compute_loss(y=y, y_pred=y_pred)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply(gradients, trainable_vars)
        else:  # torch
            import torch

            self.zero_grad()
            y_pred = self(x, training=True)  # Forward pass
            loss = self.compute_loss(y=y, y_pred=y_pred)
            loss.backward()
            trainable_weights = [v for v in self.trainable_weights]
            gradients = [v.value.grad for v in trainable_weights]
            with torch.no_grad():
                self.optimizer.apply(gradients, trainable_weights)
        # Update metrics (includes the metric that tracks the loss)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        # Return a dict mapping metric names to current value
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, *arguments):
        if ENGINE == "jax":
            return self.jax_test_step(*arguments)
        x, y = arguments[0]
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    # The guide's JAX variant: stateless, the state passed in and returned.
    def compute_loss_and_updates(self, trainable_variables, non_trainable_variables,
                                 x, y, training=False):
        y_pred, non_trainable_variables = self.stateless_call(
            trainable_variables, non_trainable_variables, x, training=training)
        loss = self.compute_loss(x, y, y_pred)
        return loss, (y_pred, non_trainable_variables)

    def jax_train_step(self, state, data):
        import jax

        (trainable_variables, non_trainable_variables, optimizer_variables,
         metrics_variables) = state
        x, y = data
        grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
        (loss, (y_pred, non_trainable_variables)), grads = grad_fn(
            trainable_variables, non_trainable_variables, x, y, training=True)
        trainable_variables, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable_variables)
        logs, new_metrics_vars = self.jax_metrics(metrics_variables, loss, y, y_pred)
        state = (trainable_variables, non_trainable_variables, optimizer_variables,
                 new_metrics_vars)
        return logs, state

    def jax_test_step(self, state, data):
        trainable_variables, non_trainable_variables, metrics_variables = state
        x, y = data
        loss, (y_pred, non_trainable_variables) = self.compute_loss_and_updates(
            trainable_variables, non_trainable_variables, x, y)
        logs, new_metrics_vars = self.jax_metrics(metrics_variables, loss, y, y_pred)
        return logs, (trainable_variables, non_trainable_variables, new_metrics_vars)

    def jax_metrics(self, metrics_variables, loss, y, y_pred):
        new_metrics_vars, logs = [], {}
        for metric in self.metrics:
            this_metric_vars = metrics_variables[
                len(new_metrics_vars): len(new_metrics_vars) + len(metric.variables)]
            if metric.name == "loss":
                this_metric_vars = metric.stateless_update_state(this_metric_vars, loss)
            else:
                this_metric_vars = metric.stateless_update_state(this_metric_vars, y, y_pred)
            logs[metric.name] = metric.stateless_result(this_metric_vars)
            new_metrics_vars += this_metric_vars
        return logs, new_metrics_vars


keras.utils.set_random_seed(5)
x, digit = digits(256)
y = keras.ops.convert_to_numpy(keras.ops.one_hot(digit, 10)).astype("float32")
inputs = keras.Input(shape=(64,))
hidden = keras.layers.Dense(32, activation="relu")(inputs)
model = CustomModel(inputs, keras.layers.Dense(10)(hidden))
model = compile(model, optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
# What the progress bar shows after each batch, as a callback gets it.
batches = []
after_batch = keras.callbacks.LambdaCallback(
    on_train_batch_end=lambda batch, logs: batches.append([float(logs["loss"]),
                                                           float(logs["mae"])]))
history = model.fit(x, y, batch_size=33, epochs=2, shuffle=False, verbose=0,
                    callbacks=[after_batch])
evaluation = model.evaluate(x, y, batch_size=65, verbose=0, return_dict=True)
finish(model, history, evaluation, batches=batches)
