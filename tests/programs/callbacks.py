"""The usual training callbacks: a learning-rate schedule, reducing the rate
on a plateau and early stopping that restores the best weights, with
validation data."""
from harness import compile, digits, finish  # noqa: I001

import keras

keras.utils.set_random_seed(13)
x, y = digits(320)
x_train, y_train, x_val, y_val = x[:256], y[:256], x[256:], y[256:]
model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(model, optimizer=keras.optimizers.SGD(0.2),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
callbacks = [
    keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5 if epoch else rate),
    keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0,
                                      min_delta=10.0),  # every epoch is a plateau
    keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10.0,
                                  restore_best_weights=True),
]
history = model.fit(x_train, y_train, batch_size=32, epochs=4, shuffle=False, verbose=0,
                    validation_data=(x_val, y_val), callbacks=callbacks)
evaluation = model.evaluate(x_val, y_val, batch_size=32, verbose=0)
finish(model, history, evaluation, epochs=len(history.epoch),
       learning_rate=float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)))
