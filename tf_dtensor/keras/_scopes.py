"""What the Keras hooks share (`_hooks.py`, `_trainer.py`): the layouts and meshes a layer
or a step asks new variables for (per thread), whether a Keras variable is backed by a
DVariable, and how many Keras variables were initialized so far."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterator, Optional

from tf_dtensor import _tensors

_STATE = threading.local()

# Keras variables initialized so far (the variable hooks' `_initialize`, the one place a
# variable gets its backing value): the trainer's stamp of a model holds while none was.
VARIABLES_MADE = [0]


@contextlib.contextmanager
def _pushed(name: str, value: Any) -> Iterator[None]:
    """Within: `value` is the innermost entry of this thread's stack `name`."""
    stack = _STATE.__dict__.setdefault(name, [])
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


def _innermost(name: str) -> Optional[Any]:
    stack = _STATE.__dict__.get(name)
    return stack[-1] if stack else None


def weight_layouts(layouts: Dict[str, Any]):
    """Within: a variable whose path ends with a key is made in that key's layout.

    `layouts` maps a path under the layer to a function rank -> Layout.
    """
    return _pushed("layouts", layouts)


def default_mesh(mesh):
    """Within: a Keras variable with no other layout is replicated on `mesh`."""
    return _pushed("meshes", mesh)


def innermost_mesh():
    return _innermost("meshes")


def asked_layout(path: str) -> Optional[Any]:
    """The resolver (rank -> Layout) the innermost layer gave for the weight at `path`.

    Keys are paths under the layer (`"kernel"`, `"query/kernel"`); the longest key that
    ends `path` wins.
    """
    layouts = _innermost("layouts")
    if not layouts:
        return None
    keys = [key for key in layouts if path == key or path.endswith("/" + key)]
    return layouts[max(keys, key=len)] if keys else None


def is_distributed(variable) -> bool:
    """Whether a Keras variable is backed by a DVariable."""
    return getattr(variable, "_value", None) is not None and _tensors.is_dtensor_value(variable._value)
