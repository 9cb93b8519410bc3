"""The tested Keras range: `agnostic info` says whether this Keras is in it
(tests/test_cli.py), and a Keras outside it warns once per process.

The untested versions below are strings handed to the check, not installed
Keras releases: only the version number is made up, since every Keras this
machine can install is a tested one."""
import types
import warnings

import pytest

from agnostic import errors
from agnostic.compat import versions


@pytest.mark.parametrize("version", ["3.13.2", "3.14.1", "3.15.0", "3.15.1",
                                     "3.16.0.dev2026102704"])
def test_the_tested_keras_versions(version):
    assert versions.is_tested(version)
    assert versions.describe(version) == f"{version} (tested)"


def test_keras_mxnet_is_tested_on_mxnet_only():
    assert versions.is_tested("2.2.4", "mxnet")
    assert not versions.is_tested("2.2.4", "tensorflow")
    assert not versions.is_tested("3.15.0", "mxnet")


@pytest.mark.parametrize("version", ["3.12.0", "3.17.0", "4.0.0", "", None])
def test_other_versions_are_not_tested(version):
    assert not versions.is_tested(version)


def test_an_untested_keras_warns_once_per_process_with_the_range():
    keras = types.SimpleNamespace(__version__="3.12.1")  # only the number is made up
    versions._WARNED.discard("3.12.1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        versions.warn_if_untested(keras, "jax")
        versions.warn_if_untested(keras, "jax")
    assert len(caught) == 1
    warning = caught[0]
    assert issubclass(warning.category, errors.UntestedVersionWarning)
    message = str(warning.message)
    assert "this is Keras 3.12.1" in message and "tested on Keras 3.13 to 3.16" in message
    assert "pip install 'keras>=3.13,<3.17'" in message
    assert "3.12.1 (not tested: agnostic is tested on Keras 3.13 to 3.16" in \
        versions.describe("3.12.1")


def test_a_tested_keras_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        versions.warn_if_untested(types.SimpleNamespace(__version__="3.15.0"), "torch")
