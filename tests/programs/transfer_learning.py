"""keras.io "Transfer learning & fine-tuning": a base model built on its own
(a small functional CNN with BatchNormalization standing in for Xception,
no weights downloaded), frozen, called with training=False inside a new
model; compile and fit; then unfrozen and compiled AGAIN with a lower
learning rate, and fit again, on digits (is the digit under 5?)."""
from harness import compile, digits, finish  # noqa: I001

import keras

keras.utils.set_random_seed(15)
x, digit = digits(320, images=True)
y = (digit < 5).astype("float32")
x_train, y_train, x_val, y_val = x[:256], y[:256], x[256:], y[256:]

base_inputs = keras.Input(shape=(8, 8, 1))
h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(base_inputs)
h = keras.layers.BatchNormalization()(h)
h = keras.layers.Activation("relu")(h)
h = keras.layers.Conv2D(8, 3, padding="same")(h)
base_model = keras.Model(base_inputs, h, name="base_model")
# As if pretrained: the frozen base's batch statistics are not the initial ones.
base_model(x_train, training=True)
base_model.layers[2].moving_mean.assign(keras.ops.full((8,), 0.1))
base_model.layers[2].moving_variance.assign(keras.ops.full((8,), 0.5))

base_model.trainable = False
inputs = keras.Input(shape=(8, 8, 1))
scale_layer = keras.layers.Rescaling(scale=2.0, offset=-1)  # [0, 1] -> [-1, 1]
x = scale_layer(inputs)
# The base model contains batchnorm layers. We want to keep them in inference mode
# when we unfreeze the base model for fine-tuning, so we make sure that the
# base_model is running in inference mode here.
x = base_model(x, training=False)
x = keras.layers.GlobalAveragePooling2D()(x)
x = keras.layers.Dropout(0.0)(x)  # keras.io: 0.2, random, so not one device's on every engine
outputs = keras.layers.Dense(1)(x)
model = keras.Model(inputs, outputs)

model = compile(model, optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[keras.metrics.BinaryAccuracy()])
history = model.fit(x_train, y_train, batch_size=32, epochs=2, shuffle=False,
                    validation_data=(x_val, y_val), verbose=0)
frozen_base = [w.tolist() for w in base_model.get_weights()]

# Unfreeze the base model and train the entire model end-to-end with a low learning rate.
base_model.trainable = True
model = compile(model, optimizer=keras.optimizers.SGD(0.01),
                loss=keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[keras.metrics.BinaryAccuracy()])
fine_tuning = model.fit(x_train, y_train, batch_size=32, epochs=1, shuffle=False,
                        validation_data=(x_val, y_val), verbose=0)
evaluation = model.evaluate(x_val, y_val, batch_size=64, verbose=0)
finish(model, history, evaluation, fine_tuning=fine_tuning.history, frozen_base=frozen_base,
       trainable=len(model.trainable_weights),
       predictions=model.predict(x_val[:16], verbose=0))
