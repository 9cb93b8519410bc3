"""keras.io "Customizing what happens in fit()": the GAN, a subclassed model
with its own compile (two optimizers, a loss) and train_step, in the variant
for the engine that runs it, on 8x8 digits with small dense networks.

The step draws its latent vectors and label noise with a SeedGenerator. With
PROGRAM_NOISE_AS_DATA=1 they come with the data instead (a dict batch), so
the run is the same on any number of devices. JAX: no guide has this GAN;
its variant does the same steps statelessly, and registers the two
optimizers' variables on the model, which makes them part of the state the
JAX trainer carries (it carries only `model.optimizer`'s otherwise).
PROGRAM_UNBUILT=1: TensorFlow's guide, which leaves `self.built = True` out."""
from harness import ENGINE, compile, digits, finish  # noqa: I001

import os

import keras
import numpy as np
from keras import layers, ops

NOISE_AS_DATA = os.environ.get("PROGRAM_NOISE_AS_DATA") == "1"
UNBUILT = os.environ.get("PROGRAM_UNBUILT") == "1"  # TensorFlow's plain fit needs no build


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.seed_generator = keras.random.SeedGenerator(1337)
        if not UNBUILT:
            self.built = True  # the torch guide's line; TensorFlow's leaves it out

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        if ENGINE == "jax":
            d_optimizer.build(self.discriminator.trainable_variables)
            g_optimizer.build(self.generator.trainable_variables)
            self.optimizer_state = d_optimizer.variables + g_optimizer.variables

    def draw(self, data, key, shape, uniform=False):
        if NOISE_AS_DATA:  # the label noise: (batch, 2) -> (2 * batch, 1), fake then real
            noise = data[key]
            return ops.concatenate([noise[:, :1], noise[:, 1:]], axis=0) if uniform else noise
        draw = keras.random.uniform if uniform else keras.random.normal
        return draw(shape, seed=self.seed_generator)

    def train_step(self, *arguments):
        if ENGINE == "jax":
            return self.jax_train_step(*arguments)
        data = arguments[0]
        if isinstance(data, (tuple, list)):
            data = data[0]
        real_images = data["images"] if NOISE_AS_DATA else data
        if ENGINE == "tensorflow":
            return self.tf_train_step(data, real_images)
        return self.torch_train_step(data, real_images)

    def tf_train_step(self, data, real_images):
        import tensorflow as tf

        batch_size = tf.shape(real_images)[0]
        random_latent_vectors = self.draw(data, "z1", (batch_size, self.latent_dim))
        generated_images = self.generator(random_latent_vectors)
        combined_images = tf.concat([generated_images, real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * self.draw(data, "noise", tf.shape(labels), uniform=True)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        random_latent_vectors = self.draw(data, "z2", (batch_size, self.latent_dim))
        misleading_labels = tf.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    def torch_train_step(self, data, real_images):
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        batch_size = real_images.shape[0]
        random_latent_vectors = self.draw(data, "z1", (batch_size, self.latent_dim))
        generated_images = self.generator(random_latent_vectors)
        real_images = torch.as_tensor(real_images, device=device)
        combined_images = torch.concat([generated_images, real_images], axis=0)
        labels = torch.concat([torch.ones((batch_size, 1), device=device),
                               torch.zeros((batch_size, 1), device=device)], axis=0)
        labels += 0.05 * self.draw(data, "noise", labels.shape, uniform=True)
        self.zero_grad()
        predictions = self.discriminator(combined_images)
        d_loss = self.loss_fn(labels, predictions)
        d_loss.backward()
        grads = [v.value.grad for v in self.discriminator.trainable_weights]
        with torch.no_grad():
            self.d_optimizer.apply(grads, self.discriminator.trainable_weights)
        random_latent_vectors = self.draw(data, "z2", (batch_size, self.latent_dim))
        misleading_labels = torch.zeros((batch_size, 1), device=device)
        self.zero_grad()
        predictions = self.discriminator(self.generator(random_latent_vectors))
        g_loss = self.loss_fn(misleading_labels, predictions)
        g_loss.backward()
        grads = [v.value.grad for v in self.generator.trainable_weights]
        with torch.no_grad():
            self.g_optimizer.apply(grads, self.generator.trainable_weights)
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    def jax_train_step(self, state, data):
        import jax

        trainable, non_trainable, optimizer_variables, metrics_variables = state
        if isinstance(data, (tuple, list)):
            data = data[0]
        real_images = data["images"] if NOISE_AS_DATA else data
        variables = self.trainable_variables + self.non_trainable_variables
        values = dict(zip(map(id, variables), list(trainable) + list(non_trainable)))

        def run(function, *pairs):  # function() at the step's current state, `pairs` on top
            mapping = [(v, values[id(v)]) for v in variables] + list(pairs)
            with keras.StatelessScope(state_mapping=mapping) as scope:
                result = function()
            values.update((id(v), scope.get_current_value(v)) for v in self.non_trainable_variables)
            return result

        def loss(weights, network, labels, function):
            return run(lambda: self.loss_fn(labels, function()), *zip(network, weights))

        def apply(optimizer, network, grads):
            new_weights, new_state = optimizer.stateless_apply(
                [values[id(v)] for v in optimizer.variables], grads,
                [values[id(v)] for v in network])
            values.update(zip(map(id, network), new_weights))
            values.update(zip(map(id, optimizer.variables), new_state))

        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = run(lambda: self.draw(data, "z1", (batch_size, self.latent_dim)))
        generated_images = run(lambda: self.generator(random_latent_vectors))
        combined_images = ops.concatenate([generated_images, real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * run(lambda: self.draw(data, "noise", ops.shape(labels), uniform=True))
        d_weights = self.discriminator.trainable_variables
        d_loss, grads = jax.value_and_grad(loss)(
            [values[id(v)] for v in d_weights], d_weights, labels,
            lambda: self.discriminator(combined_images))
        apply(self.d_optimizer, d_weights, grads)
        random_latent_vectors = run(lambda: self.draw(data, "z2", (batch_size, self.latent_dim)))
        misleading_labels = ops.zeros((batch_size, 1))
        g_weights = self.generator.trainable_variables
        g_loss, grads = jax.value_and_grad(loss)(
            [values[id(v)] for v in g_weights], g_weights, misleading_labels,
            lambda: self.discriminator(self.generator(random_latent_vectors)))
        apply(self.g_optimizer, g_weights, grads)
        with keras.StatelessScope(list(zip(self.metrics_variables, metrics_variables))) as scope:
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            logs = {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}
        metrics_variables = [scope.get_current_value(v) for v in self.metrics_variables]
        state = ([values[id(v)] for v in self.trainable_variables],
                 [values[id(v)] for v in self.non_trainable_variables])
        return logs, state + (optimizer_variables, metrics_variables)


keras.utils.set_random_seed(8)
latent_dim = 8
discriminator = keras.Sequential([
    keras.Input(shape=(8, 8, 1)),
    layers.Flatten(),
    layers.Dense(32),
    layers.LeakyReLU(negative_slope=0.2),
    layers.Dense(1),
], name="discriminator")
generator = keras.Sequential([
    keras.Input(shape=(latent_dim,)),
    layers.Dense(32),
    layers.LeakyReLU(negative_slope=0.2),
    layers.Dense(64, activation="sigmoid"),
    layers.Reshape((8, 8, 1)),
], name="generator")

all_digits, _ = digits(256, images=True)
if NOISE_AS_DATA:
    rng = np.random.default_rng(5)
    all_digits = {"images": all_digits,
                  "z1": rng.normal(size=(256, latent_dim)).astype("float32"),
                  "z2": rng.normal(size=(256, latent_dim)).astype("float32"),
                  "noise": rng.uniform(size=(256, 2)).astype("float32")}
gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
gan = compile(gan, d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
              g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
              loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
history = gan.fit(all_digits, batch_size=32, epochs=2, shuffle=False, verbose=0)
images = generator.predict(np.random.default_rng(6).normal(size=(8, latent_dim)), verbose=0)
finish(gan, history, images=images)
