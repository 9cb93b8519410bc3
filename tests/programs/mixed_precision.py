"""Mixed precision (float16 compute, float32 variables, loss scaling) with a
custom loss function and a custom metric function. PROGRAM_POLICY=
mixed_bfloat16: bfloat16 compute (no loss scaling)."""
from harness import compile, digits, finish  # noqa: I001

import os

import keras
from keras import ops

keras.mixed_precision.set_global_policy(os.environ.get("PROGRAM_POLICY", "mixed_float16"))
keras.utils.set_random_seed(12)
x, y = digits()


def smoothed_crossentropy(y_true, y_pred):
    one_hot = ops.one_hot(ops.cast(ops.reshape(y_true, (-1,)), "int32"), 10)
    smoothed = one_hot * 0.9 + 0.01
    return keras.losses.categorical_crossentropy(smoothed, y_pred)


def top_probability(y_true, y_pred):
    return ops.max(y_pred, axis=-1)


model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10),
    keras.layers.Activation("softmax", dtype="float32"),  # outputs in float32
])
model = compile(model, optimizer=keras.optimizers.SGD(0.1), loss=smoothed_crossentropy,
                metrics=[top_probability, "sparse_categorical_accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
finish(model, history, evaluation)
