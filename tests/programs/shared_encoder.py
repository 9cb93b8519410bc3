"""Two models sharing layers, as keras.io's autoencoder examples reuse an
encoder: an autoencoder trained and evaluated, its encoder then frozen under
a classifier compiled and trained in turn, and the first model evaluated
again (on JAX the first model's functions were made for the encoder still
trainable: Keras's own DataParallel fails there too)."""
from harness import compile, digits, finish  # noqa: I001

import keras
from keras import layers

keras.utils.set_random_seed(3)
x, y = digits(256)
encoder = keras.Sequential([keras.Input((64,)), layers.Dense(16, activation="relu")],
                           name="encoder")
decoder = keras.Sequential([keras.Input((16,)), layers.Dense(64)], name="decoder")
inputs = keras.Input((64,))
autoencoder = keras.Model(inputs, decoder(encoder(inputs)))
autoencoder = compile(autoencoder, optimizer=keras.optimizers.SGD(0.1), loss="mse")
autoencoder.fit(x, x, batch_size=32, epochs=2, shuffle=False, verbose=0)
before = autoencoder.evaluate(x, x, batch_size=64, verbose=0)

encoder.trainable = False
features = keras.Input((64,))
classifier = keras.Model(features, layers.Dense(10, activation="softmax")(encoder(features)))
classifier = compile(classifier, optimizer=keras.optimizers.SGD(0.1),
                     loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = classifier.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = classifier.evaluate(x, y, batch_size=64, verbose=0)
after = autoencoder.evaluate(x, x, batch_size=64, verbose=0)
finish(classifier, history, evaluation, before=before, after=after)
