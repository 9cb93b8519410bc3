"""Arrays shuffled by fit (the default), reproducible through
keras.utils.set_random_seed."""
from harness import compile, digits, finish  # noqa: I001

import keras

keras.utils.set_random_seed(6)
x, y = digits()
model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2, verbose=0)  # shuffle=True
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
finish(model, history, evaluation)
