"""The Keras versions agnostic is tested on, and a warning, once per
process, when it runs on another one.

The versions the tox matrix runs (tox.ini), on TensorFlow, JAX and torch;
keras-mxnet 2.2.4 on MXNet. A version outside these still runs where it can:
each patch in this package checks the internal it needs and fails with a
message naming the version.
"""
import inspect
import re
import warnings

from agnostic import errors

# (major, minor) of the Keras 3 releases the tox matrix runs.
TESTED_KERAS = ((3, 13), (3, 14), (3, 15), (3, 16))
TESTED_KERAS_MXNET = ((2, 2),)
RANGE_TEXT = "3.13 to 3.16 (keras-nightly 3.16.0.dev), and keras-mxnet 2.2.4 on MXNet"
PIP_RANGE = "keras>=3.13,<3.17"
_WARNED = set()


def parts(version):
    """(major, minor) of a version string such as "3.16.0.dev2026102704"."""
    found = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def is_tested(version, backend=None):
    tested = TESTED_KERAS_MXNET if backend == "mxnet" else TESTED_KERAS
    return parts(version) in tested


def describe(version, backend=None):
    """"3.15.0 (tested)" or "3.12.0 (not tested: agnostic is tested on ...)"."""
    if version is None:
        return "not installed"
    if is_tested(version, backend):
        return f"{version} (tested)"
    return f"{version} (not tested: agnostic is tested on Keras {RANGE_TEXT})"


def moved(internal):
    """The error for a Keras internal (named in `internal`) that this Keras
    no longer has."""
    import keras

    return errors.CompatError(
        f"agnostic relies on Keras's {internal}, which Keras {keras.__version__} no "
        "longer has. Install a Keras version agnostic is tested on "
        "(`agnostic info` says which), or report this version to agnostic."
    )


def expect(holds, internal):
    """A probe's check (agnostic/compat/registry.py): raises CompatError
    naming `internal` (what agnostic expects) and the versions unless
    `holds`. Not an assert, which `python -O` would drop."""
    if holds:
        return
    import sys

    import keras

    engine = keras.backend.backend()
    engine_version = getattr(sys.modules.get(engine), "__version__", "")
    raise errors.CompatError(
        f"agnostic relies on {internal}, which is not so with Keras "
        f"{keras.__version__} on {engine} {engine_version}. Install a Keras version "
        "agnostic is tested on (`agnostic info` says which), or report this version "
        "to agnostic."
    )


def takes(function, *names):
    """Whether `function` has parameters named `names` (a patch calls it, or
    is called, with them)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)


def warn_if_untested(keras, backend):
    """Warns once per process when this Keras is outside the tested range."""
    version = getattr(keras, "__version__", None)
    if version in _WARNED or is_tested(version, backend):
        return
    _WARNED.add(version)
    warnings.warn(
        f"agnostic is tested on Keras {RANGE_TEXT}; this is Keras {version}. It "
        "trains if the internals it relies on are still in place, and otherwise "
        "fails with an error naming the one that moved. Install a tested version "
        f"(pip install '{PIP_RANGE}') to be sure training matches one device.",
        errors.UntestedVersionWarning, stacklevel=3,
    )
