"""A functional model with a `keras.layers.Lambda` of a Python lambda and a
custom layer written without **kwargs or get_config, as many keras.io
examples write their small layers."""
from harness import compile, digits, finish  # noqa: I001

import keras
from keras import layers, ops


class Scale(layers.Layer):
    def __init__(self, units):
        super().__init__()
        self.units = units

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(self.units,), initializer="ones")

    def call(self, inputs):
        return inputs * self.scale


keras.utils.set_random_seed(17)
x, y = digits()
inputs = keras.Input(shape=(64,))
h = layers.Lambda(lambda t: t * 2.0)(inputs)
h = layers.Dense(32, activation="relu")(h)
h = Scale(32)(h)
h = layers.Lambda(lambda t: ops.concatenate([t, -t], axis=-1))(h)
outputs = layers.Dense(10, activation="softmax")(h)
model = keras.Model(inputs, outputs)
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
finish(model, history, evaluation, predictions=model.predict(x[:16], verbose=0))
