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

from tf_dtensor import _core  # noqa: E402  (needs TensorFlow's libraries loaded first)
from tf_dtensor import _tape  # noqa: E402
from tf_dtensor import debug  # noqa: E402
from tf_dtensor import dtensor  # noqa: E402
from tf_dtensor import placements  # noqa: E402
from tf_dtensor._device import UnsupportedOpWarning  # noqa: E402
from tf_dtensor._errors import (LayoutError, MeshError, PackError, RelayoutError,  # noqa: E402
                                UnsupportedOpError)
from tf_dtensor.dtensor import *  # noqa: E402,F401,F403
from tf_dtensor.placements import *  # noqa: E402,F401,F403

_tape.install()  # eager gradients of DTensors stay DTensors (tf_dtensor/_tape.py)

__version__ = "0.1.0"

__all__ = ["debug", "dtensor", "LayoutError", "MeshError", "PackError", "RelayoutError",
           "UnsupportedOpError", "UnsupportedOpWarning", "placements"] + list(dtensor.__all__) + \
    list(placements.__all__)
