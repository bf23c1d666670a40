"""`explain(model)`: how each variable of a Keras model is laid out, and why."""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional

from tf_dtensor.keras import _backend, _hooks


class VariablePlan(NamedTuple):
    """One variable: its path, the rule that gave its layout, and what that costs a device."""
    path: str
    shape: tuple
    dtype: str
    rule: str
    layout: Optional[str]      # short form, None when the variable is not on a mesh
    bytes_per_device: int      # the largest block
    divides: bool              # False: uneven blocks (allowed; the last ones are smaller)


def _plan(variable) -> VariablePlan:
    shape = tuple(int(d) for d in variable.shape)
    dtype = str(variable.dtype)
    if not _hooks.is_distributed(variable):
        return VariablePlan(variable.path, shape, dtype, "not on a mesh (no distribution)",
                            None, _backend.bytes_per_device(shape, dtype, None), True)
    layout = variable._value.layout
    rule = getattr(variable, "_tf_dtensor_rule", None) or "given to the variable"
    return VariablePlan(variable.path, shape, dtype, rule, layout.short(),
                        _backend.bytes_per_device(shape, dtype, layout),
                        bool(layout.is_even(shape)))


def _variables(model) -> list:
    if not hasattr(model, "weights"):
        raise TypeError(f"explain takes a Keras model or layer; got {model!r} "
                        f"({type(model).__name__}). Pass the model, e.g. "
                        f"`tf_dtensor.keras.explain(model)`.")
    seen, result = set(), []
    optimizer = getattr(model, "optimizer", None)
    extra = list(optimizer.variables) if optimizer is not None and optimizer.built else []
    for variable in list(model.weights) + extra:
        if id(variable) not in seen:
            seen.add(id(variable))
            result.append(variable)
    return result


def explain(model, print_fn: Optional[Callable[[str], None]] = print) -> List[VariablePlan]:
    """Prints and returns, per variable of `model` (and its built optimizer), its layout plan.

    Each row: the variable's path, shape and dtype; the rule that laid it out (the
    `LayoutMap` key that matched, a layer layout argument, `DataParallel`, or "no LayoutMap
    rule matched: replicated"); its layout; the bytes of its largest block on one device;
    and whether its shape divides the mesh dimensions that shard it. Shapes that do not
    divide are allowed: the blocks are ceil(n/k) long and the last ones shorter.

    Args:
      model: a built Keras model or layer.
      print_fn: where the table goes; None prints nothing.

    Returns:
      A `VariablePlan` per variable (`path`, `shape`, `dtype`, `rule`, `layout`,
      `bytes_per_device`, `divides`).

    Raises:
      TypeError: `model` is not a Keras model or layer.

    Example:
      >>> import keras, tf_dtensor
      >>> mesh = keras.distribution.DeviceMesh((2, 4), ["batch", "model"],
      ...                                      keras.distribution.list_devices()[:8])
      >>> layout_map = keras.distribution.LayoutMap(mesh)
      >>> layout_map[".*dense.*kernel"] = (None, "model")
      >>> keras.distribution.set_distribution(
      ...     keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch"))
      >>> model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, name="dense")],
      ...                          name="mlp")
      >>> plans = tf_dtensor.keras.explain(model)
      path              shape     dtype    layout                             per device  divides  rule
      mlp/dense/kernel  (16, 32)  float32  [*,model] @ mesh(batch=2,model=4)  512 B       yes      LayoutMap['.*dense.*kernel']
      mlp/dense/bias    (32,)     float32  [*] @ mesh(batch=2,model=4)        128 B       yes      no LayoutMap rule matched: replicated
      2 variables, 640 B on the busiest device at most
      >>> keras.distribution.set_distribution(None)
    """
    plans = [_plan(variable) for variable in _variables(model)]
    if print_fn is not None:
        print_fn(format_plans(plans))
    return plans


def estimate(model, x, y=None, sample_weight=None):
    """What one training step of `model` costs each device, planned without running it.

    `debug.estimate` of the model's `train_step` (what `fit` runs per batch) for a batch
    laid out as the active distribution lays out data: per device the bytes of the batch,
    of the variables (weights, optimizer slots, metrics), the most its intermediates hold
    at once, FLOPs, and every collective. Needs a built, compiled model under a
    `keras.distribution`; the optimizer is built if it is not.

    Args:
      model: a built, compiled Keras model.
      x, y, sample_weight: the global batch: arrays, tensors or `tf.TensorSpec`s (shapes
        and dtypes are all that is read).

    Returns:
      A `debug.Estimate` (`table()`; `debug.compare` sets several side by side).

    Raises:
      ValueError: no distribution is active, or the model is not built or compiled.

    On virtual CPUs the default lowering holds a value the same on several devices once
    (replicated weights show on one device); plan under `TF_DTENSOR_COLLECTIVES=copies`
    to see what devices with memory of their own (GPUs) would each hold.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tf_dtensor import debug  # pylint: disable=import-outside-toplevel
    from tf_dtensor.layout import Layout  # pylint: disable=import-outside-toplevel
    distribution = _backend.active_distribution()
    if distribution is None:
        raise ValueError("tf_dtensor.keras.estimate plans a step on the active "
                         "keras.distribution; none is set. Call it inside "
                         "`distribution.scope()` or after `keras.distribution.set_distribution`.")
    if not model.built or getattr(model, "optimizer", None) is None:
        raise ValueError(f"tf_dtensor.keras.estimate needs a built, compiled model; "
                         f"'{model.name}' is {'not built' if not model.built else 'not compiled'}"
                         f" (give it an Input or call it once, and compile it).")
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    mesh = _backend._to_backend_mesh(distribution.device_mesh)  # pylint: disable=protected-access

    def spec(value):
        shape = [int(d) for d in value.shape]
        layout = (_backend.to_layout(distribution.get_data_layout(shape), len(shape))
                  if shape else Layout.replicated(mesh, 0))
        return debug.spec(shape, tf.as_dtype(value.dtype), layout)

    data = tuple(spec(v) for v in (x, y, sample_weight) if v is not None)
    step = tf.function(model.train_step, autograph=False)
    return debug.estimate(step, data if len(data) > 1 else data[0])


def format_plans(plans: List[VariablePlan]) -> str:
    header = ("path", "shape", "dtype", "layout", "per device", "divides", "rule")
    rows = [header] + [(p.path, str(p.shape), p.dtype, p.layout or "-", _backend.human_bytes(p.bytes_per_device),
                        "yes" if p.divides else "no (uneven)", p.rule) for p in plans]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
             for row in rows]
    total = sum(p.bytes_per_device for p in plans)
    lines.append(f"{len(plans)} variables, {_backend.human_bytes(total)} on the busiest device at most")
    return "\n".join(lines)
