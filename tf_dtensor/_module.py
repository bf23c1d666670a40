"""`distribute_module` and state dicts: PyTorch's module-level DTensor API for `tf.Module`s
and Keras layers (re-exported by `tf_dtensor.placements`).

PyTorch's parameters are TensorFlow's variables. Distributing a module replaces each
variable by a `DVariable` holding the same value laid out as the placements say:

    distribute_module(model, mesh, partition_fn)
      partition_fn("", model, mesh), partition_fn("fc1", model.fc1, mesh), ...
      every variable still off the mesh -> DVariable, [Replicate(), ...]

Where a variable lives differs: a `tf.Module` keeps it in an attribute (or a list, tuple or
dict in one), so the attribute gets the new variable; a Keras 3 layer keeps a
`keras.Variable` whose backing `tf.Variable` is swapped in place, so the layer, its
trackers and anything holding the Keras variable see the DVariable. Variables are named
as PyTorch names parameters: the attribute path (`fc1.weight`, `blocks.0.bias`); a Keras
layer's own variables by their name (`fc1.kernel`).
"""

from __future__ import annotations

import collections
import os
import sys
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Tuple

import tensorflow as tf

from tf_dtensor import api, checkpoint
from tf_dtensor import _placement_api
from tf_dtensor import _tensors
from tf_dtensor._placement_types import Replicate
from tf_dtensor._save_restore import _require_eager, name_based_restore, name_based_save
from tf_dtensor.layout import Layout
from tf_dtensor.mesh import Mesh
from tf_dtensor.variable import DVariable

# Modules that `distribute_module` has been applied to (PyTorch refuses a second call).
_DISTRIBUTED: "weakref.WeakSet" = weakref.WeakSet()
# The modules `distribute_module` is distributing now, innermost last: a variable a
# `partition_fn` distributes is replaced everywhere in the whole module (tied weights).
_ROOTS: List[Any] = []


def _keras():
    # Keras is never imported here: a Keras object exists only if the user imported it.
    return sys.modules.get("keras")


def _is_keras_layer(value) -> bool:
    keras = _keras()
    return keras is not None and isinstance(value, keras.layers.Layer)


def _is_keras_variable(value) -> bool:
    keras = _keras()
    return keras is not None and isinstance(value, keras.Variable)


def _is_module(value) -> bool:
    return isinstance(value, tf.Module) or _is_keras_layer(value)


def _is_variable(value) -> bool:
    return isinstance(value, tf.Variable) or _is_keras_variable(value)


def _check_module(module, function: str) -> None:
    if not _is_module(module):
        raise TypeError(f"`{function}` takes a `tf.Module` or a Keras layer; got "
                        f"{type(module).__name__}.")


# ---------------------------------------------------------------------------------------
# Walking a module: where its submodules and variables live
# ---------------------------------------------------------------------------------------

Setter = Callable[[Any], None]


def _attributes(module) -> Iterator[Tuple[str, Callable[[], Any], Setter]]:
    """(name, getter, setter) of each attribute that may hold submodules or variables.

    Keras keeps its own bookkeeping (`_layers`, `_tracked`, ...) in private attributes, so
    only a layer's public ones are walked; a `tf.Module`'s are all walked, as
    `tf.Module.variables` does.
    """
    if _is_keras_layer(module):
        keys = [k for k in vars(module) if not k.startswith("_")]
    else:
        ignored = getattr(type(module), "_TF_MODULE_IGNORED_PROPERTIES", frozenset())
        keys = [k for k in vars(module) if k not in ignored]
    for key in keys:
        yield key, (lambda k=key: getattr(module, k)), (lambda v, k=key: setattr(module, k, v))


def _leaves(name: str, get: Callable[[], Any], put: Setter
            ) -> Iterator[Tuple[str, Any, Setter]]:
    """Modules and variables in a value, looking through lists, tuples and dicts."""
    value = get()
    if _is_module(value) or _is_variable(value):
        yield name, value, put
    elif isinstance(value, Mapping):
        for key in list(value):
            yield from _leaves(f"{name}.{key}", lambda k=key: get()[k],
                               lambda v, k=key: get().__setitem__(k, v))
    elif isinstance(value, tuple):
        def put_item(v, i):  # a tuple is rebuilt and put back where it was
            old = get()
            items = [v if j == i else x for j, x in enumerate(old)]
            put(type(old)(*items) if hasattr(old, "_fields") else tuple(items))
        for i in range(len(value)):
            yield from _leaves(f"{name}.{i}", lambda i=i: get()[i],
                               lambda v, i=i: put_item(v, i))
    elif isinstance(value, list):
        for i in range(len(value)):
            yield from _leaves(f"{name}.{i}", lambda i=i: get()[i],
                               lambda v, i=i: get().__setitem__(i, v))


def _children(module) -> List[Tuple[str, Any]]:
    """The direct submodules of `module`, named by attribute path."""
    found = [(name, value) for key, get, put in _attributes(module)
             for name, value, _ in _leaves(key, get, put) if _is_module(value)]
    if _is_keras_layer(module):
        # Layers held only by Keras' trackers: a model's `layers.0`, `layers.1`, ... (stable
        # names, so that state dicts of two instances match), others by their names.
        known = {id(value) for _, value in found}
        listed = {id(layer): i for i, layer in enumerate(getattr(module, "layers", None) or [])}
        found += [(f"layers.{listed[id(layer)]}" if id(layer) in listed else layer.name, layer)
                  for layer in getattr(module, "_layers", [])
                  if id(layer) not in known and type(layer).__name__ != "InputLayer"]
    return found


def _own_variables(module) -> List[Tuple[str, Any, Optional[Setter]]]:
    """(local name, variable, setter) of the variables `module` itself holds.

    The setter puts a new variable where the old one was; a Keras variable needs none (its
    backing variable is swapped, see `_replace`).
    """
    if _is_keras_layer(module):
        own = list(module._trainable_variables) + list(module._non_trainable_variables)
        own += [g.state for g in getattr(module, "_seed_generators", [])]
        return [(v.name, v, None) for v in own]
    return [(name, value, put) for key, get, put in _attributes(module)
            for name, value, put in _leaves(key, get, put) if _is_variable(value)]


def named_modules(module) -> List[Tuple[str, Any]]:
    """The module and every submodule, depth first, named by attribute path (`""` for
    `module`; `"fc1"`, `"blocks.0"`, ...), each once.

    Example:
      >>> def linear(n_in, n_out):
      ...     layer = tf.Module()
      ...     layer.weight = tf.Variable(tf.ones([n_in, n_out]))
      ...     layer.bias = tf.Variable(tf.zeros([n_out]))
      ...     return layer
      >>> model = tf.Module()
      >>> model.fc1, model.fc2 = linear(8, 16), linear(16, 4)
      >>> [name for name, _ in named_modules(model)]
      ['', 'fc1', 'fc2']
    """
    _check_module(module, "named_modules")
    seen = set()
    out = []

    def visit(prefix: str, value) -> None:
        if id(value) in seen:
            return
        seen.add(id(value))
        out.append((prefix, value))
        for name, child in _children(value):
            visit(f"{prefix}.{name}" if prefix else name, child)

    visit("", module)
    return out


def _slots(module) -> List[Tuple[str, Any, Optional[Setter]]]:
    """(name, variable, setter) for every place a variable is held: a variable shared by
    two modules (tied weights) has two places and is replaced in both."""
    return [(f"{prefix}.{local}" if prefix else local, variable, put)
            for prefix, sub in named_modules(module)
            for local, variable, put in _own_variables(sub)]


def named_parameters(module, recurse: bool = True) -> List[Tuple[str, Any]]:
    """(name, variable) of each variable of `module` (with `recurse`, of its submodules
    too), each once: PyTorch's `named_parameters`, buffers included (`tf.Variable`s, or
    `keras.Variable`s for Keras layers).

    Args:
      module: a `tf.Module` or Keras layer.
      recurse: also the variables of its submodules.

    Returns:
      `[(name, variable), ...]`, depth first.

    Raises:
      TypeError: `module` is not a `tf.Module` or Keras layer.

    Example:
      >>> def linear(n_in, n_out):
      ...     layer = tf.Module()
      ...     layer.weight = tf.Variable(tf.ones([n_in, n_out]))
      ...     layer.bias = tf.Variable(tf.zeros([n_out]))
      ...     return layer
      >>> model = tf.Module()
      >>> model.fc1, model.fc2 = linear(8, 16), linear(16, 4)
      >>> [name for name, _ in named_parameters(model)]
      ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias']
    """
    _check_module(module, "named_parameters")
    slots = _slots(module) if recurse else [(n, v, p) for n, v, p in _own_variables(module)]
    seen = set()
    out = []
    for name, variable, _ in slots:
        if id(variable) not in seen:
            seen.add(id(variable))
            out.append((name, variable))
    return out


# ---------------------------------------------------------------------------------------
# Distributing variables
# ---------------------------------------------------------------------------------------

def _backing(variable) -> tf.Variable:
    """The `tf.Variable` behind a variable (a Keras variable's `_value`)."""
    if _is_keras_variable(variable):
        backing = variable._value
        if backing is None:
            raise ValueError(f"Keras variable `{variable.path}` is not built yet; build the "
                             f"layer (call it once, or `layer.build(input_shape)`) before "
                             f"distributing it.")
        return backing
    return variable


def _replace(slots, variable, new: DVariable) -> Any:
    """Puts `new` everywhere `variable` is held; returns what the module now holds."""
    if _is_keras_variable(variable):
        variable._value = new  # the Keras variable stays; its backing variable changes
        return variable
    for _, held, put in slots:
        if held is variable:
            put(new)
    return new


def _distributed(backing: tf.Variable, mesh: Mesh, placements) -> DVariable:
    """A DVariable with `backing`'s value, name and trainability, placed on `mesh`."""
    value = backing.read_value()
    if isinstance(backing, DVariable) and backing.layout.mesh == mesh:
        value = _placement_api.redistribute(value, placements, mesh)
    else:
        if isinstance(backing, DVariable):  # from another mesh: through the whole value
            value = checkpoint.global_value(backing)
        value = _placement_api.distribute_tensor(value, mesh, placements)
    return DVariable(value, trainable=backing.trainable, name=backing.name.split(":")[0])


def distribute_parameter(module, name: str, mesh: Mesh, placements) -> Any:
    """Lays out variable `name` of `module` on `mesh` as `placements`, in place.

    What a PyTorch `partition_fn` does with `module.register_parameter(name,
    nn.Parameter(distribute_tensor(param, mesh, placements)))`: the variable becomes a
    `DVariable` with the same value, name and trainability. A variable already on `mesh`
    is redistributed.

    Args:
      module: a `tf.Module` or Keras layer.
      name: the variable's name in `module` (see `named_parameters`; `"weight"`,
        `"fc1.weight"`, `"kernel"`).
      mesh: the mesh.
      placements: one placement per mesh dimension.

    Returns:
      What `module` now holds: the `DVariable` (the same `keras.Variable` for Keras).

    Raises:
      KeyError: `module` has no variable `name`.
      TypeError: `module` is not a `tf.Module` or Keras layer.

    Example:
      >>> from tf_dtensor.placements import Shard, init_device_mesh, placements_of
      >>> model = tf.Module()
      >>> model.fc1 = tf.Module()
      >>> model.fc1.weight = tf.Variable(tf.ones([8, 16]))
      >>> _ = distribute_parameter(model, "fc1.weight", init_device_mesh("cpu", (4,)), [Shard(1)])
      >>> placements_of(model.fc1.weight)
      (Shard(dim=1),)
    """
    _check_module(module, "distribute_parameter")
    held = [variable for slot_name, variable, _ in _slots(module) if slot_name == name]
    if not held:
        known = ", ".join(f"`{n}`" for n, _ in named_parameters(module)) or "none"
        raise KeyError(f"`{type(module).__name__}` has no variable `{name}`; its variables "
                       f"are {known}.")
    slots = _slots(_ROOTS[-1]) if _ROOTS else _slots(module)
    return _replace(slots, held[0], _distributed(_backing(held[0]), mesh, placements))


def _wrap_call(module, mesh: Mesh, input_fn, output_fn) -> None:
    """Runs `input_fn` before and `output_fn` after each call of `module` (PyTorch's
    forward pre-hook and forward hook). Python finds `__call__` on the class, so the
    module gets a subclass of its class whose `__call__` adds them."""
    base = type(module)

    def __call__(self, *args, **kwargs):
        if input_fn is not None:
            new_args = input_fn(self, args, mesh)
            if new_args is not None:
                args = new_args if isinstance(new_args, tuple) else (new_args,)
        outputs = base.__call__(self, *args, **kwargs)
        if output_fn is not None:
            new_outputs = output_fn(self, outputs, mesh)
            if new_outputs is not None:
                outputs = new_outputs
        return outputs

    module.__class__ = type(base.__name__, (base,), {
        "__call__": __call__, "__module__": base.__module__, "__qualname__": base.__qualname__,
        "__doc__": base.__doc__})


def distribute_module(module, mesh: Mesh, partition_fn=None, input_fn=None, output_fn=None):
    """Puts the variables of a `tf.Module` or Keras layer on `mesh`, as PyTorch's
    `distribute_module`.

    `partition_fn(name, submodule, mesh)` runs for the module and each submodule (named
    as `named_modules` names them) and may lay out its variables (`distribute_parameter`);
    every variable it leaves off the mesh is then replicated. `input_fn(module, inputs,
    mesh)` (inputs: the tuple of positional arguments) runs before each call and may
    return new inputs; `output_fn(module, outputs, mesh)` runs after and may return new
    outputs. Optimizers and checkpoints built before see the old variables: distribute
    first. A Keras layer must be built.

    Args:
      module: a `tf.Module` or Keras layer (changed in place).
      mesh: the mesh.
      partition_fn: None (replicate everything) or `fn(name, submodule, mesh)`.
      input_fn: None or `fn(module, inputs, mesh) -> inputs or None`.
      output_fn: None or `fn(module, outputs, mesh) -> outputs or None`.

    Returns:
      `module`.

    Raises:
      TypeError: `module` is not a `tf.Module` or Keras layer, `mesh` is not a `Mesh`, or
        `input_fn`/`output_fn` are given for a module that cannot be called.
      RuntimeError: `module` was distributed before.

    Example:
      >>> import keras
      >>> from tf_dtensor.placements import Shard, full_tensor, init_device_mesh, placements_of
      >>> layer = keras.layers.Dense(4, kernel_initializer="ones")
      >>> layer.build((None, 8))
      >>> def shard_kernel(name, module, mesh):   # the kernel's columns over 4 devices
      ...     distribute_parameter(module, "kernel", mesh, [Shard(1)])
      >>> layer = distribute_module(layer, init_device_mesh("cpu", (4,)), shard_kernel)
      >>> y = layer(tf.ones([2, 8]))
      >>> placements_of(y), full_tensor(y).numpy().tolist()
      ((Shard(dim=1),), [[8.0, 8.0, 8.0, 8.0], [8.0, 8.0, 8.0, 8.0]])
    """
    _check_module(module, "distribute_module")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"distribute_module takes a `Mesh` as `mesh`; got "
                        f"{type(mesh).__name__}. Build one with `init_device_mesh`.")
    if (input_fn is not None or output_fn is not None) and not any(
            "__call__" in vars(k) for k in type(module).__mro__):
        raise TypeError(f"distribute_module: `{type(module).__name__}` has no `__call__`, so "
                        f"`input_fn`/`output_fn` cannot wrap it.")
    if module in _DISTRIBUTED:
        raise RuntimeError(f"distribute_module was already applied to this "
                           f"`{type(module).__name__}`; apply it once.")
    if partition_fn is not None:
        _ROOTS.append(module)
        try:
            for name, sub in named_modules(module):
                partition_fn(name, sub, mesh)
        finally:
            _ROOTS.pop()
    replicate = [Replicate()] * len(mesh.dim_names)
    slots = _slots(module)
    for _, variable, _ in slots:
        backing = _backing(variable)
        if not isinstance(backing, DVariable):
            _replace(slots, variable, _distributed(backing, mesh, replicate))
    if input_fn is not None or output_fn is not None:
        _wrap_call(module, mesh, input_fn, output_fn)
    _DISTRIBUTED.add(module)
    return module


# ---------------------------------------------------------------------------------------
# State dicts
# ---------------------------------------------------------------------------------------

class LoadResult(NamedTuple):
    """What `load_state_dict` could not match (PyTorch's `_IncompatibleKeys`)."""
    missing_keys: List[str]
    unexpected_keys: List[str]


def state_dict(module) -> "collections.OrderedDict[str, tf.Tensor]":
    """The values of the module's variables by name (see `named_parameters`): DTensors in
    their variables' layouts (a snapshot, read now), regular tensors for variables off
    any mesh.

    Save one with `save_state_dict` (each device writes its own blocks) or
    `name_based_save`; `load_state_dict` reads it back into any layout.

    Example:
      >>> from tf_dtensor.placements import Shard, init_device_mesh, placements_of
      >>> model = tf.Module()
      >>> model.weight, model.bias = tf.Variable(tf.ones([8, 4])), tf.Variable(tf.zeros([4]))
      >>> def shard_weight(name, module, mesh):
      ...     distribute_parameter(module, "weight", mesh, [Shard(0)])
      >>> model = distribute_module(model, init_device_mesh("cpu", (4,)), shard_weight)
      >>> sd = state_dict(model)
      >>> list(sd), placements_of(sd["weight"]), placements_of(sd["bias"])
      (['weight', 'bias'], (Shard(dim=0),), (Replicate(),))
    """
    _check_module(module, "state_dict")
    return collections.OrderedDict(
        (name, _backing(variable).read_value()) for name, variable in named_parameters(module))


def save_state_dict(state, file_prefix) -> None:
    """Writes a state dict (or a module's, given the module) to a checkpoint: each
    distinct block of a DTensor once, by the device holding it (`sharded_save`), so that
    no device gathers a whole tensor. `tf.train.load_checkpoint(file_prefix)` reads the
    values whole; `load_state_dict(module, file_prefix)` reads each device's slice.

    Args:
      state: a state dict (name -> DTensor or regular tensor), or a module.
      file_prefix: the checkpoint prefix (a string or path).

    Raises:
      ValueError: called inside a `tf.function`.

    Example:
      >>> import os, tempfile
      >>> from tf_dtensor.placements import init_device_mesh
      >>> model = tf.Module()
      >>> model.weight = tf.Variable(tf.ones([8, 4]))
      >>> model = distribute_module(model, init_device_mesh("cpu", (4,)))
      >>> prefix = os.path.join(tempfile.mkdtemp(), "model")
      >>> save_state_dict(model, prefix)
      >>> tf.train.load_checkpoint(prefix).get_tensor("weight").shape
      (8, 4)
    """
    _require_eager("save_state_dict")
    if _is_module(state):
        state = state_dict(state)
    values = collections.OrderedDict(
        (name, value if _tensors.is_dtensor_value(value) else tf.convert_to_tensor(value))
        for name, value in state.items())
    mesh = next((api.fetch_layout(v).mesh for v in values.values() if _tensors.is_dtensor_value(v)), None)
    name_based_save(mesh, os.fspath(file_prefix), values)


def _as_layout_of(value, backing, name: str):
    """`value` as the target variable holds it: the DTensor in its layout, or a regular
    tensor for a variable off the mesh; any dtype cast to the variable's."""
    if _tensors.is_dtensor_value(value):
        layout = api.fetch_layout(value)
        value = tf.cast(value, backing.dtype)
        if isinstance(backing, DVariable) and layout.mesh == backing.layout.mesh:
            return api.relayout(value, backing.layout)
        # Another mesh, or a variable off the mesh: through the value whole.
        value = checkpoint.global_value(
            api.relayout(value, Layout.replicated(layout.mesh, layout.rank)))
    value = tf.convert_to_tensor(value, dtype=backing.dtype)
    if isinstance(backing, DVariable):
        return api.copy_to_mesh(value, backing.layout)
    return value


def _check_shapes(pairs, source: str) -> None:
    wrong = [f"`{name}`: {list(shape)} in {source}, {backing.shape.as_list()} in the module"
             for name, backing, shape in pairs
             if not tf.TensorShape(shape).is_compatible_with(backing.shape)]
    if wrong:
        raise ValueError("load_state_dict: shape mismatch for " + "; ".join(wrong) + ".")


def load_state_dict(module, state, strict: bool = True) -> LoadResult:
    """Assigns saved values to the module's variables, each in its variable's layout.

    Args:
      module: a `tf.Module` or Keras layer.
      state: a mapping of names to values (DTensors of any layout or mesh, regular
        tensors, arrays), e.g. from `state_dict` of a differently sharded module; or a
        checkpoint prefix written by `save_state_dict`/`name_based_save`, from which each
        device reads only its slice.
      strict: raise when a name is missing on either side (otherwise skip it).

    Returns:
      `LoadResult(missing_keys, unexpected_keys)`.

    Raises:
      ValueError: with `strict`, names that do not match; a shape that differs; a
        checkpoint read inside a `tf.function`.

    Example:
      >>> from tf_dtensor.placements import Shard, full_tensor, init_device_mesh
      >>> mesh = init_device_mesh("cpu", (2,))
      >>> source = tf.Module()
      >>> source.weight = tf.Variable(tf.reshape(tf.range(4.0), [2, 2]))
      >>> source = distribute_module(source, mesh)   # replicated
      >>> target = tf.Module()
      >>> target.weight = tf.Variable(tf.zeros([2, 2]))
      >>> _ = distribute_parameter(target, "weight", mesh, [Shard(0)])
      >>> load_state_dict(target, state_dict(source))
      LoadResult(missing_keys=[], unexpected_keys=[])
      >>> full_tensor(target.weight).numpy().tolist()
      [[0.0, 1.0], [2.0, 3.0]]
    """
    _check_module(module, "load_state_dict")
    variables = collections.OrderedDict(
        (name, (variable, _backing(variable))) for name, variable in named_parameters(module))
    from_file = isinstance(state, (str, bytes, os.PathLike))
    if from_file:
        _require_eager("load_state_dict")  # the checkpoint is read on the host
        prefix = os.fsdecode(state)
        saved = dict(tf.train.list_variables(prefix))
        source = f"checkpoint {prefix}"
    else:
        saved = {name: tf.TensorShape(getattr(value, "shape", tf.convert_to_tensor(value).shape))
                 for name, value in state.items()}
        source = "the state dict"
    missing = [name for name in variables if name not in saved]
    unexpected = [name for name in saved if name not in variables]
    if strict and (missing or unexpected):
        raise ValueError(f"load_state_dict into `{type(module).__name__}`: missing keys "
                         f"{missing}, unexpected keys {unexpected}. Pass `strict=False` to load "
                         f"the names that match.")
    present = [name for name in variables if name in saved]
    _check_shapes([(n, variables[n][1], saved[n]) for n in present], source)
    if from_file:
        distributed = {n: variables[n][1] for n in present
                       if isinstance(variables[n][1], DVariable)}
        values = dict(name_based_restore(None, prefix, distributed)) if distributed else {}
        if len(values) < len(present):
            reader = tf.train.load_checkpoint(prefix)
            values.update({n: reader.get_tensor(n) for n in present if n not in values})
    else:
        values = {n: state[n] for n in present}
    for name in present:
        _, backing = variables[name]
        backing.assign(_as_layout_of(values[name], backing, name))
    return LoadResult(missing, unexpected)


__all__ = ["LoadResult", "distribute_module", "distribute_parameter", "load_state_dict",
           "named_modules", "named_parameters", "save_state_dict", "state_dict"]
