"""The fuzzer's known mismatches: exact cases that fail for a reason outside tf_dtensor's
rules (TensorFlow kernels), each named by op, mesh, inputs, attributes and lowering."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class KnownMismatch:
    """One case that mismatches for a reason outside tf_dtensor's rules, named exactly: the
    op, the mesh, each tensor argument's dtype, shape and layout, the attributes, and the
    collective lowering (None: under each). A drawn case that matches is recorded as known,
    not as a mismatch; with `strict`, a match that passes is a mismatch (the cause is gone:
    remove the entry). test_fuzz.py also runs each entry's case directly."""
    op: str
    mesh: str                                          # short form: "mesh(x=4)"
    inputs: Tuple[Tuple[str, str, Tuple[int, ...], str], ...]  # (arg, dtype, shape, layout)
    attrs: Tuple[Tuple[str, Any], ...]
    reason: str
    lowering: Optional[str] = None
    strict: bool = True
    # The arguments the table derives from others, as its draw does (a pool's output from
    # its input): `derive(arrays, attrs)` -> {argument name: array}. The rest are random.
    derive: Optional[Callable[[Dict[str, np.ndarray], Dict[str, Any]],
                              Dict[str, np.ndarray]]] = None

    def case(self) -> str:
        """The case as `describe` prints it."""
        parts = [f"{arg}: {dtype}{list(shape)} {spec} @ {self.mesh}"
                 for arg, dtype, shape, spec in self.inputs]
        attrs = f"\n  attrs: {dict(self.attrs)}" if self.attrs else ""
        return "  " + "\n  ".join(parts) + attrs

    def matches(self, name: str, mesh, case: str, lowering: str) -> bool:
        return (name == self.op and mesh.short() == self.mesh and case == self.case() and
                self.lowering in (None, lowering))

    def __str__(self) -> str:
        lowering = f", {self.lowering or 'default'} lowering" if self.lowering is not None else ""
        return f"{self.op} on {self.mesh}{lowering}:\n{self.case()}\n  ({self.reason})"


# ---------------------------------------------------------------------------------------
# Known mismatches: exact cases (op, mesh, each input's dtype, shape and layout, attributes)
# that fail for a reason outside tf_dtensor's rules. A drawn case that matches one is
# recorded as known; a strict one that passes is a mismatch; test_fuzz.py also runs each
# directly (a strict xfail). Any other case of the same op is checked as usual.
# ---------------------------------------------------------------------------------------

# TensorFlow's oneDNN Conv2D kernel, not tf_dtensor: on one plain device
# Conv2D(x [2,5,4,1], w [2,3,1,2], strides [1,1,2,1], VALID) returns wrong values while each
# batch row alone, NumPy, and TF with TF_ENABLE_ONEDNN_OPTS=0 agree; the sharded run
# convolves each device's rows and is right, so the reference is what differs. Long runs
# set TF_ENABLE_ONEDNN_OPTS=0 (README, "Fuzzing").
_ONEDNN_CONV2D = "TensorFlow's oneDNN Conv2D gives a wrong one-device reference for this shape"
# oneDNN's kernels are TensorFlow's default on x86 CPUs; TF_ENABLE_ONEDNN_OPTS=0 (as long
# runs set it) turns them off, and with them the cause of the Conv2D entry, whose case then
# passes and is checked as any other.
_ONEDNN_ON = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip().lower() not in ("0", "false")

KNOWN_MISMATCHES = [
    *([KnownMismatch("Conv2D", "mesh(x=4)", (
        ("input", "float32", (2, 5, 4, 1), "[x,*,*,*]"),
        ("filter", "float32", (2, 3, 1, 2), "[x,*,*,*]")),
        (("strides", [1, 1, 2, 1]), ("padding", "VALID")), _ONEDNN_CONV2D)]
      if _ONEDNN_ON else []),
]
