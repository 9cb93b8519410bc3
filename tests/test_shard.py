"""shard=True: JAX and torch split each large weight and its optimizer state
over the devices (torch: between steps, ZeRO stage 3), and both train like
one device; TensorFlow refuses it before any work, naming
where it is possible."""
import json
import os
import re
import subprocess
import sys

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


def total(sizes):
    """A device's bytes of weights and optimizer state together."""
    return sizes["weights"] + sizes["optimizer"]


SHARDED_SCRIPT = os.path.join(ROOT, "tests", "scripts", "sharded.py")
READS = os.path.join(ROOT, "tests", "scripts", "sharded_reads.py")


def run_sharded_script(tmp_path, counts, launcher=None, optimizer=""):
    """tests/scripts/sharded.py: plain on one device, then sharded on
    counts[0] devices for an epoch with a backup (`launcher`: in the
    processes "torchrun" or "agnostic launch" starts, two), then resumed
    sharded on counts[1]; each stage's report, and the plain and resumed
    weights. `optimizer`: the script's SHARDED_OPTIMIZER."""
    stages = (("plain", 1), ("first", counts[0]), ("second", counts[1]))
    env = {"AGNOSTIC_CPU_DEVICES": str(max(counts)), "SHARDED_OPTIMIZER": optimizer}
    results = {}
    for stage, devices in stages:
        if launcher and stage == "first":
            results[stage] = launched(launcher, tmp_path, devices, env)
        else:
            results[stage] = run_script(SHARDED_SCRIPT, stage, tmp_path, devices, env=env)[0]
    plain, second = (np.load(tmp_path / f"{stage}.npz") for stage in ("plain", "second"))
    assert relative_difference([plain[k] for k in plain.files],
                               [second[k] for k in second.files]) < 1e-5
    np.testing.assert_allclose(results["second"]["loss"], results["plain"]["loss"], rtol=1e-4)
    return results


def launched(launcher, tmp_path, devices, env):
    """The script's `first` stage on `devices` in all, in two processes that
    `launcher` starts (torchrun: a device each; agnostic launch: half each)."""
    from agnostic.launch.processes import free_port

    if launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                   "--master-port", str(free_port())]
    else:
        command = [sys.executable, "-m", "agnostic", "launch", "--nproc-per-node", "2"]
        env = dict(env, AGNOSTIC_CPU_DEVICES=str(devices // 2))
    command += [SHARDED_SCRIPT, "first", str(tmp_path), str(devices)]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TMPDIR=str(tmp_path), **env))
    assert run.returncode == 0, run.stderr[-5000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # the chief's
    return json.loads(lines[0])


def assert_loads_into_a_plain_model(tmp_path, results):
    """The resumed run's files load into plain Keras: its weights file into a
    model built here, its .keras file whole, the optimizer state included,
    equal to the one-device run's."""
    model = keras.Sequential([
        keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    model.load_weights(tmp_path / "second.weights.h5")
    x = np.random.default_rng(0).random((256, 64), dtype="float32")[:8]
    np.testing.assert_allclose(model.predict(x, verbose=0), results["second"]["predictions"],
                               atol=1e-5)
    plain, second = (keras.saving.load_model(tmp_path / f"{stage}.keras")
                     for stage in ("plain", "second"))
    assert len(second.optimizer.variables) == len(plain.optimizer.variables) > 6
    for expected, loaded in zip(plain.optimizer.variables, second.optimizer.variables):
        np.testing.assert_allclose(np.asarray(loaded), np.asarray(expected), atol=1e-5,
                                   err_msg=expected.path)


# shard="auto" on a plan of 4 GPUs (a listing made here: no GPU exists on
# this machine, so neither does its memory, which `memory` stands for).
GPUS_4 = {"jax": ("gpu:0", "gpu:1", "gpu:2", "gpu:3"),
          "torch": ("cuda:0", "cuda:1", "cuda:2", "cuda:3"),
          "tensorflow": tuple(f"/device:GPU:{i}" for i in range(4))}


def auto_plan(model, optimizer, memory):
    from agnostic import plan
    from agnostic.plan import shards
    from agnostic.devices import DeviceListing

    listing = DeviceListing(GPUS_4[ENGINE], "cpu:0", accelerators=True)
    return shards.auto(plan.decide(ENGINE, listing), model, [optimizer],
                              memory=lambda chosen: memory)


def test_auto_splits_only_a_model_whose_copies_would_not_fit_half_a_device():
    """An MLP of 0.53 MB of weights with Adam: copied, it needs weights,
    gradients and two slots, 2.1 MB, on each device."""
    from agnostic.plan import shards

    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(512),
                              keras.layers.Dense(2)])
    weights = sum(int(np.prod(v.shape)) * 4 for v in model.weights)
    assert shards.needed_bytes(model, ["adam"]) == 4 * weights
    assert shards.needed_bytes(model, [keras.optimizers.SGD(momentum=0.9)]) == 3 * weights
    assert shards.slots(keras.optimizers.Adam(use_ema=True)) == 3
    roomy = auto_plan(model, "adam", memory=10 * 4 * weights)
    assert roomy.strategy not in ("jax-sharded", "torch-sharded")
    assert ("shard='auto': not split: 2.1 MB of weights, gradients and optimizer state "
            "copied on each device, against 50% of the 21.2 MB of one.") in roomy.reason
    if ENGINE == "tensorflow":
        with pytest.warns(agnostic.ShardWarning, match="cannot be split here: tf-mirrored"):
            tight = auto_plan(model, "adam", memory=3 * weights)
        assert tight.strategy == "tf-mirrored"
        assert "shard='auto': not split (tensorflow does not shard yet)" in tight.reason
    else:
        tight = auto_plan(model, "adam", memory=3 * weights)
        assert tight.strategy == {"jax": "jax-sharded", "torch": "torch-sharded"}[ENGINE]
        assert "shard='auto': split: 2.1 MB" in tight.reason
    unbuilt = auto_plan(keras.Sequential([keras.layers.Dense(2)]), "adam", memory=1)
    assert "not split: the model is not built yet" in unbuilt.reason
    assert "memory is unknown" in auto_plan(model, "adam", memory=None).reason


@pytest.mark.skipif(ENGINE != "jax", reason="JAX's devices train in this process; "
                    "torch's would be processes started from it, and TensorFlow refuses "
                    "to shard (the test above decides for both)")
def test_auto_on_this_machine_copies_a_small_model_and_trains(caplog):
    """The real decision here: CPU devices have the machine's memory, which
    a small model fits; the plan says so (the line the strategy, the
    logger at DEBUG why), and fit runs."""
    import logging

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    with caplog.at_level(logging.DEBUG, logger="agnostic"):
        agnostic.backend_agnostic_compile(model, optimizer="adam", loss="mse", gpus=2,
                                          shard="auto")
    model.fit(np.ones((8, 8)), np.ones((8, 4)), verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 1
    said = [r.getMessage() for r in caplog.records]
    line = next(message for message in said if message.startswith("plan:"))
    assert "strategy=jax-data-parallel" in line and "shard" not in line
    full = next(message for message in said if message.startswith("the plan in full:"))
    assert "shard='auto': not split: 0.6 KB of weights, gradients and optimizer state" in full


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
        whole = sum(total(sizes) for sizes in plain["bytes_per_device"].values())
        held = sharded["bytes_per_device"]
        assert len(held) == replicas
        for device, sizes in held.items():
            assert total(sizes) <= whole / replicas * OVERHEAD, (device, sizes, whole)

    @pytest.mark.parametrize("name", ["batchnorm_cnn", "gan"])
    def test_programs_with_small_weights_train_sharded_like_one_device(name, tmp_path):
        """A Conv + BatchNormalization network, and the GAN with its own
        compile: their weights, smaller than a split is worth, are copied."""
        plain, sharded = run_both(name, tmp_path, env={"AGNOSTIC_TEST_SHARD": "1",
                                                       "AGNOSTIC_TEST_REPLICAS": "4"})
        assert_same_training(plain, sharded)
        assert sharded["devices_used"] == 4

    @pytest.mark.parametrize("processes", [1, 2])
    def test_a_sharded_backup_resumes_on_another_device_count_and_saves_a_plain_file(
            processes, tmp_path):
        """Trained sharded on 4 devices for an epoch (in one process, or in
        two that agnostic launch starts, 2 devices each), resumed sharded on 2
        in one process for the second: one device's 2 epochs; its saved files
        load into plain Keras; each device held 1/4, then 1/2, of the weights
        and optimizer state."""
        results = run_sharded_script(tmp_path, (4, 2),
                                     launcher="agnostic launch" if processes == 2 else None)
        whole = sum(total(sizes) for sizes in results["plain"]["bytes_per_device"].values())
        for stage, devices in (("first", 4), ("second", 2)):
            held = results[stage]["bytes_per_device"]  # the chief's devices
            assert len(held) == (devices if stage == "second" else 4 // processes)
            assert max(map(total, held.values())) <= whole / devices * OVERHEAD, (stage, held)
        assert_loads_into_a_plain_model(tmp_path, results)

    def test_each_weight_is_split_along_its_largest_dimension_the_devices_divide():
        from agnostic.engines.jax.sharded import split_axes

        assert split_axes((2048, 64), 4) == ("batch", None)
        assert split_axes((64, 2, 64), 4) == ("batch", None, None)  # ties: the first
        assert split_axes((30, 64), 4) == (None, "batch")  # 30 does not divide
        assert split_axes((33, 35), 4) == (None, None)  # none divides: copied
        assert split_axes((64,), 4) == (None,)  # small: copied
        assert split_axes((), 4) == ()

elif ENGINE == "torch":  # each process holds 1/N of the weights and optimizer state

    def test_a_sharded_transformer_trains_like_one_device_each_process_holding_its_share(
            tmp_path):
        """keras.io's Transformer text classifier, wider, with a momentum slot
        per weight, over 2 processes: between steps each holds half the
        weights and half the momentum (replicated, each would hold all)."""
        plain, sharded = run_both("transformer_text", tmp_path, env={
            "PROGRAM_SIZE": "large", "AGNOSTIC_TEST_SHARD": "1",
            "AGNOSTIC_TEST_REPLICAS": "2"}, both=True)
        assert_same_training(plain, sharded)
        assert_same_history(plain, sharded)
        np.testing.assert_allclose(sharded["predictions"], plain["predictions"], atol=1e-5)
        assert sharded["devices_used"] == 2
        whole = plain["bytes_per_device"]["process 0"]
        held = sharded["bytes_per_device"]["process 0"]
        assert held["weights"] <= whole["weights"] / 2 * OVERHEAD, (held, whole)
        assert held["optimizer"] <= whole["optimizer"] / 2 * OVERHEAD, (held, whole)

    @pytest.mark.parametrize("name", ["batchnorm_cnn", "gan", "transfer_learning"])
    def test_programs_with_small_weights_train_sharded_like_one_device(name, tmp_path):
        """A Conv + BatchNormalization network, the GAN with its own compile
        and two optimizers, and keras.io's transfer learning (a base frozen,
        compiled again, then fine-tuned: its weights made whole and split
        again)."""
        plain, sharded = run_both(name, tmp_path, env={"AGNOSTIC_TEST_SHARD": "1"})
        assert_same_training(plain, sharded)
        assert sharded["devices_used"] == 2

    @pytest.mark.parametrize("optimizer", ["adamw", "average"])
    def test_a_sharded_backup_resumes_on_another_process_count_and_saves_a_plain_file(
            optimizer, tmp_path):
        """AdamW, its decay and a clip by the norm of all gradients (or Adam
        with a moving average and gradient accumulation), sharded over 2
        processes (torchrun's) for an epoch, resumed on 3 the shim starts for
        the second: one device's 2 epochs; the saved file, optimizer state
        included, is the one-device run's, whole; each process held 1/N of
        the optimizer state."""
        h5py = pytest.importorskip("h5py")  # Keras's own requirement
        counts = (2, 3) if optimizer == "adamw" else (4, 2)
        results = run_sharded_script(tmp_path, counts, optimizer=optimizer,
                                     launcher="torchrun" if optimizer == "adamw" else None)
        whole = results["plain"]["bytes_per_device"]["process 0"]
        for stage, processes in zip(("first", "second"), counts):
            held = results[stage]["bytes_per_device"]["process 0"]
            assert total(held) <= total(whole) / processes * OVERHEAD, (stage, held)
        assert_loads_into_a_plain_model(tmp_path, results)
        saved = {}
        for stage in ("plain", "second"):
            with h5py.File(tmp_path / f"{stage}.weights.h5") as handle:
                values = {}
                handle.visititems(lambda name, item: values.__setitem__(name, item[()])
                                  if isinstance(item, h5py.Dataset) else None)
                saved[stage] = values
        assert saved["second"].keys() == saved["plain"].keys()
        slots = [name for name in saved["plain"] if name.startswith("optimizer/")]
        assert len(slots) > 10
        for name, value in saved["plain"].items():
            np.testing.assert_allclose(saved["second"][name], value, atol=1e-5, err_msg=name)

    def test_a_step_of_the_programs_own_reads_weights_between_backward_and_update():
        """Its read gathers the weight (Keras's own step reads only the
        gradients there, and nothing is gathered for it): the same norms
        and weights as one device."""
        plain = run_script(READS, "between-plain")[0]
        sharded = run_script(READS, "between")[0]
        assert len(sharded["norms"]) == 4
        np.testing.assert_allclose(sharded["norms"], plain["norms"], rtol=1e-5)
        np.testing.assert_allclose(sharded["weights"], plain["weights"], rtol=1e-5)

    def test_a_weight_read_during_fit_by_one_process_only_is_named_not_mixed():
        """Process 0 reads the first kernel and process 1 the second (of the
        same size) during fit: each gather carries its weight's index, so
        both processes fail naming the two weights."""
        _, stdout, stderr = run_script(READS, "one-process", check=False)
        assert "trained" not in stdout
        assert ("Process 0 read weight 'sequential/dense/kernel' during fit while process 1 "
                "read 'sequential/dense_1/kernel'") in stderr, stderr[-3000:]
        assert "Read weights on every process, or after fit, where they are whole" in stderr

    @pytest.mark.parametrize("optimizer", ["lamb", "adafactor", "loss_scale"])
    def test_optimizers_whose_update_is_not_per_value_are_refused_before_any_work(optimizer):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        given = {"lamb": keras.optimizers.Lamb(), "adafactor": "adafactor",
                 "loss_scale": keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())}
        name = {"lamb": "'Lamb'", "adafactor": "'adafactor'",
                "loss_scale": "'LossScaleOptimizer'"}[optimizer]
        with pytest.raises(errors.NotSupportedError,
                           match=re.escape("shard=True on torch splits the optimizer state by "
                                           "slices of each weight, and ") +
                           f".*its state cannot be split.*Received: optimizer={name}"):
            agnostic.backend_agnostic_compile(model, optimizer=given[optimizer], loss="mse",
                                              gpus=2, shard=True)
        assert getattr(model, "optimizer", None) is None  # nothing was done

else:

    def test_tensorflow_refuses_it_before_any_work():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        message = re.escape("shard=True splits the weights and optimizer state over the devices "
                            "on JAX (jax-sharded) and over torch's processes "
                            "(torch-sharded); this plan is tf-mirrored on tensorflow "
                            "over 2 devices, where tensorflow does not shard yet. Train with "
                            "shard=False (every device holds the whole model), or with "
                            "KERAS_BACKEND=jax or torch.")
        with pytest.raises(errors.NotSupportedError, match=message + ".*Received: shard=True"):
            agnostic.backend_agnostic_compile(model, optimizer="sgd", loss="mse", gpus=2,
                                              shard=True)
        assert getattr(model, "optimizer", None) is None  # nothing was done
        with pytest.raises(TypeError, match="`shard` must be True, False or 'auto'. "
                                            "Received: shard='yes'"):
            agnostic.backend_agnostic_compile(model, optimizer="sgd", loss="mse", shard="yes")
