"""Shared training scenarios, run as a user runs a script (`python file.py`),
so that strategies which start processes (torch-ddp) run for real.

Usage: scenario.py NAME REPLICAS FOLDER. The chief prints one JSON line.
"""
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import agnostic  # noqa: E402
from tests import models  # noqa: E402


def equivalence(replicas, folder):
    x, y = models.data()
    reference = models.build(keras)
    initial = reference.get_weights()
    reference.compile(optimizer=models.sgd(keras), **models.COMPILE)
    expected = reference.fit(x, y, batch_size=models.BATCH, epochs=models.EPOCHS,
                             shuffle=False, verbose=0).history
    template = models.build(keras, seed_value=99)  # other weights, then the same
    template.set_weights(initial)
    if agnostic.resolve(gpus=replicas).process_id != 0:
        # Other processes' templates differ: everyone starts from process 0's.
        template.set_weights([w + 1 for w in initial])
    records = models.Records()
    logging.getLogger("agnostic").addHandler(records)
    logging.getLogger("agnostic").setLevel(logging.INFO)
    model = agnostic.backend_agnostic_compile(template, optimizer=models.sgd(keras),
                                              gpus=replicas, **models.COMPILE)
    history = model.fit(x, y, batch_size=models.BATCH, epochs=models.EPOCHS,
                        shuffle=False, verbose=0).history
    evaluation = model.evaluate(x, y, batch_size=32, verbose=0)
    predictions = model.predict(x, batch_size=32, verbose=0)
    for name, saved in (("template", template), ("model", model)):
        saved.save(models.model_file(keras, folder, name))
    plan = agnostic.resolve(gpus=replicas)
    if plan.process_id != 0:
        return None
    loaded = {
        name: models.relative_difference(
            template.get_weights(),
            keras.models.load_model(models.model_file(keras, folder, name)).get_weights())
        for name in ("template", "model")
    }
    return {
        "strategy": plan.strategy,
        "num_replicas": plan.num_replicas,
        "model_vs_reference": models.relative_difference(reference.get_weights(),
                                                         model.get_weights()),
        "template_vs_reference": models.relative_difference(reference.get_weights(),
                                                            template.get_weights()),
        "moved": models.relative_difference(initial, model.get_weights()),
        "loss": [history["loss"], expected["loss"]],
        "accuracy": [models.accuracy(history), models.accuracy(expected)],
        "evaluate": [list(map(float, evaluation)),
                     list(map(float, reference.evaluate(x, y, batch_size=32, verbose=0)))],
        "predict": float(np.abs(predictions - reference.predict(x, batch_size=32, verbose=0)).max()),
        "loaded": loaded,
        "logs": records.messages,
    }


def split(replicas, folder):
    """Batches that do not divide by the replicas (101 rows in batches of
    16, then 96 in batches of 8R+1), and predict on 7 rows: one device's
    weights and predictions where the engine weights uneven shares; else the
    errors raised before any work."""
    x, y = models.data(101)
    reference = models.build(keras)
    before = reference.get_weights()
    template = models.build(keras)
    template.set_weights(before)
    reference.compile(optimizer=models.sgd(keras), **models.COMPILE)
    model = agnostic.backend_agnostic_compile(template, optimizer=models.sgd(keras),
                                              gpus=replicas, **models.COMPILE)
    messages = []
    for samples, batch_size in ((101, 16), (96, 8 * replicas + 1)):
        reference.fit(x[:samples], y[:samples], batch_size=batch_size, epochs=1, shuffle=False,
                      verbose=0)
        try:
            model.fit(x[:samples], y[:samples], batch_size=batch_size, epochs=1, shuffle=False,
                      verbose=0)
        except agnostic.BatchSplitError as error:
            messages.append(str(error))
    try:
        predicted = float(np.abs(model.predict(x[:7], verbose=0)
                                 - reference.predict(x[:7], verbose=0)).max())
    except agnostic.BatchSplitError as error:
        messages.append(str(error))
        predicted = None
    if agnostic.resolve(gpus=replicas).process_id != 0:
        return None
    return {"errors": messages,
            "unchanged": models.relative_difference(before, model.get_weights()),
            "vs_reference": models.relative_difference(reference.get_weights(),
                                                       model.get_weights()),
            "predict": predicted}


def finetune(replicas, folder, again_plainly=False):
    """Transfer learning as Keras users write it: train, freeze a layer,
    compile the model again (with a new optimizer), train on. The same with
    plain compile on one device is the reference. `again_plainly`: the
    second compile is the program's plain `model.compile(...)`."""
    x, y = models.data()

    def train(compile_again):
        model = models.build(keras)
        histories = []
        for frozen in (False, True):
            model.layers[1].trainable = not frozen  # the first Dense
            model = compile_again(model)
            before = model.layers[1].get_weights()
            histories.append(model.fit(x, y, batch_size=models.BATCH, epochs=1,
                                       shuffle=False, verbose=0).history["loss"])
        frozen_moved = models.relative_difference(before, model.layers[1].get_weights())
        return model, histories, frozen_moved

    def plain(model):
        model.compile(optimizer=models.sgd(keras), **models.COMPILE)
        return model

    expected, expected_loss, _ = train(plain)
    def shim(model):
        if again_plainly and getattr(model, "optimizer", None) is not None:
            return plain(model)  # compiled through agnostic before
        return agnostic.backend_agnostic_compile(model, optimizer=models.sgd(keras),
                                                 gpus=replicas, **models.COMPILE)

    records = models.Records()
    logging.getLogger("agnostic").addHandler(records)
    logging.getLogger("agnostic").setLevel(logging.INFO)
    model, loss, frozen_moved = train(shim)
    if agnostic.resolve(gpus=replicas).process_id != 0:
        return None
    return {"model_vs_reference": models.relative_difference(expected.get_weights(),
                                                             model.get_weights()),
            "loss": [loss, expected_loss], "frozen_moved": frozen_moved,
            "plans": [line for line in records.messages if line.startswith("plan:")]}


if __name__ == "__main__":
    name, replicas, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    scenarios = {"equivalence": equivalence, "split": split, "finetune": finetune,
                 "finetune_plain": lambda r, f: finetune(r, f, again_plainly=True)}
    result = scenarios[name](replicas, folder)
    if result is not None:
        print(json.dumps(result))
