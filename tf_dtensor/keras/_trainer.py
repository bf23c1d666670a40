"""The Keras hooks of `keras.src.backend.tensorflow.trainer.TensorFlowTrainer`
(`make_{train,test,predict}_function`): a model with DVariables, or one run under a
distribution, has its variables still off the mesh moved onto it first, each host batch laid
out on the mesh before the step runs, and the step's outputs brought back as regular
tensors before Keras reads them. `_hooks.install` puts them in place."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Dict

import tensorflow as tf

from tf_dtensor._errors import LayoutError
from tf_dtensor.keras import _backend, _scopes
from tf_dtensor.keras._scopes import default_mesh, is_distributed


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
    return _scopes.VARIABLES_MADE[0], len(_state_variables(model)), distribution


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


def install(trainer_class) -> None:
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
