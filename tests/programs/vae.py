"""keras.io "Variational AutoEncoder": the Sampling layer, functional encoder
and decoder, and the VAE model whose own train_step adds the reconstruction
and KL losses (keras.io's TensorFlow step; torch and JAX variants as the
"Customizing fit()" guides write theirs), on 8x8 digits with small networks.

PROGRAM_ADD_LOSS=1: a second model, functional, whose custom layer (no
**kwargs, no get_config) calls `self.add_loss(kl)`, trained with plain
compile(loss=...). PROGRAM_NOISE_AS_DATA=1: epsilon is an input given with
the data (GivenSampling), not drawn by Sampling's SeedGenerator, so the run
is the same on any number of devices."""
from harness import ENGINE, compile, digits, finish  # noqa: I001

import os

import keras
import numpy as np
from keras import layers, ops

NOISE_AS_DATA = os.environ.get("PROGRAM_NOISE_AS_DATA") == "1"
ADD_LOSS = os.environ.get("PROGRAM_ADD_LOSS") == "1"


class Sampling(layers.Layer):
    """Uses (z_mean, z_log_var) to sample z, the vector encoding a digit."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class GivenSampling(layers.Layer):
    def call(self, inputs):
        z_mean, z_log_var, epsilon = inputs
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class KLDivergence(layers.Layer):
    def call(self, inputs):
        z_mean, z_log_var = inputs
        kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
        self.add_loss(ops.mean(ops.sum(kl_loss, axis=1)) / 64.0)  # per pixel, as the loss
        return z_mean


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")
        if ENGINE != "tensorflow":  # no call(): JAX's and torch's trainers would build it
            self.built = True

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

    def vae_losses(self, data):
        images = data["images"] if NOISE_AS_DATA else data
        z_mean, z_log_var, z = self.encoder(data)
        reconstruction = self.decoder(z)
        reconstruction_loss = ops.mean(
            ops.sum(keras.losses.binary_crossentropy(images, reconstruction), axis=(1, 2)))
        kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
        kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
        return reconstruction_loss + kl_loss, reconstruction_loss, kl_loss

    def train_step(self, *arguments):
        if ENGINE == "jax":
            return self.jax_train_step(*arguments)
        data = arguments[0]
        if ENGINE == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                total_loss, reconstruction_loss, kl_loss = self.vae_losses(data)
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        else:  # torch
            import torch

            self.zero_grad()
            total_loss, reconstruction_loss, kl_loss = self.vae_losses(data)
            total_loss.backward()
            weights = list(self.trainable_weights)
            with torch.no_grad():
                self.optimizer.apply([w.value.grad for w in weights], weights)
        return self.update_trackers(total_loss, reconstruction_loss, kl_loss)

    def update_trackers(self, total_loss, reconstruction_loss, kl_loss):
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result()}

    def jax_train_step(self, state, data):
        import jax

        trainable, non_trainable, optimizer_variables, metrics_variables = state

        def losses(trainable, non_trainable):
            mapping = (list(zip(self.trainable_variables, trainable))
                       + list(zip(self.non_trainable_variables, non_trainable)))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                total_loss, *parts = self.vae_losses(data)
            return total_loss, (parts, [scope.get_current_value(v)
                                        for v in self.non_trainable_variables])

        (total_loss, (parts, non_trainable)), grads = jax.value_and_grad(
            losses, has_aux=True)(trainable, non_trainable)
        trainable, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable)
        with keras.StatelessScope(list(zip(self.metrics_variables, metrics_variables))) as scope:
            logs = self.update_trackers(total_loss, *parts)
        metrics_variables = [scope.get_current_value(v) for v in self.metrics_variables]
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)


keras.utils.set_random_seed(9)
latent_dim = 2
encoder_inputs = keras.Input(shape=(8, 8, 1))
x = layers.Conv2D(8, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
x = layers.Conv2D(16, 3, activation="relu", strides=2, padding="same")(x)
x = layers.Flatten()(x)
x = layers.Dense(16, activation="relu")(x)
z_mean = layers.Dense(latent_dim, name="z_mean")(x)
z_log_var = layers.Dense(latent_dim, name="z_log_var")(x)
if NOISE_AS_DATA:
    epsilon = keras.Input(shape=(latent_dim,))
    z = GivenSampling()([z_mean, z_log_var, epsilon])
    encoder_inputs = {"images": encoder_inputs, "epsilon": epsilon}
else:
    z = Sampling()([z_mean, z_log_var])
encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")

latent_inputs = keras.Input(shape=(latent_dim,))
x = layers.Dense(2 * 2 * 16, activation="relu")(latent_inputs)
x = layers.Reshape((2, 2, 16))(x)
x = layers.Conv2DTranspose(16, 3, activation="relu", strides=2, padding="same")(x)
x = layers.Conv2DTranspose(8, 3, activation="relu", strides=2, padding="same")(x)
decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")

digit_images, _ = digits(256, images=True)
data = digit_images
if NOISE_AS_DATA:
    noise = np.random.default_rng(2).normal(size=(256, latent_dim)).astype("float32")
    data = {"images": digit_images, "epsilon": noise}
if ADD_LOSS:  # one functional model: the KL term through add_loss, the rest compiled
    z_mean, z_log_var, z = encoder(encoder_inputs)
    z_mean = KLDivergence()([z_mean, z_log_var])
    model = keras.Model(encoder_inputs, decoder(z))
    model = compile(model, optimizer=keras.optimizers.Adam(), loss="binary_crossentropy")
    history = model.fit(data, digit_images, batch_size=32, epochs=2, shuffle=False, verbose=0)
    evaluation = model.evaluate(data, digit_images, batch_size=64, verbose=0)
else:
    model = VAE(encoder, decoder)
    model = compile(model, optimizer=keras.optimizers.Adam())
    history = model.fit(data, epochs=2, batch_size=32, shuffle=False, verbose=0)
    evaluation = None
z_mean, _, _ = encoder.predict(data, batch_size=64, verbose=0)
finish(model, history, evaluation, z_mean=z_mean[:16],
       reconstruction=decoder.predict(z_mean[:16], verbose=0))
