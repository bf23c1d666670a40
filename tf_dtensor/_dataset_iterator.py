"""The iterator of a `DTensorDataset` (`_dataset.py`) and what it shares with it: this
client's share of a global batch (`Share`), turning a host element into DTensors, the
iterator eagerly and inside `tf.function`, and the type specs of both.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.data.ops import optional_ops
from tensorflow.python.data.util import structure
from tensorflow.python.eager import context
from tensorflow.python.framework import errors
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor_spec
from tensorflow.python.ops import gen_dataset_ops
from tensorflow.python.util import nest

from tf_dtensor import api
from tf_dtensor.layout import UNSHARDED, Layout


@dataclasses.dataclass(frozen=True)
class Share:
    """Which rows of a global batch this client reads, and where each local device's
    block of a component starts.

    Attributes:
      replicas: the batch replicas with a device on this client, in device order.
      per_replica: rows per replica (the global batch divided by the replica count).
      num_replicas: the replica count (the size of `batch_dim`, or 1).
      batch_dim: the mesh dimension that shards the batch, or None.
    """
    replicas: Tuple[int, ...]
    per_replica: int
    num_replicas: int
    batch_dim: Optional[str]

    @property
    def whole(self) -> bool:
        """Whether this client reads whole global batches (always so with one client)."""
        return len(self.replicas) == self.num_replicas

    def rows(self, element: tf.Tensor) -> tf.Tensor:
        """This client's rows of one global-batch component, replica after replica."""
        if self.whole:
            return element
        p = self.per_replica
        return tf.concat([element[r * p:(r + 1) * p] for r in self.replicas], axis=0)

    def globalize(self, share: tf.Tensor) -> tf.Tensor:
        """A global-batch tensor with this client's share at its replicas' rows and zeros
        at the other clients' rows (which no local device reads)."""
        if self.whole:
            return share
        p = self.per_replica
        rest = share.shape[1:]
        rest = rest.as_list() if rest.is_fully_defined() else tf.shape(share)[1:]
        filler = tf.zeros(tf.concat([[p], rest], 0) if tf.is_tensor(rest) else [p] + rest,
                          share.dtype)
        pieces = [share[self.replicas.index(r) * p:(self.replicas.index(r) + 1) * p]
                  if r in self.replicas else filler for r in range(self.num_replicas)]
        return tf.concat(pieces, axis=0)

    def block(self, location: Dict[str, int], layout: Layout,
              share_shape: Sequence[int]) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
        """(begin, size) of the block of a share-shaped component that one device holds."""
        begin, size = [], []
        global_shape = [self.per_replica * self.num_replicas] + list(share_shape[1:])
        for axis, spec in enumerate(layout.sharding_specs):
            extent = global_shape[axis]
            if spec == UNSHARDED:
                begin.append(0)
                size.append(share_shape[axis])
                continue
            count = layout.mesh.dim_size(spec)
            if axis == 0 and spec == self.batch_dim:
                # The share stacks this client's replicas (the batch divides evenly): map
                # the global row offset to the replica's position in the share.
                begin.append(self.replicas.index(location[spec]) * self.per_replica)
                size.append(self.per_replica)
                continue
            # Uneven shards as everywhere: ceil(n / k)-sized blocks, the last ones smaller
            # or empty (n // k blocks dropped the remainder).
            step = -(-extent // count)
            offset = min(location[spec] * step, extent)
            begin.append(offset)
            size.append(min(step, extent - offset))
        return tuple(begin), tuple(size)


@functools.lru_cache(maxsize=256)
def _device_blocks(share: Share, layout: Layout, share_shape: Tuple[int, ...]):
    """(begin, size) of each local device's block, in mesh order."""
    return [share.block(location, layout, share_shape)
            for location in layout.mesh.local_device_locations()]


def _to_dtensors(host_element: Any, layouts: Any, share: Share) -> Any:
    """DTensors with `layouts` from one host element (this client's share)."""
    if not context.executing_eagerly():
        # A relayout of a host batch: each device slices its block. On a client that reads
        # only some batch replicas, the share is first placed at its rows of a global-batch
        # host tensor (`share.globalize`); every local block lies in those rows.
        return nest.map_structure(lambda c, l: api.relayout(share.globalize(c), l),
                                  host_element, layouts)

    def pack(component: tf.Tensor, layout: Layout) -> tf.Tensor:
        shape = tuple(component.shape.as_list())
        blocks: Dict[Tuple, tf.Tensor] = {}
        parts = []
        for begin, size in _device_blocks(share, layout, shape):
            if (begin, size) not in blocks:
                whole = not any(begin) and size == shape
                # Sliced where the host element is, also under a mesh scope (`run_on`,
                # `default_mesh`) that would put the slice on the DTensor device.
                with tf.device(component.device):
                    blocks[(begin, size)] = (component if whole
                                             else tf.slice(component, begin, size))
            parts.append(blocks[(begin, size)])
        return api.pack(parts, layout)

    return nest.map_structure(pack, host_element, layouts)


class _DTensorOptional:
    """`get_next_as_optional`'s answer: `has_value()` on the host, `get_value()` DTensors."""

    def __init__(self, host_optional, layouts: Any, share: Share, element_spec: Any):
        self._host = host_optional
        self._layouts = layouts
        self._share = share
        self.element_spec = element_spec

    def has_value(self, name=None):
        return self._host.has_value(name=name)

    def get_value(self, name=None):
        return _to_dtensors(self._host.get_value(name=name), self._layouts, self._share)


class DTensorIterator(iterator_ops.OwnedIterator):
    """Iterates a `DTensorDataset`, eagerly or inside `tf.function`; yields DTensors.

    Its components are the anchor (a replicated scalar DVariable handle on the mesh, which
    routes functions taking the iterator to the DTensor device) and the host iterator.
    """

    def __init__(self, pipeline, anchor, global_element_spec, layouts, share: Share):
        super().__init__(dataset=pipeline)
        self._setup(anchor, global_element_spec, layouts, share)

    def _setup(self, anchor, global_element_spec, layouts, share: Share) -> None:
        self._anchor = anchor
        self._global_element_spec = global_element_spec
        self._layouts = layouts
        self._share = share

    @classmethod
    def _from_parts(cls, anchor, resource, host_element_spec, global_element_spec, layouts,
                    share: Share) -> "DTensorIterator":
        iterator = cls.__new__(cls)
        iterator_ops.OwnedIterator.__init__(iterator, components=(resource,),
                                            element_spec=host_element_spec)
        iterator._setup(anchor, global_element_spec, layouts, share)
        return iterator

    @property
    def element_spec(self):
        """The spec of each global batch (TensorSpecs of the global shapes)."""
        return self._global_element_spec

    def __next__(self):
        try:
            return self.get_next()
        except errors.OutOfRangeError as e:
            if context.executing_eagerly():
                raise StopIteration from e
            raise

    def get_next(self):
        return _to_dtensors(self._next_internal(), self._layouts, self._share)

    def get_next_as_optional(self):
        # TF's OwnedIterator.get_next_as_optional types the optional by `element_spec`,
        # which here is the global batch's; the host iterator yields this client's share
        # (smaller where the batch replicas span clients).
        with ops.colocate_with(self._iterator_resource):
            host = optional_ops._OptionalImpl(  # pylint: disable=protected-access
                gen_dataset_ops.iterator_get_next_as_optional(
                    self._iterator_resource,
                    output_types=structure.get_flat_tensor_types(self._element_spec),
                    output_shapes=structure.get_flat_tensor_shapes(self._element_spec)),
                self._element_spec)
        return _DTensorOptional(host, self._layouts, self._share, self._global_element_spec)

    @property
    def _type_spec(self):
        return _DTensorIteratorSpec(self._element_spec, self._global_element_spec,
                                    nest.map_structure(lambda l: l.to_string(), self._layouts),
                                    self._share)


class BatchesSpec:
    """What the types of a `DTensorDataset` and of its iterator hold (the host pipeline's
    element spec, the global one, the layouts as strings, this client's share of each
    batch) and how they are serialized; mixed into each."""

    __slots__ = ()

    def _hold(self, host_element_spec, global_element_spec, layout_strings, share: Share):
        self._host_element_spec = host_element_spec
        self._global_element_spec = global_element_spec
        self._layout_strings = layout_strings
        self._share = share

    def _serialize(self):
        share = self._share
        return (self._host_element_spec, self._global_element_spec, self._layout_strings,
                share.replicas, share.per_replica, share.num_replicas, share.batch_dim)

    @classmethod
    def _deserialize(cls, serialization):
        host, global_spec, layouts, replicas, per_replica, num_replicas, batch_dim = serialization
        return cls(host, global_spec, layouts,
                   Share(tuple(replicas), per_replica, num_replicas, batch_dim))


class _DTensorIteratorSpec(BatchesSpec, iterator_ops.IteratorSpec):
    """The type of `DTensorIterator`, so that it can be passed to a `tf.function`."""

    __slots__ = ["_host_element_spec", "_global_element_spec", "_layout_strings", "_share"]

    def __init__(self, host_element_spec, global_element_spec, layout_strings, share: Share):
        super().__init__(global_element_spec)
        self._hold(host_element_spec, global_element_spec, layout_strings, share)

    @property
    def value_type(self):
        return DTensorIterator

    @property
    def _component_specs(self):
        return (tensor_spec.TensorSpec([], tf.resource), tensor_spec.TensorSpec([], tf.resource))

    def _to_components(self, value):
        return (value._anchor, value._iterator_resource)  # pylint: disable=protected-access

    def _from_components(self, components):
        anchor, resource = components
        layouts = nest.map_structure(Layout.from_string, self._layout_strings)
        return DTensorIterator._from_parts(  # pylint: disable=protected-access
            anchor, resource, self._host_element_spec, self._global_element_spec, layouts,
            self._share)

    @classmethod
    def from_value(cls, value):
        return value._type_spec  # pylint: disable=protected-access
