"""`DVariable`: a resource variable whose value is a DTensor with a fixed layout."""

from __future__ import annotations

import functools

from tensorflow.python.eager import context
from tensorflow.python.framework import dtypes
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor as tensor_lib
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.trackable import base as trackable

from tf_dtensor import _device
from tf_dtensor import api
from tf_dtensor import _tensors
from tf_dtensor import checkpoint
from tf_dtensor._errors import LayoutError


class DVariable(resource_variable_ops.ResourceVariable):
    """A variable holding a DTensor; its layout is fixed when it is created.

    Assigning a value of another layout or mesh raises `tf.errors.InvalidArgumentError`
    (relayout the value first). Reads return DTensors with the variable's layout.

    `tf.train.Checkpoint` saves the variable under the ordinary key, one slice per
    distinct shard (as TensorFlow's DTensor does), so a `tf.Variable` of the same shape
    reads the checkpoint; restoring reads each device's slice in this variable's layout,
    whatever layout or mesh it was saved from. `save_as_bf16` (see `enable_save_as_bf16`)
    writes a float32 variable as bfloat16 and reads it back as float32.

    Args:
      initial_value: a DTensor (its layout becomes the variable's), a callable, or a
        regular tensor together with `layout=`.
      *args, dtype, **kwargs: as for `tf.Variable`; `layout=` gives the layout.

    Example:
      >>> mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:0", "CPU:1"])
      >>> layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
      >>> v = DVariable(dtensor.call_with_layout(tf.zeros, layout, [4, 2]))
      >>> _ = v.assign_add(dtensor.call_with_layout(tf.ones, v.layout, [4, 2]))
      >>> v.layout.short(), float(tf.reduce_sum(v))
      ('[x,*] @ mesh(x=2)', 8.0)
    """

    def __init__(self, initial_value, *args, dtype=None, **kwargs):
        if not context.executing_eagerly():
            # Created while tracing a tf.function: the variable is made once, eagerly, as
            # tf.function lifts tf.Variables (create it on the first call only).
            # A value made outside the function is an eager tensor, which has no graph.
            if (isinstance(initial_value, tensor_lib.Tensor)
                    and not isinstance(initial_value, ops.EagerTensor)
                    and initial_value.graph.building_function):
                raise RuntimeError(
                    "A DVariable created inside a tf.function is created eagerly, once, so its "
                    "initial value cannot be a tensor computed in the function. Pass a callable "
                    "(`DVariable(lambda: tf.zeros(shape), layout=layout)`) or a value made "
                    "outside the function.")
            with ops.init_scope():
                self.__init__(initial_value, *args, dtype=dtype, **kwargs)
            return
        layout = kwargs.pop("layout", None)
        if layout is not None and layout.is_partial:
            raise LayoutError(f"A DVariable holds values, not pending reductions: `layout="
                              f"{layout.short()}` is partial. Use "
                              f"`layout.without_partial()` (a partial initial value is reduced "
                              f"into it).")
        if callable(initial_value):
            initial_value = api.call_with_layout(initial_value, layout) if layout else initial_value()
        initial_value = ops.convert_to_tensor(initial_value, dtype=dtype)
        if _tensors.is_dtensor_value(initial_value):
            value_layout = api.fetch_layout(initial_value)
            if layout is not None and layout != value_layout.without_partial():
                raise LayoutError(f"Conflicting layout are provided: DVariable got "
                                  f"`layout={layout.short()}` but its initial value has layout "
                                  f"{value_layout.short()}; relayout the value or drop `layout=`.")
            layout = value_layout
            if layout.is_partial:
                # Pending sums are reduced into the variable, as an assign reduces them.
                layout = layout.without_partial()
                initial_value = api.relayout(initial_value, layout)
        elif layout is not None:
            initial_value = api.copy_to_mesh(initial_value, layout)
        else:
            raise LayoutError("DVariable needs a DTensor initial value or a `layout=`; got a "
                              "regular tensor (Neither layout nor DTensor initial value are "
                              "provided.). Use `copy_to_mesh(value, layout)` or pass `layout=`.")
        self.layout = layout
        with ops.device(_device.DEVICE_NAME), _device.layout_scope(layout):
            super().__init__(initial_value, *args, dtype=dtype, **kwargs)

    @property
    def _layout(self):
        """The layout under the name Keras reads of the variable an optimizer makes slots
        for (`add_variable_from_reference`): a Keras optimizer's slots of a DVariable get
        its layout (they were made replicated, and the first sharded update was refused)."""
        return self.layout

    # Checkpointing (see checkpoint.py): one slice per distinct shard, under the usual key.

    @property
    def save_as_bf16(self) -> bool:
        """Whether checkpoints hold this float32 variable as bfloat16 (False by default)."""
        return checkpoint.saves_as_bf16(self)

    @save_as_bf16.setter
    def save_as_bf16(self, save_as_bf16: bool) -> None:
        # As in TensorFlow's DTensor: only a float32 variable is ever saved as bfloat16.
        self._save_as_bf16 = bool(save_as_bf16) and self.dtype == dtypes.float32

    def _gather_saveables_for_checkpoint(self):
        # Defining this (and not `_serialize_to_tensors`) makes TensorFlow save and restore
        # the variable through `DVariableSaveable`.
        return {trackable.VARIABLE_VALUE_KEY:
                functools.partial(checkpoint.DVariableSaveable, self)}

    def _copy_trackable_to_cpu(self, object_map):
        checkpoint.copy_trackable_to_cpu(self, object_map)
