"""`DVariable`: a resource variable whose value is a DTensor with a fixed layout."""

from __future__ import annotations

from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor as tensor_lib
from tensorflow.python.ops import resource_variable_ops

from tf_dtensor import _device
from tf_dtensor import api
from tf_dtensor import checkpoint
from tf_dtensor._errors import LayoutError


class DVariable(resource_variable_ops.ResourceVariable):
    """A variable holding a DTensor; its layout is fixed when it is created.

    Assigning a value of another layout or mesh raises `tf.errors.InvalidArgumentError`
    (relayout the value first). Reads return DTensors with the variable's layout.

    `tf.train.Checkpoint` saves the variable's global value under the ordinary key, so
    the checkpoint is the one a `tf.Variable` of the same shape writes; restoring lays the
    saved value out as this variable, whatever layout or mesh it was saved from.

    Args:
      initial_value: a DTensor (its layout becomes the variable's), a callable, or a
        regular tensor together with `layout=`.
      *args, dtype, **kwargs: as for `tf.Variable`; `layout=` gives the layout.

    Example:
      >>> v = DVariable(call_with_layout(tf.zeros, Layout(["x", UNSHARDED], mesh), [4, 2]))
      >>> v.assign_add(call_with_layout(tf.ones, v.layout, [4, 2]))
    """

    def __init__(self, initial_value, *args, dtype=None, **kwargs):
        if not context.executing_eagerly():
            # Created while tracing a tf.function: the variable is made once, eagerly, as
            # tf.function lifts tf.Variables (create it on the first call only).
            if isinstance(initial_value, tensor_lib.Tensor) and initial_value.graph.building_function:
                raise RuntimeError(
                    "A DVariable created inside a tf.function is created eagerly, once, so its "
                    "initial value cannot be a tensor computed in the function. Pass a callable "
                    "(`DVariable(lambda: tf.zeros(shape), layout=layout)`) or a value made "
                    "outside the function.")
            with ops.init_scope():
                self.__init__(initial_value, *args, dtype=dtype, **kwargs)
            return
        layout = kwargs.pop("layout", None)
        if callable(initial_value):
            initial_value = api.call_with_layout(initial_value, layout) if layout else initial_value()
        initial_value = ops.convert_to_tensor(initial_value, dtype=dtype)
        if api.is_dtensor(initial_value):
            value_layout = api.fetch_layout(initial_value)
            if layout is not None and layout != value_layout:
                raise LayoutError(f"DVariable got `layout={layout.short()}` but its initial value "
                                  f"has layout {value_layout.short()}; relayout the value or drop "
                                  f"`layout=`.")
            layout = value_layout
        elif layout is not None:
            initial_value = api.copy_to_mesh(initial_value, layout)
        else:
            raise LayoutError("DVariable needs a DTensor initial value or a `layout=`; got a "
                              "regular tensor. Use `copy_to_mesh(value, layout)` or pass "
                              "`layout=`.")
        self.layout = layout
        with ops.device(_device.DEVICE_NAME), _device.layout_scope(layout):
            super().__init__(initial_value, *args, dtype=dtype, **kwargs)

    # Checkpointing (see checkpoint.py): the global value, on the host, under the usual key.

    def _serialize_to_tensors(self):
        return checkpoint.serialize_to_tensors(self)

    def _restore_from_tensors(self, restored_tensors):
        return checkpoint.restore_from_tensors(self, restored_tensors)

    def _copy_trackable_to_cpu(self, object_map):
        checkpoint.copy_trackable_to_cpu(self, object_map)
