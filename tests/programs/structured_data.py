"""keras.io "Structured data classification from scratch": preprocessing
layers adapted on the training data before compile (Normalization,
Discretization, StringLookup, IntegerLookup + Embedding, Hashing +
CategoryEncoding), in a functional model fed from tf.data, on generated data.

TensorFlow: every layer inside the model, strings as tf tensors. JAX and
torch, as keras.io's multi-backend examples do: the layers that only run on
TensorFlow (StringLookup, IntegerLookup, Hashing) in the tf.data `.map`, the
rest (Normalization, Discretization, CategoryEncoding, Embedding) inside.
fit and evaluate read the tf.data dataset itself on every engine (torch's
processes each take their part of its every batch)."""
from harness import ENGINE, compile, finish  # noqa: I001

import keras
import numpy as np
import tensorflow as tf
from keras import layers

keras.utils.set_random_seed(12)
rng = np.random.default_rng(12)
samples = 320
raw = {
    "age": rng.normal(54.0, 9.0, size=(samples, 1)).astype("float32"),
    "chol": rng.normal(240.0, 50.0, size=(samples, 1)).astype("float32"),
    "thal": rng.choice(["fixed", "normal", "reversible"], size=(samples, 1)),
    "ca": rng.integers(0, 4, size=(samples, 1)).astype("int64"),
    "zip": rng.integers(10000, 99999, size=(samples, 1)).astype("int64"),
}
target = ((raw["age"] > 54) ^ (raw["thal"] == "reversible") | (raw["ca"] > 2)).astype("float32")

# Adapted before compile: what the model must train and predict with.
age_normalizer = layers.Normalization()
age_normalizer.adapt(raw["age"])
chol_bins = layers.Discretization(num_bins=4)
chol_bins.adapt(raw["chol"])
thal_lookup = layers.StringLookup(output_mode="one_hot")
thal_lookup.adapt(raw["thal"])
ca_lookup = layers.IntegerLookup(output_mode="int")
ca_lookup.adapt(raw["ca"])
zip_hashing = layers.Hashing(num_bins=8)

inside = ENGINE == "tensorflow"


def preprocess(features, label):  # JAX, torch: what needs TensorFlow, in tf.data
    features = dict(features)
    features["thal"] = thal_lookup(features["thal"])
    features["ca"] = ca_lookup(features["ca"])
    features["zip"] = zip_hashing(features["zip"])
    return features, label


dataset = tf.data.Dataset.from_tensor_slices((raw, target)).batch(32)
if not inside:
    dataset = dataset.map(preprocess)
data = dict(x=dataset)

inputs = {
    "age": keras.Input(shape=(1,), name="age"),
    "chol": keras.Input(shape=(1,), name="chol"),
    "thal": keras.Input(shape=(1,), name="thal", dtype="string") if inside
    else keras.Input(shape=(thal_lookup.vocabulary_size(),), name="thal"),
    "ca": keras.Input(shape=(1,), name="ca", dtype="int64"),
    "zip": keras.Input(shape=(1,), name="zip", dtype="int64"),
}
thal = thal_lookup(inputs["thal"]) if inside else inputs["thal"]
ca = ca_lookup(inputs["ca"]) if inside else inputs["ca"]
zip_bucket = zip_hashing(inputs["zip"]) if inside else inputs["zip"]
encoded = [
    age_normalizer(inputs["age"]),
    layers.CategoryEncoding(num_tokens=4, output_mode="one_hot")(chol_bins(inputs["chol"])),
    thal,
    layers.Flatten()(layers.Embedding(ca_lookup.vocabulary_size(), 4)(ca)),
    layers.CategoryEncoding(num_tokens=8, output_mode="one_hot")(zip_bucket),
]
x = layers.concatenate(encoded)
x = layers.Dense(32, activation="relu")(x)
output = layers.Dense(1, activation="sigmoid")(x)
model = keras.Model(inputs, output)
model = compile(model, optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy",
                metrics=["accuracy"])
history = model.fit(**data, epochs=2, shuffle=False, verbose=0)
evaluation = model.evaluate(**data, verbose=0)
predictions = model.predict(dataset.take(1), verbose=0)
finish(model, history, evaluation, predictions=predictions,
       adapted_mean=keras.ops.convert_to_numpy(age_normalizer.mean).ravel(),
       bins=list(chol_bins.bin_boundaries), vocabulary=thal_lookup.get_vocabulary())
