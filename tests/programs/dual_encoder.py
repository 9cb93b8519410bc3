"""keras.io "Natural language image search with a Dual Encoder", shrunk:
two towers embed two views of a digit (its left and right halves), and the
loss is a softmax over the batch's similarity matrix, each row's other view
its target: a loss over the whole batch. PROGRAM_OWN_STEP=1: computed in a
train_step of the program's own, as keras.io writes it; else as a compiled
loss function over the two towers' outputs, put side by side."""
from harness import ENGINE, compile, digits, finish  # noqa: I001

import os

import keras
from keras import layers, ops

OWN_STEP = os.environ.get("PROGRAM_OWN_STEP") == "1"


def tower(name):
    return keras.Sequential([keras.Input((32,)), layers.Dense(24, activation="relu"),
                             layers.Dense(8)], name=name)


def in_batch_softmax(left, right, temperature=0.5):
    logits = ops.matmul(left, ops.transpose(right)) / temperature
    targets = ops.arange(ops.shape(logits)[0])
    return ops.mean(keras.losses.sparse_categorical_crossentropy(
        targets, logits, from_logits=True))


class DualEncoder(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.left_tower, self.right_tower = tower("left"), tower("right")
        if OWN_STEP:
            self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, features):
        return ops.concatenate([self.left_tower(features["left"]),
                                self.right_tower(features["right"])], axis=-1)

    @property
    def metrics(self):
        return [self.loss_tracker] if OWN_STEP else super().metrics

    def train_step(self, *arguments):  # JAX's takes (state, data)
        if not OWN_STEP:
            return super().train_step(*arguments)
        data = arguments[0]
        features, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        if ENGINE == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                loss = self.pair_loss(features)
            gradients = tape.gradient(loss, self.trainable_weights)
        else:
            self.zero_grad()
            loss = self.pair_loss(features)
            loss.backward()
            gradients = [v.value.grad for v in self.trainable_weights]
        self.optimizer.apply(gradients, self.trainable_weights)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    def pair_loss(self, features):
        left = self.left_tower(features["left"], training=True)
        right = self.right_tower(features["right"], training=True)
        return in_batch_softmax(left, right)


def compiled_loss(y_true, y_pred):
    return in_batch_softmax(y_pred[:, :8], y_pred[:, 8:])


keras.utils.set_random_seed(7)
x, _ = digits(322)
features = {"left": x[:, :32], "right": x[:, 32:]}
model = DualEncoder()
model(features)  # built before compile, as keras.io's is by its first call
if OWN_STEP:
    model = compile(model, optimizer=keras.optimizers.SGD(0.05))
    history = model.fit(features, batch_size=35, epochs=2, shuffle=False, verbose=0)
    evaluation = None
else:
    model = compile(model, optimizer=keras.optimizers.SGD(0.05), loss=compiled_loss)
    history = model.fit(features, x[:, :1], batch_size=35, epochs=2, shuffle=False,
                        verbose=0)
    evaluation = model.evaluate(features, x[:, :1], batch_size=35, verbose=0)
finish(model, history, evaluation)
