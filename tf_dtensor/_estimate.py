"""`debug.estimate(fn, *args)`: what a call of `fn` will cost each device, before it runs.

`fn` (a `tf.function`, or a Python function, traced into one) is traced for `args` and
expanded for their layouts exactly as a call would expand it (the same rules, relayouts
and collectives; the expansion is cached, so a later call with the same layouts reuses
it), but nothing runs. Arguments may be abstract: `spec(shape, dtype, layout)` stands
for a DTensor of that global shape and layout, `tf.TensorSpec` for a regular tensor;
DTensors, regular tensors and the variables `fn` captures are read for their shapes and
layouts only.

Read off the expanded program (cc/graph/cost.h), per device:
    arguments       bytes of this device's blocks of the tensor arguments
    variables       bytes of its blocks of the variables the function uses
    intermediates   the most bytes the function's own buffers hold at once (its results
                    among them), in one order the ops can run in, each buffer freed after
                    its last reader; in-place elementwise ops and ops that hand their
                    input on (Identity, Reshape, variable reads) allocate nothing
    peak            arguments + variables + intermediates
    flops           2·m·n·k per matrix product, 2 per multiply-add of a convolution,
                    one per element of elementwise ops and per input element of
                    reductions (data movement: none)
and the collectives the expansion issues per call, as the ledger records them
(`debug.collectives()`): their bytes per device are exact, the same figures a run
records. A loop body counts once; both branches of a conditional are listed, the larger
counted for memory and FLOPs. Where devices share buffers (virtual CPUs) a value the same
on several devices is computed, and counted, once.

On a mesh that spans clients, every client must call `estimate` for the same function
and layouts, in the same order as its other calls: expanding a function takes its
collectives' keys in program order, as a call does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import dtypes

from tf_dtensor import _device
from tf_dtensor import _ledger
from tf_dtensor import api
from tf_dtensor.layout import Layout


@dataclasses.dataclass(frozen=True)
class Spec:
    """An abstract DTensor: its global shape, dtype and layout (no values)."""
    shape: tuple
    dtype: tf.DType
    layout: Layout


def spec(shape: Sequence[int], dtype, layout: Layout) -> Spec:
    """An abstract DTensor argument for `estimate`: global `shape`, `dtype`, `layout`.

    Raises:
      ValueError: the layout's rank differs from the shape's, or a dim is unknown.
    """
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"debug.spec needs a fully known global shape; got {list(shape)}.")
    if not layout.is_single_device() and layout.rank != len(shape):
        raise ValueError(f"debug.spec: layout {layout.short()} has rank {layout.rank} but "
                         f"the shape {list(shape)} has rank {len(shape)}.")
    return Spec(shape, tf.as_dtype(dtype), layout)


@dataclasses.dataclass(frozen=True)
class DeviceEstimate:
    """One device's share of a call (see the module docstring)."""
    argument_bytes: int
    variable_bytes: int
    intermediate_bytes: int
    flops: int

    @property
    def peak_bytes(self) -> int:
        return self.argument_bytes + self.variable_bytes + self.intermediate_bytes


@dataclasses.dataclass
class Estimate:
    """What one call of `function` costs, per device (short names, "CPU:0")."""
    function: str
    devices: Dict[str, DeviceEstimate]
    collectives: List[_ledger.Collective]
    unknown_sizes: int = 0    # outputs of data-dependent size, counted as 0 bytes
    has_loops: bool = False   # a loop body was counted for one iteration

    @property
    def peak_bytes(self) -> int:
        """The largest peak over the devices."""
        return max((d.peak_bytes for d in self.devices.values()), default=0)

    @property
    def flops(self) -> int:
        """The most FLOPs any one device does."""
        return max((d.flops for d in self.devices.values()), default=0)

    @property
    def total_flops(self) -> int:
        return sum(d.flops for d in self.devices.values())

    def collective_bytes(self, **filters) -> int:
        """The bytes each device receives over the collectives (the ledger's
        `total_bytes`, with `Ledger.select`'s filters: kind=, mesh_dim=, op=, ...)."""
        return self.ledger().total_bytes(**filters)

    def ledger(self) -> _ledger.Ledger:
        """The collectives as a `Ledger` (`select`, `count`, `table`, `plot`)."""
        return _ledger.Ledger._of(self.collectives)  # pylint: disable=protected-access

    def table(self) -> str:
        """Per device: arguments, variables, intermediates, peak and FLOPs; then the
        collectives, as the ledger's table."""
        rows = [("device", "arguments", "variables", "intermediates", "peak", "FLOPs")]
        for name, d in sorted(self.devices.items(), key=lambda kv: _device_order(kv[0])):
            rows.append((name, _ledger._bytes(d.argument_bytes),  # pylint: disable=protected-access
                         _ledger._bytes(d.variable_bytes),  # pylint: disable=protected-access
                         _ledger._bytes(d.intermediate_bytes),  # pylint: disable=protected-access
                         _ledger._bytes(d.peak_bytes), _flops(d.flops)))  # pylint: disable=protected-access
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [f"estimate of '{self.function}' (planned, not run)"]
        for r in rows:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        notes = []
        if self.has_loops:
            notes.append("a loop body is counted for one iteration")
        if self.unknown_sizes:
            notes.append(f"{self.unknown_sizes} outputs of data-dependent size counted as 0 B")
        if notes:
            lines.append("(" + "; ".join(notes) + ")")
        lines.append("")
        lines.append(self.ledger().table() if self.collectives else "no collectives")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _device_order(name: str):
    kind, _, index = name.rpartition(":")
    return (kind, int(index) if index.isdigit() else 0)


def _flops(n: int) -> str:
    for unit, size in (("T", 10 ** 12), ("G", 10 ** 9), ("M", 10 ** 6), ("K", 10 ** 3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


def _short(device: str) -> str:
    return device.rsplit("device:", 1)[-1]


def _trace_arg(value):
    if isinstance(value, Spec):
        return tf.TensorSpec(value.shape, value.dtype)
    return value


def _meta(value, variables: Mapping[int, tf.Variable]):
    """(layout, global shape, dtype enum, resource) of one input, as the device reads it
    from a call's input; the layout is the C++ layout (None: a regular tensor)."""
    if isinstance(value, Spec):
        return (value.layout._layout, list(value.shape),  # pylint: disable=protected-access
                value.dtype.as_datatype_enum, None)
    if isinstance(value, tf.TensorSpec):
        if not value.shape.is_fully_defined():
            raise ValueError(f"debug.estimate needs fully known shapes; got {value}.")
        return (None, value.shape.as_list(), value.dtype.as_datatype_enum, None)
    variable = None
    if isinstance(value, tf.Variable):  # passed in: its handle is the input
        variable, value = value, value.handle
    if isinstance(value, np.ndarray):
        return (None, list(value.shape), dtypes.as_dtype(value.dtype).as_datatype_enum, None)
    if value.dtype == tf.resource:
        variable = variable if variable is not None else variables.get(id(value))
        if variable is None or not api.is_dtensor(value):
            return (None, [], tf.resource.as_datatype_enum, None)
        layout = variable.layout
        return (Layout.replicated(layout.mesh, 0)._layout, [],  # pylint: disable=protected-access
                tf.resource.as_datatype_enum,
                (layout._layout, [int(d) for d in variable.shape],  # pylint: disable=protected-access
                 variable.dtype.as_datatype_enum))
    shape = [int(d) for d in value.shape]
    if api.is_dtensor(value):
        return (api.fetch_layout(value)._layout, shape,  # pylint: disable=protected-access
                value.dtype.as_datatype_enum, None)
    return (None, shape, value.dtype.as_datatype_enum, None)


def estimate(fn, *args, **kwargs) -> Estimate:
    """Plans `fn(*args, **kwargs)` for its arguments' layouts and shapes and reports what a
    call costs each device, without running it. See the module docstring.

    Args:
      fn: a `tf.function` or a Python function (traced into one).
      *args, **kwargs: `spec(shape, dtype, layout)` for an abstract DTensor,
        `tf.TensorSpec` for a regular tensor, DTensors, regular tensors or Python values.

    Returns:
      An `Estimate`: per device `argument_bytes`, `variable_bytes`, `intermediate_bytes`,
      `peak_bytes` and `flops`, the `collectives` (as the ledger records them) and
      `table()`. `compare({"name": estimate, ...})` sets several side by side.

    Raises:
      ValueError: no argument or captured variable is a DTensor (nothing to plan), or
        the inputs could not be matched with the function's.
      The planning error of an op (a `LayoutError`, ...) as a call would raise it.

    Example:
      >>> from tf_dtensor import debug, dtensor
      >>> mesh = dtensor.create_mesh([("batch", 2)], devices=["CPU:0", "CPU:1"])
      >>> w = dtensor.DVariable(tf.ones([784, 10]), layout=dtensor.Layout.replicated(mesh, 2))
      >>> @tf.function
      ... def step(x):
      ...     return tf.reduce_sum(tf.matmul(x, w))
      >>> x = debug.spec([128, 784], tf.float32, dtensor.Layout(["batch", dtensor.UNSHARDED], mesh))
      >>> print(debug.estimate(step, x).table())
      estimate of '__inference_step_...' (planned, not run)
      device  arguments  variables  intermediates       peak   FLOPs
      CPU:0     196 KiB   30.6 KiB        2.5 KiB  229.1 KiB  1.00 M
      CPU:1     196 KiB        0 B        2.5 KiB  198.5 KiB  1.00 M
      <BLANKLINE>
      where  op        collective                  n  bytes/device  layout   ...
      step   (output)  all-reduce(sum) over batch  1           4 B  [] +partial(batch:sum) -> [] ...
      total                                        1           4 B

    The replicated variable counts on CPU:0 only: virtual CPUs share one buffer for it.
    """
    function = fn if hasattr(fn, "get_concrete_function") else tf.function(fn)
    trace_args, trace_kwargs = tf.nest.map_structure(_trace_arg, (args, kwargs))
    concrete = function.get_concrete_function(*trace_args, **trace_kwargs)
    concrete.add_to_graph()  # it and the functions its ops call, by name
    name = concrete.name.decode() if isinstance(concrete.name, bytes) else str(concrete.name)
    flat_args = [a for a in tf.nest.flatten((args, kwargs))
                 if isinstance(a, (tf.Tensor, tf.Variable, np.ndarray, Spec, tf.TensorSpec))]
    externals = flat_args + list(concrete.captured_inputs)
    inputs = list(concrete.graph.inputs)
    if len(inputs) != len(externals):
        raise ValueError(f"debug.estimate could not match the {len(inputs)} inputs of "
                         f"'{name}' with its {len(externals)} arguments and captures; pass "
                         f"tensors and specs (not nested Python structures).")
    variables = {id(v.handle): v for v in concrete.variables}
    metas = [_meta(value, variables) for value in externals]
    mesh = next((m[0].mesh for m in metas if m[0] is not None), None)
    if mesh is None:
        raise ValueError(f"debug.estimate: no argument of '{name}' is a DTensor and it uses "
                         f"no DVariable, so it would not run on a mesh. Pass "
                         f"debug.spec(shape, dtype, layout) for the sharded arguments.")
    planned = _device.get().plan_function(name, mesh, metas)
    devices = {_short(device): DeviceEstimate(**figures)
               for device, figures in planned["devices"].items()}
    return Estimate(function=name, devices=devices,
                    collectives=[_ledger._record(r) for r in planned["collectives"]],  # pylint: disable=protected-access
                    unknown_sizes=planned["unknown_sizes"], has_loops=planned["has_loops"])


def compare(estimates: Mapping[str, Estimate]) -> str:
    """Several estimates side by side (e.g. the same step under two sets of layouts), one
    column each; per-device figures are the largest over the devices.

    Example:
      >>> from tf_dtensor import debug, dtensor
      >>> mesh = dtensor.create_mesh([("batch", 2)], devices=["CPU:0", "CPU:1"])
      >>> w = dtensor.DVariable(tf.ones([784, 10]), layout=dtensor.Layout.replicated(mesh, 2))
      >>> @tf.function
      ... def step(x):
      ...     return tf.reduce_sum(tf.matmul(x, w))
      >>> sharded = debug.spec([128, 784], tf.float32,
      ...                      dtensor.Layout(["batch", dtensor.UNSHARDED], mesh))
      >>> whole = debug.spec([128, 784], tf.float32, dtensor.Layout.replicated(mesh, 2))
      >>> print(debug.compare({"data": debug.estimate(step, sharded),
      ...                      "replicated": debug.estimate(step, whole)}))
                                 data  replicated
      peak memory / device  229.1 KiB   427.6 KiB
        arguments             196 KiB     392 KiB
        variables            30.6 KiB    30.6 KiB
        intermediates         2.5 KiB       5 KiB
      FLOPs / device           1.00 M      2.01 M
      collectives                   1           0
      bytes moved / device        4 B         0 B
    """
    names = list(estimates)
    rows = [("",) + tuple(names)]
    figures = [
        ("peak memory / device", lambda e: _ledger._bytes(e.peak_bytes)),  # pylint: disable=protected-access
        ("  arguments", lambda e: _ledger._bytes(_most(e, "argument_bytes"))),  # pylint: disable=protected-access
        ("  variables", lambda e: _ledger._bytes(_most(e, "variable_bytes"))),  # pylint: disable=protected-access
        ("  intermediates", lambda e: _ledger._bytes(_most(e, "intermediate_bytes"))),  # pylint: disable=protected-access
        ("FLOPs / device", lambda e: _flops(e.flops)),
        ("collectives", lambda e: str(len(e.collectives))),
        ("bytes moved / device", lambda e: _ledger._bytes(e.collective_bytes())),  # pylint: disable=protected-access
    ]
    for label, read in figures:
        rows.append((label,) + tuple(read(estimates[n]) for n in names))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                     for r in rows)


def _most(e: Estimate, field: str) -> int:
    return max((getattr(d, field) for d in e.devices.values()), default=0)
