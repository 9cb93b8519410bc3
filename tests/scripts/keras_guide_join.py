"""A JAX process of a job of two whose program starts as Keras's guide to
distributed training does, with `keras.distribution.initialize()` (from the
job's KERAS_DISTRIBUTION_* variables), for tests/engines/
test_jax_data_parallel.py. This script names agnostic, so agnostic has
joined the job as JAX was imported, before that call.

Usage: keras_guide_join.py FOLDER. Writes weights_<process>.npz and
result_<process>.json to FOLDER; the result also holds what a call for
another job (3 processes) raised.
"""
import json
import os
import sys

import numpy as np
import keras
import agnostic

from tests import models

keras.distribution.initialize()
import jax  # noqa: E402

process = int(os.environ["KERAS_DISTRIBUTION_PROCESS_ID"])
x, y = models.data()
model = agnostic.backend_agnostic_compile(models.build(keras), optimizer=models.sgd(keras),
                                          **models.COMPILE)
history = model.fit(x, y, batch_size=models.BATCH, epochs=models.EPOCHS, shuffle=False,
                    verbose=0)
result = {"loss": history.history["loss"], "processes": jax.process_count()}
try:
    jax.distributed.initialize(num_processes=3, process_id=process)
except Exception as error:  # what the program is told
    result["another_job"] = f"{type(error).__name__}: {error}"
folder = sys.argv[1]
np.savez(os.path.join(folder, f"weights_{process}.npz"), *model.get_weights())
with open(os.path.join(folder, f"result_{process}.json"), "w") as handle:
    json.dump(result, handle)
