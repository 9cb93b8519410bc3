"""A Sequential model without an Input: Keras builds it from the first batch
of fit (the keras.io examples that leave the input shape out)."""
from harness import compile, digits, finish  # noqa: I001

import keras

keras.utils.set_random_seed(7)
x, y = digits()
model = keras.Sequential([
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
finish(model, history, evaluation, predictions=model.predict(x[:8], verbose=0))
