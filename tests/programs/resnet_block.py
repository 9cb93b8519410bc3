"""A functional model with residual blocks (Conv2D, BatchNormalization, Add),
the shape of the keras.io ResNet examples, at the digits' size."""
from harness import compile, digits, finish  # noqa: I001

import keras
from keras import layers

keras.utils.set_random_seed(9)
x, y = digits(images=True)


def residual_block(inputs, filters):
    shortcut = inputs
    h = layers.Conv2D(filters, 3, padding="same", use_bias=False)(inputs)
    h = layers.BatchNormalization()(h)
    h = layers.Activation("relu")(h)
    h = layers.Conv2D(filters, 3, padding="same", use_bias=False)(h)
    h = layers.BatchNormalization()(h)
    if shortcut.shape[-1] != filters:
        shortcut = layers.Conv2D(filters, 1, use_bias=False)(shortcut)
    return layers.Activation("relu")(layers.Add()([h, shortcut]))


inputs = keras.Input((8, 8, 1))
h = residual_block(inputs, 8)
h = residual_block(h, 8)
h = layers.MaxPooling2D()(h)
h = residual_block(h, 16)
h = layers.GlobalAveragePooling2D()(h)
outputs = layers.Dense(10, activation="softmax")(h)
model = keras.Model(inputs, outputs, name="small_resnet")
model = compile(model, optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0)
finish(model, history, evaluation)
