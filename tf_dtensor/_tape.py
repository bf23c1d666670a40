"""Eager gradients of DTensors stay DTensors.

`tf.GradientTape.gradient` seeds a target's gradient with a plain `1` on the default
device and, where no op of the backward pass reads a DTensor (the gradient of `sum(x)`,
of an empty slice), returns a plain tensor for a DTensor source: computed on one device,
with the source's shape but none of its layout. TensorFlow's DTensor does the same. Here,
eagerly and only when a target or a source is a DTensor:

- a DTensor target's missing output gradient is `ones_like(target)`, a DTensor of the
  target's layout, so the backward pass runs sharded like the forward one;
- a plain gradient left for a DTensor source (a gradient no sharded op produced, such as
  unconnected zeros) is moved onto the source's mesh, and every gradient takes its
  source's layout (a replicated gradient of a sharded source is sliced, each device
  keeping its own block; one of another layout is relaid out), so that an optimizer's
  eager update of a DVariable, whose layout is fixed, takes it.

Inside `tf.function` the expansion gives every gradient its layout already; nothing
changes there, nor for code without DTensors.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.eager import backprop
from tensorflow.python.ops import resource_variable_ops

from tf_dtensor import api
from tf_dtensor import _tensors
from tf_dtensor.layout import Layout

_original_gradient = backprop.GradientTape.gradient


def _is_dtensor(value) -> bool:
    try:
        return _tensors.is_dtensor_value(value)
    except (TypeError, ValueError, AttributeError):
        return False


def _variable_in(source):
    """The tf.Variable a tape source is, or holds (a Keras variable's `.value`), or None."""
    inner = getattr(source, "value", None)
    for candidate in (inner, source):
        if isinstance(candidate, resource_variable_ops.BaseResourceVariable):
            return candidate
    return None


def _dtensor_source(source):
    """The DTensor or DVariable a tape source is, or holds."""
    if _is_dtensor(source):
        return source
    variable = _variable_in(source)
    return variable if variable is not None and _is_dtensor(variable) else None


def _is_plain_variable(source) -> bool:
    """A tf.Variable (or a Keras variable holding one) that is not a DVariable."""
    variable = _variable_in(source)
    return variable is not None and not _is_dtensor(variable)


def _gradient(self, target, sources, output_gradients=None,
              unconnected_gradients=tf.UnconnectedGradients.NONE):
    if not tf.executing_eagerly():
        return _original_gradient(self, target, sources, output_gradients, unconnected_gradients)
    flat_targets = tf.nest.flatten(target)
    flat_sources = tf.nest.flatten(sources)
    dtensor_targets = [_is_dtensor(t) for t in flat_targets]
    dtensor_sources = [_dtensor_source(s) for s in flat_sources]
    if not any(dtensor_targets) and not any(s is not None for s in dtensor_sources):
        return _original_gradient(self, target, sources, output_gradients, unconnected_gradients)
    if output_gradients is None and any(dtensor_targets):
        output_gradients = [tf.ones_like(t) if is_d else None
                            for t, is_d in zip(flat_targets, dtensor_targets)]
    grads = _original_gradient(self, target, sources, output_gradients, unconnected_gradients)
    flat_grads = tf.nest.flatten(grads, expand_composites=False)
    if len(flat_grads) != len(flat_sources):
        return grads
    fixed = []
    for plain, source, grad in zip(flat_sources, dtensor_sources, flat_grads):
        if source is None and _is_dtensor(grad) and _is_plain_variable(plain):
            # A plain tf.Variable's gradient that sharded ops produced is made whole: its
            # update runs where the variable lives, which takes a replicated DTensor (as a
            # function does, cc/graph/function_expansion.cc, EmitOnPlainResource).
            grad_layout = api.fetch_layout(grad)
            if not grad_layout.is_fully_replicated():
                grad = api.relayout(grad, Layout.replicated(grad_layout.mesh, grad_layout.rank))
        elif source is not None and isinstance(grad, tf.Tensor):
            layout = api.fetch_layout(source)
            if not _is_dtensor(grad):
                grad = api.copy_to_mesh(grad, Layout.replicated(layout.mesh, layout.rank))
            # The gradient takes the source's layout, which an optimizer's update of a
            # DVariable needs (eager assigns keep a DVariable's layout): a replicated
            # gradient of a sharded source is sliced (no communication); one the backward
            # pass left in another layout (the [model,*] gradient of a replicated weight
            # after a [*,model] one) is relaid out, as inside tf.function the solver asks
            # for the variable's layout.
            grad_layout = api.fetch_layout(grad)
            if (grad_layout != layout and grad_layout.mesh == layout.mesh and
                    grad_layout.rank == layout.rank):
                grad = api.relayout(grad, layout)
        fixed.append(grad)
    return tf.nest.pack_sequence_as(grads, fixed)


def install() -> None:
    """Installs the gradient above on tf.GradientTape (once; idempotent)."""
    if backprop.GradientTape.gradient is not _gradient:
        backprop.GradientTape.gradient = _gradient
