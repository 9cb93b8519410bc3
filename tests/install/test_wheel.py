"""What the wheel holds and says about itself, as the registry would show it:
built from this checkout with pip (build isolation: the build backend comes
from the package index). Run by the tox environment `install`."""
import email
import os
import re
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(folder), ROOT],
        capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (path,) = folder.glob("*.whl")
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    info = next(name.split("/")[0] for name in files if name.endswith(".dist-info/METADATA"))
    return path.name, files, info


def test_the_distribution_is_keras_agnostic_and_imports_as_agnostic(wheel):
    name, files, info = wheel
    assert name.startswith("keras_agnostic-")
    assert "agnostic/__init__.py" in files and "agnostic/py.typed" in files
    # The start-up hook beside the package (site-packages).
    assert {"_agnostic_hook.py", "agnostic-cpu-devices.pth"} <= set(files)
    scripts = files[f"{info}/entry_points.txt"].decode()
    assert "agnostic = agnostic.cli:main" in scripts
    assert "keras-agnostic = agnostic.cli:main" in scripts


def test_the_license_ships_and_the_metadata_says_what_installs_where(wheel):
    _, files, info = wheel
    assert b"Apache License" in files[f"{info}/licenses/LICENSE"]
    metadata = email.message_from_bytes(files[f"{info}/METADATA"])
    assert metadata["Name"] == "keras-agnostic"
    assert metadata["Requires-Python"] == ">=3.8"
    classifiers = metadata.get_all("Classifier")
    for expected in ("License :: OSI Approved :: Apache Software License",
                     "Typing :: Typed", "Programming Language :: Python :: 3.8",
                     "Programming Language :: Python :: 3.11"):
        assert expected in classifiers
    requirements = metadata.get_all("Requires-Dist")
    # Every engine pinned to the release the tests run.
    for pin in ("torch<2.14,>=2.13; extra == 'torch'",
                "tensorflow-cpu<2.22,>=2.21; extra == 'tensorflow-cpu'",
                "jax<0.11,>=0.10; extra == 'jax'", "mxnet==1.9.1; extra == 'mxnet'"):
        assert pin in requirements, requirements


def test_the_long_description_renders_without_links_into_the_repository(wheel):
    _, files, info = wheel
    metadata = email.message_from_bytes(files[f"{info}/METADATA"])
    assert metadata["Description-Content-Type"] == "text/markdown"
    description = metadata.get_payload()
    # Installed by the distribution's name there (the README installs from a clone).
    assert "pip install \"keras-agnostic[tensorflow-cpu]\"" in description
    # (The first command, which sets up the repository's example, keeps ".[...]".)
    assert not re.findall(r'(?<!/)pip install "\.\[', description)
    assert "not on the package index yet" not in description
    assert "<!--" not in description
    # The registry shows it without the repository: no relative link or image.
    assert not re.findall(r"\]\((?!https?://|#)[^)]*\)", description)
    assert "![" not in description and "<img" not in description
    # The documentation pages are named as paths instead.
    assert "Install (`docs/install.md` in the source distribution)" in description
    from readme_renderer import markdown

    html = markdown.render(description)
    assert html is not None and "<h2" in html
    # Each fenced block closed: the text after the last one is not code.
    assert description.count("```") % 2 == 0


def test_the_release_builds_an_sdist_and_a_wheel_that_twine_accepts(tmp_path):
    """What .github/workflows/release.yml runs before it uploads: `python -m
    build`, then `twine check --strict` on both files."""
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path), ROOT],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    files = sorted(path.name for path in tmp_path.iterdir())
    assert files == ["keras_agnostic-0.1.0-py3-none-any.whl", "keras_agnostic-0.1.0.tar.gz"]
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict"]
                             + [str(tmp_path / name) for name in files],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2
    workflow = open(os.path.join(ROOT, ".github", "workflows", "release.yml")).read()
    assert "python -m build" in workflow and "twine check --strict dist/*" in workflow
