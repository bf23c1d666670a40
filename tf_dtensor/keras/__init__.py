"""Keras 3 on tf_dtensor: `keras.distribution` on the TensorFlow backend.

After `import tf_dtensor` (Keras imported before or after), Keras' own distribution API
shards models on tf_dtensor: `DeviceMesh`, `LayoutMap`, `DataParallel`, `ModelParallel`,
`set_distribution`, `distribution.scope()`, `distribute_tensor`. Variables become
`DVariable`s with their layouts, each batch is laid out along the batch dimension, and
`fit`/`evaluate`/`predict`/`save` work unchanged.

This package adds:
- `explain(model)`: per variable, the rule that laid it out, its layout, bytes per device
  and whether its shape divides.
- `estimate(model, x, y)`: what one training step costs each device (memory, FLOPs,
  collectives), planned without running it (`debug.estimate` of its `train_step`).
- `layers`: Keras layers with layout arguments (`Dense(kernel_layout=...)`), as TensorFlow's
  Keras-2 DTensor integration had.
- `set_replicated_warning_bytes(n)`: the size from which a variable that no LayoutMap rule
  matched (so replicated on every device) is reported (1 MiB per device first).
"""

from __future__ import annotations

import keras as _keras

from tf_dtensor.keras import _hooks

_hooks.check_backend(_keras.backend.backend())
_hooks.check_version(_keras.__version__)
_hooks.install()

from tf_dtensor.keras import layers  # noqa: E402
from tf_dtensor.keras._backend import (ReplicatedVariableWarning,  # noqa: E402
                                       set_replicated_warning_bytes)
from tf_dtensor.keras._explain import VariablePlan, estimate, explain  # noqa: E402

__all__ = ["ReplicatedVariableWarning", "VariablePlan", "estimate", "explain", "layers",
           "set_replicated_warning_bytes"]
