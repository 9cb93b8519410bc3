"""Several training steps per call into the engine (`steps_per_execution`),
as the Keras performance guides advise for small models, with count-type
metrics beside the loss."""
from harness import compile, digits, finish  # noqa: I001

import keras

keras.utils.set_random_seed(5)
x, y = digits()

model = keras.Sequential([
    keras.Input((64,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model = compile(
    model, optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
    metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=3, name="top3")],
    steps_per_execution=4,
)
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
finish(model, history, evaluation)
