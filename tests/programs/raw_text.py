"""keras.io's "Text classification from scratch", end to end: the model
takes raw strings (a `TextVectorization` layer adapted to the texts inside
it), fed from a tf.data pipeline of strings in batches of 33 (shares of 17
and 16 on 2 devices). TensorFlow only: no
other engine takes strings into a model. The texts are made here: reviews of
a few words each, positive where most of their words are."""
from harness import compile, finish  # noqa: I001

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(7)
rng = np.random.default_rng(7)
good, bad = ["good", "fine", "great", "nice", "superb"], ["bad", "awful", "poor", "ugly", "dull"]
texts = [" ".join(rng.choice(good + bad + ["film", "plot", "the"], rng.integers(3, 9)))
         for _ in range(330)]
labels = np.array([float(sum(w in good for w in t.split()) > sum(w in bad for w in t.split()))
                   for t in texts], dtype="float32")

vectorize = keras.layers.TextVectorization(max_tokens=32, output_sequence_length=8)
vectorize.adapt(texts)
inputs = keras.Input((1,), dtype="string")
x = vectorize(inputs)
x = keras.layers.Embedding(32, 8)(x)
x = keras.layers.GlobalAveragePooling1D()(x)
outputs = keras.layers.Dense(1, activation="sigmoid")(x)
model = compile(keras.Model(inputs, outputs), optimizer=keras.optimizers.SGD(0.5),
                loss="binary_crossentropy", metrics=["accuracy"])
train = tf.data.Dataset.from_tensor_slices((np.array(texts)[:, None], labels)).batch(33)
history = model.fit(train, epochs=2, verbose=0)
evaluation = model.evaluate(train, verbose=0)
predictions = model.predict(tf.constant(np.array(texts[:16])[:, None]), batch_size=8, verbose=0)
finish(model, history, evaluation, predictions=predictions)
