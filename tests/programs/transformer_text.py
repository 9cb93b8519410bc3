"""keras.io "Text classification with Transformer": the example's own
TransformerBlock and TokenAndPositionEmbedding layers (no **kwargs, no
get_config), on generated token ids. SGD keeps the arithmetic comparable;
dropout rate 0 keeps the run deterministic (the rates are the example's
constructor arguments)."""
from harness import compile, finish  # noqa: I001

import os

import keras
import numpy as np
from keras import layers, ops


class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [
                layers.Dense(ff_dim, activation="relu"),
                layers.Dense(embed_dim),
            ]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)


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


keras.utils.set_random_seed(21)
vocab_size, maxlen = 200, 16  # the example: 20000 words, 200 per review
embed_dim, num_heads, ff_dim = 16, 2, 16
LARGE = os.environ.get("PROGRAM_SIZE") == "large"  # wider, with a momentum slot per weight
if LARGE:
    vocab_size, embed_dim, ff_dim = 2048, 64, 256
rate = 0.0  # the example's 0.1: random, so not one device's numbers on every engine

# "Reviews": token ids; positive when low ids outnumber high ones.
tokens = np.random.default_rng(0).integers(1, vocab_size, size=(256, maxlen))
x_train = tokens.astype("int32")
y_train = (np.sum(tokens < vocab_size // 2, axis=1) > maxlen // 2).astype("int32")

inputs = layers.Input(shape=(maxlen,))
embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
x = embedding_layer(inputs)
transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim, rate)
x = transformer_block(x)
x = layers.GlobalAveragePooling1D()(x)
x = layers.Dropout(rate)(x)
x = layers.Dense(20, activation="relu")(x)
x = layers.Dropout(rate)(x)
outputs = layers.Dense(2, activation="softmax")(x)

model = keras.Model(inputs=inputs, outputs=outputs)
optimizer = keras.optimizers.SGD(0.1, momentum=0.9 if LARGE else 0.0)
model = compile(model, optimizer=optimizer,
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x_train, y_train, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x_train, y_train, batch_size=64, verbose=0)
predictions = model.predict(x_train[:16], batch_size=8, verbose=0)
finish(model, history, evaluation, predictions=predictions)
