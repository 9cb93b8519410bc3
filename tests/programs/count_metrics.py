"""A binary classifier with count-type metrics (true positives, false
negatives) besides AUC and accuracy, through fit, evaluate and the
*_on_batch methods."""
from harness import compile, digits, finish  # noqa: I001

import keras

keras.utils.set_random_seed(2)
x, digit = digits()
y = (digit >= 5).astype("float32")

model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(16, activation="relu"),
    keras.layers.Dense(1, activation="sigmoid"),
])
model = compile(
    model, optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy",
    metrics=[keras.metrics.TruePositives(name="tp"), keras.metrics.FalseNegatives(name="fn"),
             keras.metrics.AUC(name="auc"), "binary_accuracy"],
)
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
# One batch at a time: counts over the whole batch, as on one device.
trained = model.train_on_batch(x[:64], y[:64], return_dict=True)
tested = model.test_on_batch(x[64:128], y[64:128], return_dict=True)
predicted = model.predict_on_batch(x[:8])
finish(model, history, evaluation, trained=trained, tested=tested, predicted=predicted)
