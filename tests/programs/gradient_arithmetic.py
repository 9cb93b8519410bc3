"""A keras.io-style text classifier whose optimizer does everything Keras's
optimizers do to a gradient before using it, and whose model adds a loss
term of its own: on N devices it must be one device's arithmetic.

- a position embedding looked up once per step (keras.io's
  TokenAndPositionEmbedding: `ops.arange(maxlen)`), beside a token embedding:
  sparse gradients, the first shared by the whole batch;
- AdamW with one of `clipnorm`, `clipvalue`, `global_clipnorm`
  (PROGRAM_CLIP), gradient accumulation over 2 steps and an exponential
  moving average of the weights (PROGRAM_ACCUMULATE, PROGRAM_EMA);
- a functional `keras.Model` subclass whose `compute_loss` adds a term to
  `super().compute_loss(...)`, an `add_loss` and a kernel regularizer;
- batches that do not divide by the devices (PROGRAM_BATCH, default 33) over
  1,001 rows (PROGRAM_ROWS), so that every epoch ends on a short batch, and
  101 validation rows (PROGRAM_VALIDATION).
"""
import os

from harness import compile, finish  # noqa: I001

import keras
import numpy as np
from keras import layers, ops

CLIP = os.environ.get("PROGRAM_CLIP", "global_clipnorm")
ACCUMULATE = os.environ.get("PROGRAM_ACCUMULATE", "1") == "1"
EMA = os.environ.get("PROGRAM_EMA", "1") == "1"
BATCH = int(os.environ.get("PROGRAM_BATCH", "33"))
ROWS = int(os.environ.get("PROGRAM_ROWS", "1001"))
VALIDATION = int(os.environ.get("PROGRAM_VALIDATION", "101"))


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


class Penalised(layers.Layer):
    """A layer that adds a loss of its own in its call."""

    def call(self, x):
        self.add_loss(1e-3 * ops.mean(ops.square(x)))
        return x


class WithOwnLoss(keras.Model):
    """Adds the squared norm of the last kernel to the compiled loss, as the
    Keras guide's `compute_loss` override does."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training=training)
        return loss + 1e-2 * ops.sum(ops.square(self.layers[-1].kernel))


keras.utils.set_random_seed(5)
vocab_size, maxlen, embed_dim = 120, 12, 8
tokens = np.random.default_rng(1).integers(1, vocab_size, size=(ROWS, maxlen))
x_train = tokens.astype("int32")
y_train = (np.sum(tokens < vocab_size // 2, axis=1) > maxlen // 2).astype("int32")

inputs = layers.Input(shape=(maxlen,))
x = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)(inputs)
x = layers.GlobalAveragePooling1D()(x)
x = Penalised()(x)
x = layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3))(x)
outputs = layers.Dense(2, activation="softmax")(x)
model = WithOwnLoss(inputs=inputs, outputs=outputs)

optimizer = keras.optimizers.AdamW(
    learning_rate=3e-3, weight_decay=1e-3,
    gradient_accumulation_steps=2 if ACCUMULATE else None,
    use_ema=EMA, ema_overwrite_frequency=5 if EMA else None,
    **{CLIP: 0.05 if CLIP == "global_clipnorm" else 0.02},
)
model = compile(model, optimizer=optimizer, loss="sparse_categorical_crossentropy",
                metrics=["accuracy"])
history = model.fit(x_train, y_train, batch_size=BATCH, epochs=2, shuffle=False,
                    validation_data=(x_train[:VALIDATION], y_train[:VALIDATION]), verbose=0)
if EMA:
    model.optimizer.finalize_variable_values(model.trainable_variables)
evaluation = model.evaluate(x_train, y_train, batch_size=BATCH, verbose=0)
predictions = model.predict(x_train[:7], verbose=0)
finish(model, history, evaluation, predictions=predictions,
       iterations=int(ops.convert_to_numpy(model.optimizer.iterations)))
