"""What each extra installs, resolved by pip against the package index
without installing or downloading the packages (`pip install --dry-run
--report`, which reads their metadata): the GPU extras bring GPU-capable
builds, the CPU ones none of NVIDIA's libraries. Needs the index: run by
the tox environment `install`."""
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT, made_once


def resolved(extra, tmp_path, public=False):
    """{name: version} of what `pip install .[extra]` would install. `public`:
    as a pip that reads only the public registry resolves it (a machine's
    pip configuration may add folders of local wheels, such as a CPU build
    of torch with the registry's version number). Each is resolved once per
    session, whichever test worker asks first (conftest.made_once)."""
    made_once(["pip install --dry-run", extra, public], tmp_path,
              lambda kept: _resolve(extra, public, kept / "report.json"))
    installs = json.loads((tmp_path / "report.json").read_text())["install"]
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in installs}


def _resolve(extra, public, report):
    env = dict(os.environ)
    if public:
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
    run = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
         "--quiet", "--report", str(report), f"{ROOT}[{extra}]"],
        capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stderr[-3000:]


def nvidia(packages):
    return sorted(name for name in packages if name.startswith("nvidia-"))


@pytest.mark.parametrize("extra, engine, gpu_package", [
    ("tensorflow-cuda", "tensorflow", "nvidia-cudnn-cu12"),
    ("jax-cuda", "jax-cuda13-plugin", "nvidia-cudnn-cu13"),
    ("torch", "torch", "nvidia-cudnn-cu13"),  # PyPI's torch: a CUDA 13 build
])
def test_gpu_extras_bring_gpu_builds(extra, engine, gpu_package, tmp_path):
    packages = resolved(extra, tmp_path, public=True)
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


def cuda_majors(packages):
    """The CUDA major versions NVIDIA's packages among `packages` are for:
    "-cu12" names say 12; CUDA 13's libraries carry their version instead."""
    majors = set()
    for name, version in packages.items():
        if not name.startswith("nvidia-"):
            continue
        suffix = re.search(r"-cu(\d+)$", name)
        if suffix:
            majors.add(int(suffix.group(1)))
        elif name in ("nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "nvidia-cuda-cupti"):
            majors.add(int(version.split(".")[0]))
    return majors


@pytest.mark.parametrize("extras, majors", [
    ("jax-cuda,torch", {13}), ("tensorflow-cuda", {12})])
def test_gpu_extras_cuda_versions(extras, majors, tmp_path):
    # Installed together, jax-cuda and torch bring CUDA 13's libraries only
    # (tensorflow-cuda brings CUDA 12's: the README says to keep it apart).
    packages = resolved(extras, tmp_path, public=True)
    assert cuda_majors(packages) == majors, sorted(nvidia(packages))


@pytest.mark.parametrize("extra, engine, tested", [
    ("torch", "torch", "2.13."),
    ("jax", "jax", "0.10."),
    ("tensorflow-cpu", "tensorflow-cpu", "2.21."),
])
def test_extras_resolve_to_the_tested_engine_versions(extra, engine, tested, tmp_path):
    # The versions the engines' tox environments run (tox.ini), not newer.
    public = extra == "torch"  # local wheel folders may hold a CPU build of torch
    assert resolved(extra, tmp_path, public=public)[engine].startswith(tested)
