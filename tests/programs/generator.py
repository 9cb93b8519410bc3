"""A Python generator of batches, with steps_per_epoch, as the Keras docs
feed data that does not fit in memory."""
from harness import compile, digits, finish  # noqa: I001

import keras

keras.utils.set_random_seed(5)
x, y = digits()


def batches():
    while True:  # an endless stream: the epochs are counted in steps
        for start in range(0, len(x), 32):
            yield x[start:start + 32], y[start:start + 32]


model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
# 6 of the 8 batches an epoch: every epoch starts where the last one ended.
history = model.fit(batches(), steps_per_epoch=6, epochs=2, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
finish(model, history, evaluation)
