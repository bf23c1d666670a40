"""TensorFlow's own `layout=` arguments, given a tf_dtensor `Layout`.

`tf.ones`, `tf.zeros`, `tf.fill`, `tf.ones_like`, `tf.zeros_like` (and the ops built on them)
take `layout=` and hand it to `tensorflow.dtensor.python.api.call_with_layout`, which expects
TensorFlow's own `Layout` ("Expect `mesh` to be `Mesh`" otherwise). `install()` routes a
tf_dtensor `Layout` to tf_dtensor's `call_with_layout`; TensorFlow's own layouts go where they
went before, so both DTensors can be used in one program.

Example:
  >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
  >>> t = tf.ones([4, 2], layout=dtensor.Layout(["x", dtensor.UNSHARDED], mesh))
  >>> dtensor.fetch_layout(t).short()
  '[x,*] @ mesh(x=2)'
"""

from __future__ import annotations

from typing import Any, Callable

from tf_dtensor import api
from tf_dtensor.layout import Layout

_INSTALLED = {"original": None}


def install() -> None:
    """Routes tf_dtensor layouts given to TensorFlow ops' `layout=` (idempotent)."""
    if _INSTALLED["original"] is not None:
        return
    from tensorflow.dtensor.python import api as tf_api  # pylint: disable=g-import-not-at-top
    original = tf_api.call_with_layout

    def call_with_layout(fn: Callable[..., Any], layout, *args, **kwargs) -> Any:
        if isinstance(layout, Layout):
            return api.call_with_layout(fn, layout, *args, **kwargs)
        return original(fn, layout, *args, **kwargs)

    call_with_layout.__doc__ = original.__doc__
    call_with_layout.__wrapped__ = original
    tf_api.call_with_layout = call_with_layout
    _INSTALLED["original"] = original
