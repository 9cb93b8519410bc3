"""Two named inputs given as a dict, two outputs with their own losses,
loss_weights and metrics, and per-sample weights."""
from harness import compile, digits, finish  # noqa: I001

import keras
import numpy as np
from keras import layers

keras.utils.set_random_seed(10)
x, y = digits()
pixels, extra = x[:, :48], x[:, 48:]
weights = np.where(y % 2 == 0, 1.0, 0.5).astype("float32")

image_input = keras.Input((48,), name="pixels")
extra_input = keras.Input((16,), name="extra")
features = layers.concatenate([layers.Dense(32, activation="relu")(image_input),
                               layers.Dense(8, activation="relu")(extra_input)])
digit = layers.Dense(10, activation="softmax", name="digit")(features)
size = layers.Dense(1, name="size")(features)
model = keras.Model({"pixels": image_input, "extra": extra_input},
                    {"digit": digit, "size": size})
model = compile(
    model, optimizer=keras.optimizers.SGD(0.05),
    loss={"digit": "sparse_categorical_crossentropy", "size": "mse"},
    loss_weights={"digit": 1.0, "size": 0.2},
    metrics={"digit": ["accuracy"], "size": ["mae"]},
)
targets = {"digit": y, "size": (y / 10.0).astype("float32")}
history = model.fit({"pixels": pixels, "extra": extra}, targets, sample_weight=weights,
                    batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate({"pixels": pixels, "extra": extra}, targets, batch_size=64,
                            verbose=0, return_dict=True)
finish(model, history, evaluation)
