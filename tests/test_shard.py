"""shard=True: JAX splits each large weight and its optimizer state over the
devices and trains like one device; the other engines refuse it before any
work, naming where it is possible."""
import os
import re

import numpy as np
import pytest

from tests.conftest import ROOT, engine_or_skip, run_script

keras = engine_or_skip()

import agnostic  # noqa: E402
from agnostic import errors  # noqa: E402
from tests.models import relative_difference  # noqa: E402
from tests.test_programs import (ENGINE, assert_same_history, assert_same_training,  # noqa: E402
                                 run_both)

# The replicated model's bytes / N, plus what stays copied (biases, norms).
OVERHEAD = 1.10


if ENGINE == "jax":  # JAX shards; the other engines refuse

    @pytest.mark.parametrize("replicas", [2, 4])
    def test_a_sharded_transformer_trains_like_one_device_each_holding_its_share(replicas,
                                                                                tmp_path):
        """keras.io's Transformer text classifier, wider, with a momentum slot
        per weight: each device holds about 1/N of the weights and optimizer
        state (replicated, each would hold all of it)."""
        plain, sharded = run_both("transformer_text", tmp_path, env={
            "PROGRAM_SIZE": "large", "AGNOSTIC_TEST_SHARD": "1",
            "AGNOSTIC_TEST_REPLICAS": str(replicas)}, both=True)
        assert_same_training(plain, sharded)
        assert_same_history(plain, sharded)
        np.testing.assert_allclose(sharded["predictions"], plain["predictions"], atol=1e-5)
        whole = sum(plain["bytes_per_device"].values())
        held = sharded["bytes_per_device"]
        assert len(held) == replicas
        for device, size in held.items():
            assert size <= whole / replicas * OVERHEAD, (device, size, whole)

    @pytest.mark.parametrize("name", ["batchnorm_cnn", "gan"])
    def test_programs_with_small_weights_train_sharded_like_one_device(name, tmp_path):
        """A Conv + BatchNormalization network, and the GAN with its own
        compile: their weights, smaller than a split is worth, are copied."""
        plain, sharded = run_both(name, tmp_path, env={"AGNOSTIC_TEST_SHARD": "1",
                                                       "AGNOSTIC_TEST_REPLICAS": "4"})
        assert_same_training(plain, sharded)
        assert sharded["devices_used"] == 4

    def test_a_sharded_backup_resumes_on_another_device_count_and_saves_a_plain_file(
            tmp_path):
        """Trained sharded on 4 devices for an epoch, resumed sharded on 2 for
        the second: one device's 2 epochs; its saved file loads into a plain
        model; each device held 1/N of the weights and optimizer state."""
        script = os.path.join(ROOT, "tests", "scripts", "sharded.py")
        results = {stage: run_script(script, stage, tmp_path, devices)[0]
                   for stage, devices in (("plain", 1), ("first", 4), ("second", 2))}
        plain, second = (np.load(tmp_path / f"{stage}.npz") for stage in ("plain", "second"))
        assert relative_difference([plain[k] for k in plain.files],
                                   [second[k] for k in second.files]) < 1e-5
        whole = sum(results["plain"]["bytes_per_device"].values())
        for stage, devices in (("first", 4), ("second", 2)):
            held = results[stage]["bytes_per_device"]
            assert len(held) == devices
            assert max(held.values()) <= whole / devices * OVERHEAD, (stage, held, whole)
        model = keras.Sequential([
            keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
        model.load_weights(tmp_path / "second.weights.h5")
        np.testing.assert_allclose(
            model.predict(np.random.default_rng(0).random((256, 64), dtype="float32")[:8],
                          verbose=0), results["second"]["predictions"], atol=1e-5)

    def test_each_weight_is_split_along_its_largest_dimension_the_devices_divide():
        from agnostic.strategies.jax_sharded import split_axes

        assert split_axes((2048, 64), 4) == ("batch", None)
        assert split_axes((64, 2, 64), 4) == ("batch", None, None)  # ties: the first
        assert split_axes((30, 64), 4) == (None, "batch")  # 30 does not divide
        assert split_axes((33, 35), 4) == (None, None)  # none divides: copied
        assert split_axes((64,), 4) == (None,)  # small: copied
        assert split_axes((), 4) == ()

else:

    def test_engines_that_do_not_shard_refuse_it_before_any_work():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        message = re.escape("shard=True splits the weights and optimizer state over the devices "
                            "on JAX in one process (jax-sharded); this plan is ")
        with pytest.raises(errors.NotSupportedError, match=message + ".*Received: shard=True"):
            agnostic.backend_agnostic_compile(model, optimizer="sgd", loss="mse", gpus=2,
                                              shard=True)
        assert getattr(model, "optimizer", None) is None  # nothing was done
        with pytest.raises(TypeError, match="`shard` must be True or False. Received: "
                                            "shard='yes'"):
            agnostic.backend_agnostic_compile(model, optimizer="sgd", loss="mse", shard="yes")
