"""Every place tf_dtensor touches Keras' internals, in one module (Keras 3.15).

Keras 3 asks its backend for a small distribution library (`list_devices`,
`distribute_tensor`, `distribute_data_input`, ...); on TensorFlow that library is an
unfinished prototype. `install()` puts tf_dtensor's in its place and changes four things:

- `keras.src.backend.tensorflow.distribution_lib`: the backend functions (`_backend.py`).
- `keras.src.backend.tensorflow.core.Variable`: a variable that has a layout (from the
  active distribution, a layer layout argument or its optimizer reference) is backed by a
  `DVariable` made directly in that layout; reading it whole (`numpy()`, `np.array`)
  gathers its shards.
- `keras.src.backend.tensorflow.trainer.TensorFlowTrainer.make_{train,test,predict}_function`
  (`_trainer.py`): for a model with DVariables, or one run under a distribution, the
  model's variables still off the mesh are first moved onto it (a model built before
  `set_distribution` is laid out by the distribution; its optimizer, if built, finds its
  weights again), each host batch is laid out on the mesh (batch-sharded under a
  distribution) before the step runs, and the step's outputs come back as regular tensors
  before Keras reads them.

Everything else (LayoutMap matching, `get_variable_layout`, optimizers, metrics, saving)
is Keras' own code running on DTensors. Keras internals move between releases, so
`check_version` refuses a Keras minor version that these hooks were not tested with.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops
from keras.src.backend.common.stateless_scope import in_stateless_scope

from tf_dtensor import api
from tf_dtensor import _tensors
from tf_dtensor._errors import LayoutError
from tf_dtensor.keras import _backend, _scopes, _trainer
from tf_dtensor.keras._scopes import is_distributed, weight_layouts  # noqa: F401 (__all__)
from tf_dtensor.layout import Layout
from tf_dtensor.variable import DVariable

# The Keras minor version these hooks were written and tested against.
KERAS_SERIES = "3.15"

_INSTALLED = {"done": False}


def check_version(version: str) -> None:
    """Raises ImportError unless `version` is of the tested Keras series."""
    if version != KERAS_SERIES and not version.startswith(KERAS_SERIES + "."):
        raise ImportError(
            f"tf_dtensor.keras was tested with Keras {KERAS_SERIES}.x and reaches into its "
            f"internals (variables, trainer, backend distribution library); Keras {version} "
            f"is installed. Install `keras=={KERAS_SERIES}.*` (`pip install "
            f"'tf_dtensor[keras]'`) or use tf_dtensor's own API on this Keras.")


def check_backend(backend: str) -> None:
    if backend != "tensorflow":
        raise ImportError(
            f"tf_dtensor.keras shards Keras models on the TensorFlow backend; Keras runs on "
            f"`{backend}`. Set KERAS_BACKEND=tensorflow before importing Keras.")


# ---- keras.src.backend.tensorflow.core.Variable ----

def _distributed_variable_class(variable_class):
    """The class a Keras variable takes once a DVariable backs it: saved as the DVariable is.

    Keras' variable saves through `_serialize_to_tensors` (its backing variable's value,
    read on the host). A DVariable saves one slice per distinct block through its
    saveable; TensorFlow uses `_gather_saveables_for_checkpoint` when the first class of
    the MRO that defines either method defines that one.
    """

    class DistributedVariable(variable_class):
        def _gather_saveables_for_checkpoint(self):
            return self._value._gather_saveables_for_checkpoint()

        def _copy_trackable_to_cpu(self, object_map):
            self._value._copy_trackable_to_cpu(object_map)
            object_map[self] = object_map[self._value]

    DistributedVariable.__name__ = DistributedVariable.__qualname__ = variable_class.__name__
    return DistributedVariable


def _traced_constant(value, path):
    """The value of a variable made while a function is traced, as a host array: an
    optimizer that builds in its first train step (Nadam's `u_product`, Adafactor's
    slots) makes variables there from plain numbers, which arrive as the traced graph's
    constants. The variable itself lives outside the function, so its value must too."""
    static = tf.get_static_value(value)
    if static is None:
        raise TypeError(
            f"tf_dtensor: the Keras variable '{path}' was created while a function was being "
            f"traced, from a value computed in that function ({value.name}), which cannot "
            "be laid out on the mesh before the function runs. Create it before tracing: "
            "build the model and its optimizer first (`model.build(...)`, "
            "`model.optimizer.build(model.trainable_variables)`), or give the variable an "
            "initializer (a callable) instead of a value.")
    return static


def _variable_layout(variable) -> Layout:
    """The tf_dtensor `Layout` of a Keras variable about to be made (its `_layout`).

    Raises:
      LayoutError: the layout's rank is not the variable's (a LayoutMap key whose regex
        also matches variables of another rank); the message names the variable, its
        shape, the layout, the rule that gave it and the fix.
    """
    layout = _backend.as_layout(variable._layout)
    rank = len(variable._shape)
    if layout.rank == rank:
        return layout
    rule = getattr(variable, "_tf_dtensor_rule", None) or "its layout"
    if rule.startswith("LayoutMap["):
        fix = (f"Give that key a layout of rank {rank} (one entry per axis, e.g. "
               f"{(None,) * rank}), or narrow its regex so that it does not match "
               f"`{variable.path}`; `tf_dtensor.keras.explain(model)` lists each variable's "
               f"path and the rule that matched it")
    else:
        fix = f"Give it a layout of rank {rank} (one entry per axis)"
    raise LayoutError(
        f"Cannot lay out Keras variable `{variable.path}` (shape {tuple(variable._shape)}, "
        f"rank {rank}) as {layout.short()}: {rule} gave it a layout of rank {layout.rank}, "
        f"and a layout needs one entry per axis of the variable. {fix}.")


def _tell_tracing_function(variable) -> None:
    """Lets a tf.function being traced know that this trace made a variable.

    tf.function traces again after a first trace that made variables (Keras code branches
    on what they are: a LossScaleOptimizer built in the step scales the loss by its
    variable, not by its constant initial scale), and counts those `tf.Variable` made
    through its variable creator. A DVariable is made on the mesh outside the function,
    where that creator does not see it; a one-element marker made through the creator
    tells it instead (kept while the Keras variable lives, outside it: a Keras variable
    tracks its attributes into checkpoints).
    """
    if tf.inside_function() and ops.get_default_graph()._variable_creator_stack:
        key = id(variable)
        _TRACE_MARKERS[key] = tf.Variable(False, trainable=False,
                                          name="tf_dtensor_made_a_variable")
        weakref.finalize(variable, _TRACE_MARKERS.pop, key, None)


# id of a Keras variable made while a tf.function was traced -> its marker.
_TRACE_MARKERS: Dict[int, Any] = {}


def _variable_hooks(variable_class) -> None:
    original_initialize = variable_class._initialize
    distributed_classes: Dict[type, type] = {}
    original_direct_assign = variable_class._direct_assign

    def _initialize(self, value):
        _scopes.VARIABLES_MADE[0] += 1
        if isinstance(value, tf.Variable):
            return original_initialize(self, value)
        if self._shape is None and not callable(value):
            self._shape = self._validate_shape(value.shape)
        if self._layout is not None and not hasattr(self, "_tf_dtensor_rule"):
            self._tf_dtensor_rule = "its own layout= (an optimizer slot: its weight's)"
        asked = _scopes.asked_layout(self.path)
        if asked is not None and self._layout is None:
            try:
                self._layout = asked(len(self._shape))
            except LayoutError as error:
                # The argument's rank check knows the argument, not the variable it lays out.
                raise LayoutError(f"Cannot lay out Keras variable `{self.path}` (shape "
                                  f"{tuple(self._shape)}) by its layer's layout argument: "
                                  f"{error}") from None
            self._tf_dtensor_rule = "layer argument"
        distribution = _backend.active_distribution()
        mesh = _scopes.innermost_mesh()
        if distribution is not None and mesh is not None and \
                distribution.device_mesh.backend_mesh != mesh:
            distribution = None  # its model's (layer's) variables live on another mesh
        if self._layout is None and distribution is not None:
            self._layout = distribution.get_variable_layout(self)
            self._tf_dtensor_rule = rule_for(distribution, self)
        if self._layout is None and mesh is not None:
            self._layout = Layout.replicated(mesh, len(self._shape))
            self._tf_dtensor_rule = "replicated on the mesh of the model's other weights"
        if self._layout is None:
            return original_initialize(self, value)
        layout = _variable_layout(self)
        _backend.warn_if_replicated(self, layout, getattr(self, "_tf_dtensor_rule", None),
                                    rules_tried(distribution))
        with tf.init_scope():
            if callable(value):
                # The initializer runs sharded: no device holds the whole weight. Stateless
                # random ops give the same values as on one device.
                initial = api.call_with_layout(value, layout)
                if not _tensors.is_dtensor_value(initial) or api.fetch_layout(initial) != layout:
                    initial = _backend.distribute_tensor(initial, layout)
            else:
                if tf.is_symbolic_tensor(value):
                    value = _traced_constant(value, self.path)
                initial = _backend.distribute_tensor(tf.cast(value, self._dtype)
                                                     if not _tensors.is_dtensor_value(value) else value,
                                                     layout)
            self._value = DVariable(
                initial, trainable=self.trainable, name=self.name,
                aggregation=self._map_aggregation(self.aggregation),
                synchronization=self._map_synchronization(self.synchronization))
        _tell_tracing_function(self)
        cls = type(self)
        if cls not in distributed_classes.values():
            if cls not in distributed_classes:
                distributed_classes[cls] = _distributed_variable_class(cls)
            self.__class__ = distributed_classes[cls]

    def _direct_assign(self, value):
        if is_distributed(self) and not _tensors.is_dtensor_value(value):
            value = tf.cast(value, self._value.dtype)
            value = _backend.distribute_tensor(value, self._value.layout)
        return original_direct_assign(self, value)

    original_assign = variable_class.assign

    def assign(self, value):
        # A host array (a weights file being loaded) goes to each device block by block;
        # Keras' own assign would first make it one tensor on one device.
        if is_distributed(self) and isinstance(value, np.ndarray) and not in_stateless_scope():
            if tuple(value.shape) != tuple(self.shape):
                return original_assign(self, value)  # Keras' own shape error
            value = _backend.scatter_host_value(
                value.astype(tf.as_dtype(self._dtype).as_numpy_dtype), self._value.layout)
            self._value.assign(value)
            return value
        return original_assign(self, value)

    def numpy(self):
        return _backend.to_numpy(self.value)

    def __array__(self, dtype=None, copy=None):
        del copy  # to_numpy returns a new array
        array = _backend.to_numpy(self.value)
        return array.astype(dtype) if dtype is not None else array

    variable_class._initialize = _initialize
    variable_class._direct_assign = _direct_assign
    variable_class.assign = assign
    variable_class.numpy = numpy
    variable_class.__array__ = __array__


def layout_map_of(distribution) -> Optional[Any]:
    """The `LayoutMap` of a `ModelParallel` distribution (None for others)."""
    return getattr(distribution, "_layout_map", None)


def rules_tried(distribution) -> List[str]:
    layout_map = layout_map_of(distribution) if distribution is not None else None
    return list(layout_map) if layout_map is not None else []


def rule_for(distribution, variable) -> str:
    """Which rule gave `variable` its layout, in words (for `explain` and warnings).

    Matches as Keras' `LayoutMap.__getitem__` does: an exact key first, else the one key
    that `re.fullmatch`es the variable's path.
    """
    if variable._layout is not None and getattr(variable, "_tf_dtensor_rule", None):
        return variable._tf_dtensor_rule
    layout_map = layout_map_of(distribution)
    if layout_map is None:
        return f"{type(distribution).__name__}: replicated"
    key = _backend.layout_map_key(layout_map, variable.path)
    return f"LayoutMap[{key!r}]" if key is not None else "no LayoutMap rule matched: replicated"


# ---- install ----

def install() -> None:
    """Puts tf_dtensor under Keras' distribution API (idempotent; Keras must be imported)."""
    if _INSTALLED["done"]:
        return
    import keras
    from keras.src.backend.tensorflow import core as tf_core
    from keras.src.backend.tensorflow import distribution_lib
    from keras.src.backend.tensorflow import trainer as tf_trainer

    check_version(keras.__version__)
    check_backend(keras.backend.backend())
    for name in _backend.BACKEND_FUNCTIONS:
        setattr(distribution_lib, name, getattr(_backend, name))
    _variable_hooks(tf_core.Variable)
    _trainer.install(tf_trainer.TensorFlowTrainer)
    _numpy_hooks()
    _INSTALLED["done"] = True


def _numpy_hooks() -> None:
    """`keras.ops.convert_to_numpy` (and `np.asarray` through it) of a sharded DTensor gives
    its whole value, as Keras' JAX backend gathers a sharded array, instead of raising."""
    import keras.src.backend as backend
    from keras.src.backend import tensorflow as tf_backend
    from keras.src.backend.tensorflow import core as tf_core
    original = tf_core.convert_to_numpy

    def convert_to_numpy(x):
        return original(_backend.to_host(x))

    for module in (backend, tf_backend, tf_core):
        if getattr(module, "convert_to_numpy", None) is original:
            module.convert_to_numpy = convert_to_numpy


def installed() -> bool:
    return _INSTALLED["done"]


__all__ = ["KERAS_SERIES", "check_backend", "check_version", "install", "installed",
           "is_distributed", "weight_layouts"]
