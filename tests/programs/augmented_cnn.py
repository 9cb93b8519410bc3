"""Data augmentation layers and Dropout in a Conv2D + BatchNormalization
network, as the keras.io image-classification-from-scratch example."""
from harness import compile, digits, finish  # noqa: I001

import keras
from keras import layers

keras.utils.set_random_seed(14)
x, y = digits(images=True)

augmentation = keras.Sequential([layers.RandomFlip("horizontal"),
                                 layers.RandomTranslation(0.1, 0.1)])
inputs = keras.Input((8, 8, 1))
h = augmentation(inputs)
h = layers.Conv2D(8, 3, padding="same")(h)
h = layers.BatchNormalization()(h)
h = layers.Activation("relu")(h)
h = layers.GlobalAveragePooling2D()(h)
h = layers.Dropout(0.3)(h)
outputs = layers.Dense(10, activation="softmax")(h)
model = keras.Model(inputs, outputs)
model = compile(model, optimizer=keras.optimizers.SGD(0.05),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
finish(model, history, evaluation)
