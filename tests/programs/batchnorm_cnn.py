"""A small convolutional network with batch normalization on the digits,
as the keras.io image-classification examples build them."""
from harness import compile, digits, finish  # noqa: I001

import keras

keras.utils.set_random_seed(1)
x, y = digits(images=True)

model = keras.Sequential([
    keras.Input((8, 8, 1)),
    keras.layers.Conv2D(8, 3, padding="same", use_bias=False),
    keras.layers.BatchNormalization(),
    keras.layers.Activation("relu"),
    keras.layers.Conv2D(8, 3, padding="same"),
    keras.layers.BatchNormalization(momentum=0.9),
    keras.layers.Activation("relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.05),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
predictions = model.predict(x[:64], batch_size=32, verbose=0)
finish(model, history, evaluation, predictions=predictions)
