"""What each extra installs, resolved by pip against the package index
without installing or downloading the packages (`pip install --dry-run
--report`, which reads their metadata): the GPU extras bring GPU-capable
builds, the CPU ones none of NVIDIA's libraries. Needs the index: run by
the tox environment `install`."""
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def resolved(extra, tmp_path):
    """{name: version} of what `pip install .[extra]` would install."""
    report = tmp_path / f"{extra}.json"
    run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--quiet", "--report", str(report), f"{ROOT}[{extra}]"],
        capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in installs}


def nvidia(packages):
    return sorted(name for name in packages if name.startswith("nvidia-"))


@pytest.mark.parametrize("extra, engine, gpu_package", [
    ("tensorflow-cuda", "tensorflow", "nvidia-cudnn-cu12"),
    ("jax-cuda", "jax-cuda12-plugin", "nvidia-cudnn-cu12"),
    ("torch", "torch", None),  # PyPI's torch: a CUDA build, with NVIDIA's libraries
])
def test_gpu_extras_bring_gpu_builds(extra, engine, gpu_package, tmp_path):
    packages = resolved(extra, tmp_path)
    assert engine in packages and "keras" in packages
    assert nvidia(packages), f"{extra} resolves to no NVIDIA library: {sorted(packages)}"
    if gpu_package:
        assert gpu_package in packages


@pytest.mark.parametrize("extra, engine, absent", [
    ("tensorflow-cpu", "tensorflow-cpu", "tensorflow"),
    ("tensorflow", "tensorflow", "tensorflow-cpu"),  # GPU-capable, CUDA from the machine
    ("jax", "jax", "jax-cuda12-plugin"),
])
def test_other_extras_bring_no_nvidia_library(extra, engine, absent, tmp_path):
    packages = resolved(extra, tmp_path)
    assert engine in packages and "keras" in packages and absent not in packages
    assert nvidia(packages) == []


def test_the_keras_range_is_the_tested_one(tmp_path):
    from agnostic.compat import versions

    keras = resolved("jax", tmp_path)["keras"]
    assert versions.is_tested(keras), keras
