"""keras.io's "Simple MNIST convnet", with batch normalization after each
convolution as its image-classification examples add it, on the whole of
scikit-learn's digits: a Sequential of Conv2D, BatchNormalization,
MaxPooling2D, Flatten and Dense, SGD, `validation_data`, then evaluate and
predict. 1,497 training rows and 300 validation rows: neither divides by
the batch size nor, on most engines, by the devices (PROGRAM_ROWS to
change)."""
import os

from harness import compile, digits, finish  # noqa: I001

import keras
from keras import layers

ROWS = int(os.environ.get("PROGRAM_ROWS", "1797"))
keras.utils.set_random_seed(3)
x, y = digits(samples=ROWS, images=True)
x_train, y_train, x_val, y_val = x[:-300], y[:-300], x[-300:], y[-300:]

model = keras.Sequential([
    keras.Input(shape=(8, 8, 1)),
    layers.Conv2D(16, kernel_size=(3, 3), activation="relu", padding="same"),
    layers.BatchNormalization(),
    layers.MaxPooling2D(pool_size=(2, 2)),
    layers.Conv2D(32, kernel_size=(3, 3), activation="relu", padding="same"),
    layers.BatchNormalization(),
    layers.MaxPooling2D(pool_size=(2, 2)),
    layers.Flatten(),
    layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.005),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x_train, y_train, epochs=2, shuffle=False,
                    validation_data=(x_val, y_val), verbose=0)
evaluation = model.evaluate(x_val, y_val, verbose=0)
predictions = model.predict(x_val, verbose=0)
finish(model, history, evaluation, predictions=predictions)
