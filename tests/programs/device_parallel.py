"""The legacy guides' device parallelism: one shared LSTM encodes two
sequences, the first call on device 0, the second on device 1, and the
results are merged on the CPU. Plain mode builds the same model without the
placements and trains it on one device; a checkpoint of the placed model
loads on one device."""
from harness import MODE, compile, digits, finish, path  # noqa: I001

import contextlib

import keras

if MODE == "agnostic":
    from agnostic import device
else:
    def device(device_id):
        return contextlib.nullcontext()

keras.utils.set_random_seed(11)
x, y = digits()
rows = x.reshape(-1, 8, 8)
columns = rows.transpose(0, 2, 1)

input_a = keras.Input(shape=(8, 8))
input_b = keras.Input(shape=(8, 8))
shared_lstm = keras.layers.LSTM(16)
with device(0):
    encoded_a = shared_lstm(input_a)
with device(1):
    encoded_b = shared_lstm(input_b)
    encoded_b = keras.layers.Dense(16, activation="relu", name="branch_b")(encoded_b)
with device("cpu"):
    merged = keras.layers.concatenate([encoded_a, encoded_b], axis=-1)
predictions = keras.layers.Dense(10, activation="softmax")(merged)
template = keras.Model(inputs=[input_a, input_b], outputs=predictions)

model = compile(template, optimizer=keras.optimizers.SGD(0.1),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
history = model.fit([rows, columns], y, batch_size=32, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate([rows, columns], y, batch_size=64, verbose=0)
expected = model.predict([rows[:8], columns[:8]], verbose=0)
model.save(path("model.keras"))
loaded = keras.models.load_model(path("model.keras"))
finish(
    model, history, evaluation, predictions=expected,
    by_template=template.predict([rows[:8], columns[:8]], verbose=0),
    by_loaded=loaded.predict([rows[:8], columns[:8]], verbose=0),
    devices={w.path: str(getattr(w.value, "device", "")) for w in model.weights},
)
