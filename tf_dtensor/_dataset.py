"""`DTensorDataset`: a `tf.data` pipeline whose elements arrive as DTensors.

One host pipeline per iterator reads this client's share of each global batch: the rows of
the batch replicas that have a device on this client (with one client, the whole global
batch). Each element then becomes one DTensor per component:

- eagerly, every distinct shard is sliced from the share once and the components are
  `pack`ed (one per local device, in mesh order; devices holding the same shard share
  it);
- inside a `tf.function`, `IteratorGetNext` runs on the host and a `relayout` of the host
  batch into the layout follows; the device expands that relayout into the per-device
  slices. The iterator carries a replicated scalar `DVariable` handle (its "anchor") next
  to the host iterator resource, so that a function taking the iterator is placed on the
  DTensor device: TensorFlow places a call on a custom device only if its first resource
  input lives there.

    batch_dim="b", mesh (b=2, m=2), layout [b,m], global batch [4, 4]:
      replica 0 (devices 0, 1) holds rows 0-1, replica 1 (devices 2, 3) rows 2-3;
      device 1 = (b=0, m=1) gets rows 0-1, columns 2-3.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.autograph.operators import control_flow
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor_spec
from tensorflow.python.framework import type_spec
from tensorflow.python.util import nest

from tf_dtensor import api
from tf_dtensor._errors import LayoutError
from tf_dtensor.layout import UNSHARDED, Layout
from tf_dtensor.mesh import Mesh
from tf_dtensor._dataset_iterator import BatchesSpec, DTensorIterator, Share


def _shard_counts(layout: Layout, batch_dim: Optional[str] = None) -> List[int]:
    """How many pieces each axis of an element in `layout` is cut into on one batch
    replica: the mesh dimension's size for a sharded axis, 1 for an unsharded one and for
    an axis sharded over `batch_dim` (the batch replicas, which each read their own rows).
    The same helper as TensorFlow's `input_util._shard_counts`."""
    counts = []
    for spec in layout.sharding_specs:
        if spec == UNSHARDED or spec == batch_dim:
            counts.append(1)
        else:
            counts.append(int(np.prod([layout.mesh.dim_size(d) for d in spec.split("+")])))
    return counts


class _Brief:
    """A nest leaf shown in short form in messages: `float32[3]`, `[b,*] @ mesh(b=2)`."""

    def __init__(self, leaf: Any):
        if isinstance(leaf, tf.TensorSpec):
            shape = leaf.shape.as_list() if leaf.shape.rank is not None else "[?]"
            self.text = f"{leaf.dtype.name}{shape}"
        else:
            self.text = leaf.short() if isinstance(leaf, Layout) else repr(leaf)

    def __repr__(self) -> str:
        return self.text


def _brief(structure: Any) -> str:
    return repr(nest.map_structure(_Brief, structure))


def _nested_like(element_spec: Any, layouts: Any) -> Any:
    """`layouts` in the nesting of the dataset's elements. A list where the elements are a
    tuple is taken (a dataset's elements hold no lists); any other difference is refused
    with both structures shown, as a TypeError where the containers' types differ and a
    ValueError otherwise, the classes TensorFlow's DTensorDataset raises."""
    def tuples(structure):
        if isinstance(structure, list):
            return tuple(tuples(item) for item in structure)
        return structure

    try:
        nest.assert_same_structure(element_spec, tuples(layouts))
    except (ValueError, TypeError) as error:
        raise type(error)(
            f"DTensorDataset: `layouts` must hold one Layout per dataset element, nested as "
            f"the elements are. The elements are {_brief(element_spec)}; `layouts` is "
            f"{_brief(layouts)}.") from None
    return nest.pack_sequence_as(element_spec, nest.flatten(layouts))


def _validate_elements(flat_layouts: List[Layout], flat_specs: List[Any],
                       already_batched: bool) -> None:
    if not flat_specs:
        raise ValueError("DTensorDataset needs a dataset whose elements hold at least one "
                         "tensor; `dataset.element_spec` is empty.")
    for layout, spec in zip(flat_layouts, flat_specs):
        if not isinstance(layout, Layout):
            raise TypeError(f"`layouts` must hold tf_dtensor `Layout`s; got {layout!r} for the "
                            f"element {spec}.")
        if not isinstance(spec, tf.TensorSpec):
            raise TypeError(f"DTensorDataset reads dense tensors; the dataset has an element "
                            f"{spec}. Convert it to a dense tensor with `dataset.map` first.")
        if spec.shape.rank is None:
            raise ValueError(f"Dataset element {spec} has an unknown rank (Dataset element "
                             f"shape must have a valid rank); DTensorDataset needs static ranks (set shapes with `dataset.map(tf.ensure_shape...)`).")
        if any("+" in s and s not in layout.mesh.dim_names for s in layout.sharding_specs):
            raise LayoutError(
                f"DTensorDataset cannot make elements in layout {layout.short()}: it shards "
                f"an axis over several mesh dimensions. Use one mesh dimension per axis here "
                f"and `dtensor.relayout` the elements you read.")
        rank = spec.shape.rank + (0 if already_batched else 1)
        if layout.rank != rank:
            raise ValueError(
                f"Layout {layout.short()} has rank {layout.rank} but the dataset element {spec} "
                f"needs rank {rank} (Expected layout with rank {rank}: the element's rank"
                f"{'' if already_batched else ' plus the batch axis'}). Check that the dataset "
                f"is not batched, or pass `dataset_already_batched=True` if it is.")
        if already_batched:
            first = flat_specs[0].shape[0]
            if first is None:
                raise ValueError(f"The batch axis of dataset element {spec} has no static size; "
                                 f"batch the dataset with `drop_remainder=True` (Ensure "
                                 f"drop_remainder=True when batching the dataset.).")
            if spec.shape[0] != first:
                raise ValueError(f"The batch axis of dataset element {spec} does not match the "
                                 f"other elements' batch size {first}; batch every component "
                                 f"alike.")


class DTensorDataset(dataset_ops.UnaryUnchangedStructureDataset):
    """A dataset of DTensors: global batches laid out on a mesh, as in TensorFlow's DTensor.

    Batches the dataset (unless `dataset_already_batched`) and turns each batch into
    DTensors with `layouts`, split over the `batch_dim` mesh dimension. It supports
    iteration (eagerly, and inside `tf.function` over an iterator made outside it or
    passed in) and `element_spec`, as TensorFlow's `DTensorDataset` does; other
    `tf.data.Dataset` methods are not meant for it.

    Each client reads only the rows of the batch replicas that have a device on it; with one
    client that is the whole global batch. Eagerly each device's block is sliced from that
    share and packed; inside a `tf.function` the share is relaid out from the host (a
    client of several places it in a global-batch host tensor first, zeros elsewhere).

    Args:
      dataset: a `tf.data.Dataset` of unbatched elements, or of per-replica batches when
        `dataset_already_batched`.
      mesh: the mesh the batches go to.
      layouts: a `Layout` or a nest of them matching `dataset.element_spec`; each has one
        more axis than its element unless `dataset_already_batched`, and with `batch_dim`
        each is sharded on `batch_dim` on axis 0.
      global_batch_size: rows of each global batch; divisible by the size of `batch_dim`.
      dataset_already_batched: the dataset yields per-replica batches of
        `global_batch_size / mesh.dim_size(batch_dim)` rows (batched with
        `drop_remainder=True`).
      batch_dim: the mesh dimension that splits the batch, or None.
      prefetch: how many batches to prefetch on the host, or None.
      tf_data_service_config: not supported (as in TensorFlow's DTensor).

    Raises:
      ValueError: layouts that do not match the elements, a `batch_dim` not in the mesh or
        not sharding axis 0 of every layout, a global batch size that does not divide, or
        already-batched elements of the wrong size.
      TypeError: `layouts` and the element structure differ in type.
      NotImplementedError: `tf_data_service_config` is given.

    Example:
      >>> mesh = dtensor.create_mesh([("batch", 2)], devices=["CPU:0", "CPU:1"])
      >>> data = tf.data.Dataset.range(8)
      >>> dataset = DTensorDataset(data, mesh=mesh, global_batch_size=4, batch_dim="batch",
      ...                          layouts=Layout.batch_sharded(mesh, "batch", rank=1))
      >>> [b.numpy().tolist() for b in dtensor.unpack(next(iter(dataset)))]
      [[0, 1], [2, 3]]
    """

    def __init__(self, dataset, *, mesh: Mesh, layouts: Any, global_batch_size: int,
                 dataset_already_batched: bool = False, batch_dim: Optional[str] = None,
                 prefetch: Optional[int] = None, tf_data_service_config: Any = None):
        if tf_data_service_config is not None:
            raise NotImplementedError(
                "DTensorDataset does not use tf.data service (`tf_data_service_config`); each "
                "client reads its own share of every batch from `dataset`. Drop the argument.")
        layouts = _nested_like(dataset.element_spec, layouts)
        flat_layouts = nest.flatten(layouts)
        flat_specs = nest.flatten(dataset.element_spec)

        if batch_dim:
            if not mesh.contains_dim(batch_dim):
                raise ValueError(f"`batch_dim={batch_dim!r}` is not a dimension of "
                                 f"{mesh.short()}; use one of {mesh.dim_names}.")
            num_replicas = mesh.dim_size(batch_dim)
            replicas = tuple(dict.fromkeys(
                location[batch_dim] for location in mesh.local_device_locations()))
            for layout in flat_layouts:
                if isinstance(layout, Layout) and (not layout.sharding_specs or
                                                   layout.sharding_specs[0] != batch_dim):
                    raise ValueError(
                        f"`batch_dim={batch_dim!r}` was given but layout {layout.short()} does "
                        f"not shard axis 0 over it (batch_dim {batch_dim} was specified but at "
                        f"least one layout did not contain it); use "
                        f"`Layout.batch_sharded(mesh, {batch_dim!r}, rank)` for every element.")
        else:
            num_replicas, replicas = 1, (0,)
        _validate_elements(flat_layouts, flat_specs, dataset_already_batched)
        for layout in flat_layouts:
            if layout.mesh != mesh:
                raise ValueError(f"Layout {layout.short()} is not on `mesh` {mesh.short()}; "
                                 f"give every layout the dataset's mesh.")
        if global_batch_size <= 0 or global_batch_size % num_replicas:
            raise ValueError(
                f"`global_batch_size={global_batch_size}` must be a positive multiple of the "
                f"{num_replicas} batch replicas of `batch_dim={batch_dim!r}` in {mesh.short()}.")
        per_replica = global_batch_size // num_replicas
        share = Share(replicas, per_replica, num_replicas, batch_dim)

        if dataset_already_batched:
            got = flat_specs[0].shape[0]
            if got != per_replica:
                raise ValueError(
                    f"The dataset's batches have {got} rows but each of the {num_replicas} "
                    f"replicas needs {per_replica} (`global_batch_size={global_batch_size}`); "
                    f"batch the dataset to {per_replica} or change `global_batch_size` "
                    f"(per_replica_batch_size does not matched expected size based on the mesh, "
                    f"got {got} but expected {per_replica}.).")
            pipeline = dataset
            if num_replicas > 1:
                # Per-replica batches k*R .. k*R+R-1 form global batch k.
                pipeline = pipeline.batch(num_replicas, drop_remainder=True)
                pipeline = self._map(pipeline, lambda x: share.rows(
                    tf.reshape(x, [global_batch_size] + x.shape.as_list()[2:])))
        else:
            pipeline = dataset.batch(global_batch_size, drop_remainder=True)
            if not share.whole:
                pipeline = self._map(pipeline, share.rows)
        if prefetch is not None:
            pipeline = pipeline.prefetch(prefetch)

        def global_spec(spec):
            return tf.TensorSpec([global_batch_size] + spec.shape.as_list()[1:], spec.dtype,
                                 spec.name)

        self._assemble(mesh, layouts, share, pipeline,
                       nest.map_structure(global_spec, pipeline.element_spec))

    def _assemble(self, mesh: Mesh, layouts: Any, share: Share, pipeline, global_element_spec,
                  anchor=None, anchor_component=None) -> None:
        """Sets the fields. The dataset's variant is the host pipeline's (its batches, this
        client's share of each), so that what tf.data reads from it (`cardinality`, a
        function argument's components) is the batches."""
        self._mesh = mesh
        self._layouts = layouts
        self._share = share
        self._pipeline = pipeline
        self._global_element_spec = global_element_spec
        self._anchor = anchor
        # The anchor's handle where this dataset was passed into a tf.function.
        self._anchor_component = anchor_component
        super().__init__(pipeline, dataset_ops.to_variant(pipeline))

    @staticmethod
    def _map(pipeline, fn):
        """`pipeline.map(fn)` on every component, whatever the element's structure."""
        is_tuple = type(pipeline.element_spec) is tuple  # pylint: disable=unidiomatic-typecheck

        def apply(*args):
            element = args if is_tuple else args[0]
            return nest.map_structure(fn, element)

        return pipeline.map(apply, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def _anchor_handle(self):
        if self._anchor_component is not None:
            return self._anchor_component
        if self._anchor is None:
            from tf_dtensor.variable import DVariable  # pylint: disable=import-outside-toplevel
            with ops.init_scope():
                self._anchor = DVariable(api.call_with_layout(
                    tf.zeros, Layout.replicated(self._mesh, 0), shape=[]))
        handle = self._anchor.handle
        if ops.inside_function():
            # Captured now, so that the function takes it as an input (see the module doc).
            handle = ops.get_default_graph().capture(handle)
        return handle

    def __iter__(self):
        if not context.executing_eagerly() and not ops.inside_function():
            raise RuntimeError("DTensorDataset iterates eagerly or inside tf.function only.")
        return DTensorIterator(self._pipeline, self._anchor_handle(),
                                self._global_element_spec, self._layouts, self._share)

    @property
    def element_spec(self):
        """The spec of each global batch (TensorSpecs of the global shapes)."""
        return self._global_element_spec

    # tf.data's own transformations would wrap this dataset's variant, which is the
    # unbatched source: TensorFlow then fails when it makes the iterator ("Incompatible
    # shapes at component 0: expected [4,4] but got [4]"; TF's DTensorDataset too). Those
    # that keep whole batches apply to the batches here; the others are refused by name.
    def _on_batches(self, transform) -> "DTensorDataset":
        batches = DTensorDataset.__new__(DTensorDataset)
        batches._assemble(self._mesh, self._layouts, self._share,  # pylint: disable=protected-access
                          transform(self._pipeline), self._global_element_spec,
                          self._anchor_for_copies(), self._anchor_component)
        return batches

    def _anchor_for_copies(self):
        self._anchor_handle()  # made once, shared by the datasets made from this one
        return self._anchor

    def repeat(self, count=None, name=None):
        """Repeats the batches `count` times (forever with None), as `tf.data.Dataset.repeat`.
        Whole batches are kept, with their layouts."""
        return self._on_batches(lambda p: p.repeat(count, name=name))

    def take(self, count, name=None):
        """The first `count` batches, as `tf.data.Dataset.take`.
        Whole batches are kept, with their layouts."""
        return self._on_batches(lambda p: p.take(count, name=name))

    def skip(self, count, name=None):
        """The batches after the first `count`, as `tf.data.Dataset.skip`.
        Whole batches are kept, with their layouts."""
        return self._on_batches(lambda p: p.skip(count, name=name))

    def prefetch(self, buffer_size, name=None):
        """Prefetches `buffer_size` batches on the host, as `tf.data.Dataset.prefetch`.
        Whole batches are kept, with their layouts."""
        return self._on_batches(lambda p: p.prefetch(buffer_size, name=name))

    def cache(self, filename="", name=None):
        """Caches the batches (in memory, or in `filename`), as `tf.data.Dataset.cache`.
        Whole batches are kept, with their layouts."""
        return self._on_batches(lambda p: p.cache(filename, name=name))

    def with_options(self, options, name=None):
        """The batches with tf.data `options`, as `tf.data.Dataset.with_options`.
        Whole batches are kept, with their layouts."""
        return self._on_batches(lambda p: p.with_options(options, name=name))

    @property
    def _type_spec(self):
        return _DTensorDatasetSpec(self._pipeline.element_spec, self._global_element_spec,
                                   nest.map_structure(lambda l: l.to_string(), self._layouts),
                                   self._share)


class _DTensorDatasetSpec(BatchesSpec, type_spec.TypeSpec):
    """The type of `DTensorDataset`, so that one passed to a `tf.function` is still one
    there (TensorFlow's `DatasetSpec` would rebuild a plain dataset of host batches). Its
    components are the anchor handle (first: it places the call on the DTensor device) and
    the host pipeline's variant."""

    __slots__ = ["_host_element_spec", "_global_element_spec", "_layout_strings", "_share"]

    def __init__(self, host_element_spec, global_element_spec, layout_strings, share: Share):
        super().__init__()
        self._hold(host_element_spec, global_element_spec, layout_strings, share)

    @property
    def value_type(self):
        return DTensorDataset

    @property
    def element_spec(self):
        """The spec of each global batch (TensorSpecs of the global shapes)."""
        return self._global_element_spec

    @property
    def _component_specs(self):
        return (tensor_spec.TensorSpec([], tf.resource), tensor_spec.TensorSpec([], tf.variant))

    def _to_components(self, value):
        return (value._anchor_handle(), value._variant_tensor)  # pylint: disable=protected-access

    def _from_components(self, components):
        anchor, variant = components
        layouts = nest.map_structure(Layout.from_string, self._layout_strings)
        dataset = DTensorDataset.__new__(DTensorDataset)
        dataset._assemble(  # pylint: disable=protected-access
            nest.flatten(layouts)[0].mesh, layouts, self._share,
            dataset_ops._VariantDataset(variant, self._host_element_spec),  # pylint: disable=protected-access
            self._global_element_spec, anchor_component=anchor)
        return dataset

    @staticmethod
    def from_value(value):
        return value._type_spec  # pylint: disable=protected-access


# Whole-batch transformations above; these would see the unbatched source or elements that
# tf.data cannot hold (DTensors), or would let clients read different batches (`shuffle`).
_REFUSED = ("batch", "bucket_by_sequence_length", "concatenate", "enumerate", "filter",
            "flat_map", "get_single_element", "group_by_window", "ignore_errors",
            "interleave", "map", "padded_batch", "ragged_batch", "rebatch",
            "rejection_resample", "reduce", "save", "scan", "shard", "shuffle", "snapshot",
            "sparse_batch", "take_while", "unbatch", "unique", "window")


def _refused(name: str):
    def method(self, *args, **kwargs):  # pylint: disable=unused-argument
        layouts = ", ".join(l.short() for l in nest.flatten(self._layouts))  # pylint: disable=protected-access
        raise NotImplementedError(
            f"`DTensorDataset.{name}` is not supported: DTensorDataset yields batches of "
            f"DTensors (layouts {layouts}), which tf.data's `{name}` cannot work on. Apply "
            f"`{name}` to the dataset you pass to DTensorDataset (its unbatched elements), "
            f"or to the DTensors you read. DTensorDataset itself takes `repeat`, `take`, "
            f"`skip`, `prefetch`, `cache` and `with_options`.")
    method.__name__ = name
    method.__doc__ = (f"Not supported: raises NotImplementedError. Apply `{name}` to the dataset "
                      f"given to DTensorDataset, or to the DTensors read from it.")
    return method


for _name in _REFUSED:
    setattr(DTensorDataset, _name, _refused(_name))
del _name


def _for_stmt(dataset, extra_test, body, get_state, set_state, symbol_names, opts):
    """`for batch in dataset:` inside tf.function: iterate a fresh iterator of it. The
    iterator, one host resource, stays on the host through the loop (cc/graph/control_flow.cc),
    also where the batch replicas span clients."""
    control_flow._tf_iterator_for_stmt(  # pylint: disable=protected-access
        iter(dataset), extra_test, body, get_state, set_state, symbol_names, opts)


def _register_for_stmt() -> None:
    # Autograph takes the first registered type the object is an instance of, and
    # tf.data registered `tf.data.Dataset` (iterated with `reduce`, no DTensors) at import;
    # DTensorDataset goes in front of it.
    registry = control_flow.for_loop_registry
    registry._registry = {  # pylint: disable=protected-access
        DTensorDataset: _for_stmt,
        **{t: fn for t, fn in registry._registry.items()  # pylint: disable=protected-access
           if t is not DTensorDataset}}


_register_for_stmt()
