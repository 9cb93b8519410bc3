"""Train a small classifier on scikit-learn's bundled digits on every device.

The same file runs on every engine:

    KERAS_BACKEND=tensorflow AGNOSTIC_CPU_DEVICES=2 python examples/digits.py
    KERAS_BACKEND=jax AGNOSTIC_CPU_DEVICES=4 python examples/digits.py
    KERAS_BACKEND=mxnet AGNOSTIC_CPU_DEVICES=2 python3.8 examples/digits.py

agnostic says its plan once, on standard error (AGNOSTIC_QUIET=1 silences it).
"""
import os

# TensorFlow's notice about CPU instructions: not this program's business.
# (TensorFlow 2.21 prints its oneDNN notice twice as it is imported, whatever
# this variable says; TF_ENABLE_ONEDNN_OPTS=0 silences it by turning oneDNN
# off.) Remove the line to see the notice.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# agnostic first: where the engine Keras will pick is not installed, it says
# so, and how to choose another, before Keras's import fails on it.
import agnostic  # noqa: E402  (after the variable above)
import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

digits = load_digits()
order = np.random.default_rng(0).permutation(len(digits.target))
x = (digits.data[order] / 16.0).astype("float32")
y = digits.target[order]
# 1792 of the 1797 samples: a multiple of 1, 2, 4 and 8 devices, so every
# global batch splits evenly over the replicas.
x_train, y_train = x[:1408], y[:1408]
x_test, y_test = x[1408:1792], y[1408:1792]

np.random.seed(0)
if hasattr(keras.utils, "set_random_seed"):  # Keras 3; keras-mxnet (Keras 2.2) has none
    keras.utils.set_random_seed(0)
inputs = keras.layers.Input(shape=(64,))
wide = keras.layers.Dense(128, activation="relu")(inputs)
narrow = keras.layers.Dense(32, activation="tanh")(inputs)
hidden = keras.layers.concatenate([wide, narrow])
outputs = keras.layers.Dense(10, activation="softmax")(hidden)
model = keras.models.Model(inputs, outputs)

# Where the script had model.compile(...): the model now trains on every device.
agnostic.backend_agnostic_compile(
    model,
    loss="sparse_categorical_crossentropy",
    optimizer="adam",
    metrics=["accuracy"],
)
model.fit(x_train, y_train, batch_size=64, epochs=15, verbose=2)
loss, accuracy = model.evaluate(x_test, y_test, batch_size=64, verbose=0)

plan = agnostic.resolve()
print(f"test accuracy: {accuracy:.3f} ({plan.strategy} on {plan.num_replicas} device(s))")
