"""A keras-hub task model built from its constructor's arguments (random
weights, nothing downloaded): a tiny BertBackbone inside a
BertTextClassifier without a preprocessor, fed token ids directly.
PROGRAM_SIZE=large: a wider one, trained with a momentum slot per weight."""
from harness import compile, finish  # noqa: I001

import os

import keras
import keras_hub
import numpy as np

LARGE = os.environ.get("PROGRAM_SIZE") == "large"
keras.utils.set_random_seed(18)
vocabulary_size, length, samples = (1000 if LARGE else 100), 16, 256
hidden, intermediate = (64, 256) if LARGE else (16, 32)
rng = np.random.default_rng(18)
token_ids = rng.integers(1, vocabulary_size, size=(samples, length)).astype("int32")
padding_mask = np.ones((samples, length), dtype="int32")
padding_mask[:, 12:] = 0
token_ids[padding_mask == 0] = 0
features = {"token_ids": token_ids, "segment_ids": np.zeros_like(token_ids),
            "padding_mask": padding_mask}
labels = (np.sum(token_ids > vocabulary_size // 2, axis=1) > 6).astype("int32")

backbone = keras_hub.models.BertBackbone(
    vocabulary_size=vocabulary_size, num_layers=1, num_heads=2, hidden_dim=hidden,
    intermediate_dim=intermediate, dropout=0.0, max_sequence_length=length)
classifier = keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2,
                                                 preprocessor=None, dropout=0.0)
classifier = compile(classifier,
                     optimizer=keras.optimizers.SGD(0.05, momentum=0.9 if LARGE else 0.0),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     metrics=["sparse_categorical_accuracy"])
history = classifier.fit(features, labels, batch_size=32, epochs=1, shuffle=False, verbose=0)
evaluation = classifier.evaluate(features, labels, batch_size=64, verbose=0)
first = {key: value[:16] for key, value in features.items()}
finish(classifier, history, evaluation, predictions=classifier.predict(first, verbose=0))
