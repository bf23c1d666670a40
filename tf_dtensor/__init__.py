"""tf_dtensor: DTensor for TensorFlow as an out-of-tree custom-device plugin.

    from tf_dtensor import dtensor
    mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
"""

from __future__ import annotations

import tensorflow as _tf

_TF_SERIES = "2.21"
if not _tf.__version__.startswith(_TF_SERIES + "."):
    raise ImportError(
        f"tf_dtensor was built for TensorFlow {_TF_SERIES}.x but TensorFlow {_tf.__version__} is "
        f"loaded. Install `tensorflow=={_TF_SERIES}.*` or rebuild tf_dtensor against this "
        f"TensorFlow (`pip install --force-reinstall --no-binary tf_dtensor .`).")

# AutoGraph leaves tf_dtensor's own code as it is: converted inside a tf.function or a
# Dataset.map, the first call's device set-up ran in a converted copy whose module state
# (the device, once registered) never reached tf_dtensor, and every later call failed.
from tensorflow.python.autograph.core import config as _autograph_config  # noqa: E402

_autograph_config.CONVERSION_RULES = (
    (_autograph_config.DoNotConvert("tf_dtensor"),) + tuple(_autograph_config.CONVERSION_RULES))

from tf_dtensor import _core  # noqa: E402  (needs TensorFlow's libraries loaded first)
from tf_dtensor import _tape  # noqa: E402
from tf_dtensor import _tf_layout_args  # noqa: E402
from tf_dtensor import debug  # noqa: E402
from tf_dtensor import dtensor  # noqa: E402
from tf_dtensor import placements  # noqa: E402
from tf_dtensor._device import UnsupportedOpWarning  # noqa: E402
from tf_dtensor._errors import (LayoutError, MeshError, PackError, RelayoutError,  # noqa: E402
                                UnsupportedOpError)
from tf_dtensor.dtensor import *  # noqa: E402,F401,F403
from tf_dtensor.placements import *  # noqa: E402,F401,F403

_tape.install()  # eager gradients of DTensors stay DTensors (tf_dtensor/_tape.py)
_tf_layout_args.install()  # tf.ones(..., layout=<tf_dtensor Layout>) and friends


def _install_keras() -> None:
    """Keras' distribution API on tf_dtensor, when Keras 3 runs on TensorFlow here.

    TensorFlow 2.21 imports Keras 3 with itself, so Keras is loaded by now where it is
    installed; `import tf_dtensor.keras` does the same explicitly (and raises where it cannot).
    """
    import sys
    import warnings
    keras = sys.modules.get("keras")
    if keras is None or "keras.src.backend.tensorflow.trainer" not in sys.modules:
        return
    try:
        if keras.backend.backend() != "tensorflow":
            return
        import tf_dtensor.keras  # noqa: F401  (installs the hooks)
    except ImportError as error:
        warnings.warn(f"keras.distribution is not served by tf_dtensor: {error}")


_install_keras()

__version__ = "0.1.0"

__all__ = ["debug", "dtensor", "LayoutError", "MeshError", "PackError", "RelayoutError",
           "UnsupportedOpError", "UnsupportedOpWarning", "placements"] + list(dtensor.__all__) + \
    list(placements.__all__)
