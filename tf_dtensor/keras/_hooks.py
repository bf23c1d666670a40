"""Every place tf_dtensor touches Keras' internals, in one module (Keras 3.15).

Keras 3 asks its backend for a small distribution library (`list_devices`,
`distribute_tensor`, `distribute_data_input`, ...); on TensorFlow that library is an
unfinished prototype. `install()` puts tf_dtensor's in its place and changes four things:

- `keras.src.backend.tensorflow.distribution_lib`: the backend functions (`_backend.py`).
- `keras.src.backend.tensorflow.core.Variable`: a variable that has a layout (from the
  active distribution, a layer layout argument or its optimizer reference) is backed by a
  `DVariable` made directly in that layout; reading it whole (`numpy()`, `np.array`)
  gathers its shards.
- `keras.src.backend.tensorflow.trainer.TensorFlowTrainer.make_{train,test,predict}_function`:
  for a model with DVariables, or one run under a distribution, the model's variables
  still off the mesh are first moved onto it (a model built before `set_distribution`
  is laid out by the distribution; its optimizer, if built, finds its weights again),
  each host batch is laid out on the mesh (batch-sharded under a distribution) before the
  step runs, and the step's outputs come back as regular tensors before Keras reads them.

Everything else (LayoutMap matching, `get_variable_layout`, optimizers, metrics, saving)
is Keras' own code running on DTensors. Keras internals move between releases, so
`check_version` refuses a Keras minor version that these hooks were not tested with.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import weakref
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops
from keras.src.backend.common.stateless_scope import in_stateless_scope

from tf_dtensor import api
from tf_dtensor import _tensors
from tf_dtensor._errors import LayoutError
from tf_dtensor.keras import _backend
from tf_dtensor.layout import Layout
from tf_dtensor.variable import DVariable

# The Keras minor version these hooks were written and tested against.
KERAS_SERIES = "3.15"

_STATE = threading.local()
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


# ---- layouts a layer asks for by weight name (tf_dtensor.keras.layers) ----

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


def _default_mesh():
    return _innermost("meshes")


def _asked_layout(path: str) -> Optional[Any]:
    """The resolver (rank -> Layout) the innermost layer gave for the weight at `path`.

    Keys are paths under the layer (`"kernel"`, `"query/kernel"`); the longest key that
    ends `path` wins.
    """
    layouts = _innermost("layouts")
    if not layouts:
        return None
    keys = [key for key in layouts if path == key or path.endswith("/" + key)]
    return layouts[max(keys, key=len)] if keys else None


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
        _VARIABLES_MADE[0] += 1
        if isinstance(value, tf.Variable):
            return original_initialize(self, value)
        if self._shape is None and not callable(value):
            self._shape = self._validate_shape(value.shape)
        if self._layout is not None and not hasattr(self, "_tf_dtensor_rule"):
            self._tf_dtensor_rule = "its own layout= (an optimizer slot: its weight's)"
        asked = _asked_layout(self.path)
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
        mesh = _default_mesh()
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


def is_distributed(variable) -> bool:
    """Whether a Keras variable is backed by a DVariable."""
    return getattr(variable, "_value", None) is not None and _tensors.is_dtensor_value(variable._value)


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


# ---- keras.src.backend.tensorflow.trainer.TensorFlowTrainer ----

def _state_variables(model) -> list:
    optimizer = getattr(model, "optimizer", None)
    return (list(model.variables) + list(getattr(model, "metrics_variables", [])) +
            (list(optimizer.variables) if optimizer is not None else []))


def _slot_references(optimizer) -> Dict[int, Any]:
    """id of each variable of a built optimizer made from a model weight (a slot) -> that
    weight. Keras names a slot `{weight path, '/' as '_'}_{slot}` and gives it the weight's
    shape (`add_variable_from_reference`); the longest weight path that fits wins."""
    if optimizer is None or not getattr(optimizer, "built", False):
        return {}
    weights = list(getattr(optimizer, "_trainable_variables", []))
    references = {}
    for variable in optimizer.variables:
        fits = [weight for weight in weights
                if variable.name.startswith(weight.path.replace("/", "_") + "_") and
                tuple(variable.shape) == tuple(weight.shape)]
        if fits:
            references[id(variable)] = max(fits, key=lambda weight: len(weight.path))
    return references


def _optimizers(optimizer) -> list:
    """`optimizer` and those it wraps (a LossScaleOptimizer's inner one)."""
    found = []
    while optimizer is not None and optimizer not in found:
        found.append(optimizer)
        optimizer = getattr(optimizer, "inner_optimizer", None)
    return found


def _variable_keys(optimizer) -> list:
    """A built optimizer's key (`_var_key`) for each weight it updates, in order."""
    keys = []
    for each in _optimizers(optimizer):
        if getattr(each, "built", False):
            keys += [each._var_key(v) for v in getattr(each, "_trainable_variables", [])]
    return keys


def _rekey(optimizer, before: list) -> None:
    """A built optimizer finds a weight by a key made from the variable behind it
    (`_var_key`): after adoption put a DVariable there, the keys it holds are remade."""
    new = dict(zip(before, _variable_keys(optimizer)))
    for each in _optimizers(optimizer):
        if isinstance(getattr(each, "_trainable_variables_indices", None), dict):
            each._trainable_variables_indices = {
                new.get(key, key): index
                for key, index in each._trainable_variables_indices.items()}
        if isinstance(getattr(each, "_exclude_from_weight_decay", None), set):
            each._exclude_from_weight_decay = {
                new.get(key, key) for key in each._exclude_from_weight_decay}
        if isinstance(getattr(each, "_exclude_from_weight_decay_cache", None), dict):
            each._exclude_from_weight_decay_cache = {}


# Each model -> how many times `_adopt` has moved its variables: a step traced before the
# last move captured the variables it replaced, and is traced again.
_ADOPTIONS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

# Keras variables initialized so far (`_initialize`, the one place a variable gets its
# backing value), and each model -> (stamp, mesh) of its last `_adopt`, the stamp being
# that count, how many state variables the model reached and the active distribution.
# While the stamp holds, every variable the model reaches is as `_adopt` left it: none was
# made or given a value since, and none became reachable (a metric made before the
# distribution that the step's first trace compiles in, an optimizer built since). A step
# then costs a count of the model's variables instead of a device lookup for each.
_VARIABLES_MADE = [0]
_CHECKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _adopt(model) -> bool:
    """Moves every variable of `model` still off the mesh onto it: a step mixes no DVariable
    with a variable on one device. Returns whether it moved any.

    Under an active distribution whose mesh is the model's, or one while none of the
    model's variables is on a mesh (a model built before `set_distribution`), each is laid
    out as a variable made under the distribution would be: weights by its LayoutMap, an
    optimizer slot in its weight's layout, the rest replicated. Their values are kept.
    Otherwise (weights laid out by layer arguments, other variables made off the mesh: the
    optimizer's counters, metrics, plain layers) each is replicated on the model's mesh.
    A model laid out by another distribution (on another mesh), none of whose variables a
    layer argument laid out, moves to the active one: every variable is laid out again as
    if made under it, its value carried through the host.
    """
    distribution = _backend.active_distribution()
    checked = _CHECKED.get(model)
    if checked is not None and checked[0] == _stamp(model, distribution):
        return False
    moved = _adopt_unchecked(model, distribution)
    _CHECKED[model] = (_stamp(model, distribution), _model_mesh(model))
    return moved


def _stamp(model, distribution) -> tuple:
    return _VARIABLES_MADE[0], len(_state_variables(model)), distribution


def _adopted_mesh(model):
    """The mesh of `model`'s variables, as its last `_adopt` left them."""
    checked = _CHECKED.get(model)
    return checked[1] if checked is not None else _model_mesh(model)


def _step_mesh(model):
    """The mesh a step of `model` runs on, its batches laid out there.

    A model with variables runs where they are (`_adopted_mesh`). One that has none yet (a
    Sequential given no input shape, a subclassed model: built by the step's first trace)
    runs where that trace will make them, so that its first batch is laid out as every
    later one is (batch-sharded under a distribution; the first step computed the whole
    batch on every device): on the mesh a layer's layout arguments name (which keeps the
    model there, the batch replicated, as a built model on its layers' mesh is), else on the
    active distribution's mesh; None without either (a plain model). A built model none
    of whose variables is on a mesh runs as a plain one, its layers not searched at every
    step.
    """
    mesh = _adopted_mesh(model)
    if mesh is not None or getattr(model, "built", False):
        return mesh
    for layer in model._flatten_layers(include_self=True, recursive=True):
        declared = getattr(layer, "_tf_dtensor_mesh", None)
        mesh = declared() if callable(declared) else None
        if mesh is not None:
            return mesh
    distribution = _backend.active_distribution()
    return distribution.device_mesh.backend_mesh if distribution is not None else None


def _check_batch_dim(distribution) -> None:
    """Refuses a distribution whose batch dimension is not an axis of its mesh.

    Checked before any variable is laid out or batch placed, so that every model (one
    built by its first step too: a fit of one step once took
    `ModelParallel(batch_dim_name="nope")` without a word) is refused at its first step,
    with the mesh's axes and the fix.
    """
    name = getattr(distribution, "batch_dim_name", None)
    axes = list(distribution.device_mesh.axis_names)
    if name is not None and name not in axes:
        raise LayoutError(
            f"{type(distribution).__name__}(batch_dim_name={name!r}): the batch dimension "
            f"must be an axis of its DeviceMesh, whose axes are {axes} (Invalid axis names "
            f"for Layout). Pass batch_dim_name={axes[0]!r}, or name the axis that "
            f"splits the batch.")


def _adopt_unchecked(model, distribution) -> bool:
    mesh = _model_mesh(model)
    moving = False
    if distribution is not None:
        _check_batch_dim(distribution)
        distribution_mesh = distribution.device_mesh.backend_mesh
        if mesh is None:
            mesh = distribution_mesh
        elif distribution_mesh != mesh:
            # Made under another distribution: it moves to this one, unless a layer
            # argument pinned a weight to its mesh (that model stays where it is).
            moving = not any(getattr(v, "_tf_dtensor_rule", None) == "layer argument"
                             for v in model.variables)
            if moving:
                mesh = distribution_mesh
            else:
                distribution = None
    if mesh is None:
        return False
    state = list({id(v): v for v in _state_variables(model)}.values())
    chosen = [variable for variable in state
              if (moving or not is_distributed(variable)) and
              getattr(variable, "_value", None) is not None]
    if not chosen:
        return False
    optimizer = getattr(model, "optimizer", None)
    keys = _variable_keys(optimizer)
    references = _slot_references(optimizer) if distribution is not None else {}
    # Values are read before any variable moves (a slot's reference is its weight).
    values = [_backend.to_numpy(variable._value) if is_distributed(variable)
              else variable._value.read_value() for variable in chosen]
    for variable, value in zip(chosen, values):  # weights first: a slot takes its weight's
        variable._layout = None                 # new layout
        if hasattr(variable, "_tf_dtensor_rule"):
            del variable._tf_dtensor_rule
        reference = references.get(id(variable))
        if reference is not None and is_distributed(reference):
            variable._layout = reference._layout
            variable._tf_dtensor_rule = f"its weight's layout (`{reference.path}`)"
        with default_mesh(mesh):
            variable._initialize(value)
    _rekey(optimizer, keys)
    _ADOPTIONS[model] = _ADOPTIONS.get(model, 0) + 1
    return True


def _model_mesh(model):
    for variable in model.variables:
        if is_distributed(variable):
            return variable._value.layout.mesh
    return None


def _trainer_hooks(trainer_class) -> None:
    for which in ("train", "test", "predict"):
        _wrap_make_function(trainer_class, which)


def _wrap_make_function(trainer_class, which: str) -> None:
    attribute = f"{which}_function"
    original = getattr(trainer_class, f"make_{which}_function")

    @functools.wraps(original)
    def make_function(self, force=False):
        before = getattr(self, attribute)
        result = original(self, force=force)
        function = getattr(self, attribute)
        if function is not None and function is not before and \
                not getattr(function, "_tf_dtensor_wrapped", False):
            wrapped = _on_mesh(self, function, which, original)
            setattr(self, attribute, wrapped)
            if result is function:
                result = wrapped
        return result

    setattr(trainer_class, f"make_{which}_function", make_function)


def _on_mesh(model, function, which: str, make_original):
    """`function` taking host batches: lays each out on the model's mesh, returns host values.

    Keras calls the train/test function with a tf.data iterator or a list of batches
    (`train_on_batch`), and the predict function with a list of batches. Batches are
    pulled here, `steps_per_execution` at a time, and given to Keras' own step loop as a
    list, so its compiled step sees DTensors.

    Before each call, variables of the model still off the mesh are adopted onto it
    (`_adopt`): a model built before `set_distribution` is laid out by the distribution
    at its first step. A model not built yet runs its first step on the mesh its variables
    will be made on (`_step_mesh`), its batch laid out as at every later step. A variable
    adopted after the step was traced (a metric object made before the distribution, whose
    variables the step only reaches once its first trace has built the compiled metrics; a
    model trained before the distribution was set) gets a new backing DVariable, but the
    traced step still captures the old variable: its
    updates would land there while `reset_state` and `result()` use the new one. The step
    is then made (and traced) again.
    """
    attribute = f"{which}_function"
    state = {"function": function, "called": False, "adoptions": 0}

    def on_mesh(iterator_or_batches):
        function = state["function"]
        _adopt(model)
        adoptions = _ADOPTIONS.get(model, 0)
        if state["called"] and state["adoptions"] != adoptions:
            make_original(model, force=True)
            function = state["function"] = getattr(model, attribute)
            setattr(model, attribute, on_mesh)
        state["called"], state["adoptions"] = True, adoptions
        mesh = _step_mesh(model)
        if mesh is None:
            return function(iterator_or_batches)
        if which == "predict":
            batches = list(iterator_or_batches)
        else:
            batches = []
            source = iter(iterator_or_batches)
            for _ in range(model.steps_per_execution):
                try:
                    batches.append(next(source))
                except (StopIteration, tf.errors.OutOfRangeError):
                    break
            if not batches:
                raise StopIteration
        batches = [_backend.lay_out_batch(batch, mesh) for batch in batches]
        spec = getattr(iterator_or_batches, "element_spec", None)
        if which != "predict" and spec is not None:
            function = _traced_for(state, function, spec, len(batches), f"{which}_step")
        with default_mesh(mesh):
            return _backend.to_host(function(batches))

    on_mesh._tf_dtensor_wrapped = True
    return on_mesh


def _traced_for(state: dict, function, element_spec, count: int, name: str):
    """`function` (Keras' step loop over a list of batches) traced for `count` batches of
    the data iterator's `element_spec`, as a function called `name` (`train_step`,
    `test_step`: what `debug.collectives` and `tf_dtensor.keras.estimate` call the step).

    Keras gives `fit` and `evaluate` the iterator itself, and its step is traced for the
    iterator's element spec, whose batch dimension is unknown (`None`) unless the dataset
    drops its remainder. Here the batches arrive as DTensors of known size: traced for
    them, Keras code that reads a static size would see another value than on one device
    (a multi-output model's per-output loss metrics are weighted by `y_pred.shape[0]`, which
    is `None` on one device: each batch counts once, not per row). So the step is called
    from a function traced for the spec, as on one device.
    """
    if state.get("traced_function") is not function:  # Keras made the step anew
        state["traced_function"], state["traced"] = function, {}
    traced = state["traced"].get(count)
    if traced is None:
        def step(batches):
            return function(batches)

        step.__name__ = step.__qualname__ = name
        traced = state["traced"][count] = tf.function(
            step, input_signature=[[element_spec] * count], autograph=False)
    return traced


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
    _trainer_hooks(tf_trainer.TensorFlowTrainer)
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
