"""A tf.data pipeline with a seeded shuffle (TensorFlow's input pipeline;
the other engines read tf.data datasets too)."""
from harness import compile, digits, finish  # noqa: I001

import keras
import tensorflow as tf

keras.utils.set_random_seed(8)
x, y = digits()
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=42).batch(32)
model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(dataset, epochs=2, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
finish(model, history, evaluation)
