"""A small convolutional network with batch normalization on the digits,
as the keras.io image-classification examples build them."""
from harness import compile, digits, finish, replica_spread  # noqa: I001

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
parallel = compile(model, optimizer=keras.optimizers.SGD(0.05),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = parallel.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = parallel.evaluate(x, y, batch_size=64, verbose=0)
predictions = parallel.predict(x[:64], batch_size=32, verbose=0)
# The model passed to compile holds the trained weights and statistics too.
by_template = model.predict(x[:64], batch_size=32, verbose=0)
spread = replica_spread(parallel)
finish(parallel, history, evaluation, predictions=predictions, by_template=by_template,
       replica_spread=spread)
