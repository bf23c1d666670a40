"""Every public name of `tf.experimental.dtensor` exists in `tf_dtensor.dtensor`."""

from __future__ import annotations

import inspect

import pytest
from tensorflow.experimental import dtensor as reference

from tf_dtensor import dtensor

# tf_dtensor's own additions.
OURS_ONLY = {"set_strict_mode"}
# Keyword-only options beyond TensorFlow's signature, with defaults that keep its behaviour.
EXTRA_KEYWORDS = {"pack": ["run_check"]}

_REFERENCE_NAMES = sorted(n for n in dir(reference) if not n.startswith("_"))


@pytest.mark.parametrize("name", _REFERENCE_NAMES)
def test_public_name_exists(name):
    assert name in dtensor.__all__, f"`{name}` is missing from tf_dtensor.dtensor.__all__"
    ours, theirs = getattr(dtensor, name), getattr(reference, name)
    assert callable(ours) == callable(theirs)
    if inspect.isfunction(theirs) and inspect.isfunction(ours):
        extras = EXTRA_KEYWORDS.get(name, [])
        ours_parameters = inspect.signature(ours).parameters
        assert (list(ours_parameters) ==
                list(inspect.signature(theirs).parameters) + extras), name
        for extra in extras:
            assert ours_parameters[extra].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_no_public_name_beyond_tensorflow_and_our_additions():
    assert sorted(set(dtensor.__all__) - set(_REFERENCE_NAMES)) == sorted(OURS_ONLY)


def test_aliases_are_the_same_function_as_in_tensorflow():
    assert dtensor.initialize_tpu_system is dtensor.initialize_accelerator_system
    assert dtensor.initialize_multi_client is dtensor.initialize_accelerator_system
    assert dtensor.shutdown_tpu_system is dtensor.shutdown_accelerator_system
    assert reference.initialize_tpu_system is reference.initialize_accelerator_system
