"""`Mesh`: a named Cartesian grid of devices."""

from __future__ import annotations

import collections
from typing import Dict, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from tensorflow.dtensor.proto import layout_pb2

from tf_dtensor import _args, _core
from tf_dtensor._errors import MeshError

# What `mesh[dim_name]` returns, as in TF DTensor.
MeshDimension = collections.namedtuple("MeshDimension", ["name", "size"])


def _device_str(device) -> str:
    """A device name from a str or a `tf.DeviceSpec`-like object (anything with to_string)."""
    if hasattr(device, "to_string"):
        return device.to_string()
    if not isinstance(device, str):
        raise TypeError(f"Devices are names such as 'CPU:0' or `tf.DeviceSpec`s; got "
                        f"{device!r} ({type(device).__name__}).")
    return device


def _device_strs(devices, what: str) -> List[str]:
    """Device names from a list; one name alone ("CPU:0") is refused, not read letter by
    letter."""
    if isinstance(devices, (str, bytes)) or hasattr(devices, "to_string"):
        raise MeshError(f"`{what}` must be a list of devices; got the single device "
                        f"{devices!r}. Did you mean [{devices!r}]?")
    return [_device_str(d) for d in devices]


def _serialized(proto, expected: type) -> bytes:
    """The bytes of a TF DTensor proto message, for the C++ parser."""
    if not hasattr(proto, "SerializeToString"):
        raise TypeError(f"Expected a `{expected.DESCRIPTOR.full_name}` message, got "
                        f"{type(proto).__name__}; build one with `as_proto()` or "
                        f"`tensorflow.dtensor.proto.layout_pb2.{expected.__name__}`.")
    return proto.SerializeToString()


class Mesh:
    """A named Cartesian grid of devices; the same signature as `tf.experimental.dtensor.Mesh`.

    Args:
      dim_names: names of the mesh dimensions, outermost first; they must be unique.
      global_device_ids: integer array whose shape is the mesh shape.
      local_device_ids: the ids (from `global_device_ids`) of this client's devices.
      local_devices: this client's devices, e.g. `["CPU:0", "CPU:1"]`.
      mesh_name: optional name.
      global_devices: optional list of all devices of all clients.
      use_xla_spmd: recorded for compatibility with TF's string form.

    Raises:
      MeshError: duplicate or reserved dimension names, or device counts that do not match.

    A single-device mesh (`Mesh.from_device("CPU:0")`) has no dimensions; as in TF DTensor,
    it reports size 0 and no device ids, and names its device in `single_device`.

    Example:
      >>> import numpy as np
      >>> mesh = Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "CPU:1"])
      >>> mesh.shape()
      [2]
    """

    __slots__ = ("_mesh",)

    def __init__(
        self,
        dim_names: List[str],
        global_device_ids: np.ndarray,
        local_device_ids: List[int],
        local_devices: Sequence[Union[str, object]],
        mesh_name: str = "",
        global_devices: Optional[Sequence[Union[str, object]]] = None,
        use_xla_spmd: bool = False,
    ):
        ids = np.asarray(global_device_ids)
        if ids.size and ids.dtype.kind not in "iu":
            # A TypeError, the class TensorFlow's DTensor raises for such ids.
            raise TypeError(f"`global_device_ids` must hold integers; got {ids.dtype} values "
                            f"{ids.ravel()[:4].tolist()}. Use e.g. np.arange(n).reshape(...).")
        names = _args.strings(dim_names, "`dim_names`")
        if ids.ndim != len(names):
            raise MeshError(
                f"`global_device_ids` has shape {list(ids.shape)} but {len(names)} dimension "
                f"names {names} were given; pass the ids as an array shaped like the mesh, "
                f"e.g. np.arange(n).reshape(...).")
        if not list(local_devices) and not list(global_devices or []):
            raise MeshError("A mesh needs devices: `local_devices` is empty and no "
                            "`global_devices` were given (Empty list of devices not allowed.). "
                            "List this process's devices, or, for a mesh of other processes "
                            "alone, pass `global_devices`.")
        dims = list(zip(names, [int(s) for s in ids.shape]))
        self._mesh = _core.Mesh.create(
            dims,
            [int(i) for i in ids.ravel()],
            [int(i) for i in local_device_ids],
            _device_strs(local_devices, "local_devices"),
            mesh_name,
            _device_strs(global_devices or [], "global_devices"),
            use_xla_spmd,
        )

    @classmethod
    def _wrap(cls, core_mesh: _core.Mesh) -> "Mesh":
        mesh = cls.__new__(cls)
        mesh._mesh = core_mesh
        return mesh

    @staticmethod
    def from_string(mesh_str: str) -> "Mesh":
        """Parses TF DTensor's string form (`|x=2|0,1|0,1|/job:localhost/...`)."""
        return Mesh._wrap(_core.Mesh.from_string(_args.string(mesh_str, "`mesh_str`")))

    @staticmethod
    def from_device(device: str) -> "Mesh":
        """A single-device mesh: no mesh dimensions over `device`.

        Args:
          device: a device name, e.g. `"/job:localhost/replica:0/task:0/device:CPU:0"` or
            `"CPU:0"` (stored in full form).

        Raises:
          MeshError: an empty or malformed device name.

        Example:
          >>> Mesh.from_device("CPU:0").to_string()
          '/job:localhost/replica:0/task:0/device:CPU:0'
        """
        return Mesh._wrap(_core.Mesh.from_device(_device_str(device)))

    @staticmethod
    def from_proto(proto: layout_pb2.MeshProto) -> "Mesh":
        """Builds a mesh from TF DTensor's `MeshProto` (see `as_proto`).

        Example:
          >>> mesh = Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "CPU:1"])
          >>> Mesh.from_proto(mesh.as_proto()) == mesh
          True
        """
        return Mesh._wrap(_core.Mesh.from_proto(_serialized(proto, layout_pb2.MeshProto)))

    def as_proto(self) -> layout_pb2.MeshProto:
        """This mesh as TensorFlow's own `tensorflow.dtensor.MeshProto` message.

        Example:
          >>> Mesh.from_device("CPU:0").as_proto().single_device
          '/job:localhost/replica:0/task:0/device:CPU:0'
        """
        return layout_pb2.MeshProto.FromString(self._mesh.to_proto())

    def to_string(self) -> str:
        """The serialized form TensorFlow's DTensor uses (`Mesh.from_string` reads it back)."""
        return self._mesh.to_string()

    def short(self) -> str:
        """The short form used in messages: `mesh(x=2,y=4)`."""
        return self._mesh.short_string()

    @property
    def dim_names(self) -> List[str]:
        """The names of the mesh dimensions, in order."""
        return list(self._mesh.dim_names)

    @property
    def name(self) -> str:
        """The mesh's name (empty unless one was given)."""
        return self._mesh.name

    @property
    def _name(self) -> str:
        return self._mesh.name

    @_name.setter
    def _name(self, name: str) -> None:
        # TensorFlow's Mesh keeps its name in `_name`, and code (its tests among it) renames
        # a copy by assigning it; the mesh is rebuilt under the new name.
        if self.is_single_device():
            raise MeshError(f"A single-device mesh ({self.single_device()}) has no name to set.")
        text = self.to_string()
        self._mesh = Mesh.from_string(_args.string(name, "`_name`") + text[text.index("|"):])._mesh

    @property
    def size(self) -> int:
        """The number of devices; 0 for a single-device mesh, as in TF DTensor."""
        return self._mesh.reported_size

    def shape(self) -> List[int]:
        """The size of each mesh dimension, in order."""
        return list(self._mesh.dim_sizes)

    @property
    def strides(self) -> List[int]:
        """Row-major strides of the grid: `[b*c, c, 1]` for shape `[a, b, c]`.

        The coordinates of device offset `i` are `(i // strides) % shape`.

        Example:
          >>> Mesh(["x", "y"], np.arange(6).reshape(2, 3), list(range(6)),
          ...      [f"CPU:{i}" for i in range(6)]).strides
          [3, 1]
        """
        return list(self._mesh.strides)

    def dim_size(self, dim_name: str) -> int:
        """The size of mesh dimension `dim_name`.

        Raises:
          MeshError: the mesh has no such dimension.
        """
        return self._mesh.dim_size(_args.string(dim_name, "`dim_name`"))

    def __getitem__(self, dim_name: str) -> MeshDimension:
        """`mesh["x"]` is `MeshDimension(name="x", size=...)`, as in TF DTensor."""
        return MeshDimension(name=dim_name, size=self.dim_size(dim_name))

    def contains_dim(self, dim_name: str) -> bool:
        """Whether `dim_name` is one of the mesh's dimensions."""
        return self._mesh.dim_index(dim_name) >= 0

    def __contains__(self, dim_name: str) -> bool:
        return self.contains_dim(dim_name)

    def is_single_device(self) -> bool:
        """Whether this mesh is one device without mesh dimensions (`Mesh.from_device`)."""
        return self._mesh.is_single_device

    @property
    def single_device(self) -> str:
        """The device of a single-device mesh, or `""` for a multi-device mesh."""
        return self._mesh.single_device

    def global_device_ids(self) -> np.ndarray:
        """The global device ids as an array shaped like the mesh.

        Raises:
          MeshError: on a single-device mesh, which has no device ids (see `single_device`).
        """
        return np.array(self._mesh.reported_global_device_ids(), dtype=np.int64).reshape(
            self.shape())

    def min_global_device_id(self) -> int:
        """The smallest global device id.

        Raises:
          MeshError: on a single-device mesh, which has no device ids.
        """
        return self._mesh.min_global_device_id()

    def local_device_ids(self) -> List[int]:
        """The mesh ids of the devices this process holds."""
        return list(self._mesh.reported_local_device_ids)

    def local_devices(self) -> List[str]:
        """The full names of the devices this process holds, in mesh order."""
        return list(self._mesh.reported_local_devices)

    def global_devices(self) -> List[str]:
        """The full names of every device of a mesh that spans processes (empty for a mesh
        made from this process's devices alone, as in TensorFlow's DTensor)."""
        return list(self._mesh.global_devices)

    def num_local_devices(self) -> int:
        """How many devices of the mesh this process holds."""
        return len(self._mesh.reported_local_devices)

    def device_type(self) -> str:
        """The type of the mesh's devices: `"CPU"`, `"GPU"` or `"TPU"`."""
        return self._mesh.device_type

    def is_remote(self) -> bool:
        """Whether this process holds none of the mesh's devices."""
        return not self._mesh.local_device_ids

    def use_xla_spmd(self) -> bool:
        """Whether the mesh asks for XLA's SPMD partitioner (TensorFlow's DTensor on TPUs)."""
        return self._mesh.use_xla_spmd

    def device_location(self, offset: int) -> List[int]:
        """The coordinates of the device at row-major `offset` in the grid.

        Raises:
          MeshError: `offset` is negative or not below the number of devices.

        Example:
          >>> Mesh(["x", "y"], np.arange(4).reshape(2, 2), [0, 1, 2, 3],
          ...      [f"CPU:{i}" for i in range(4)]).device_location(2)
          [1, 0]
        """
        return list(self._mesh.device_location(int(offset)))

    def host_mesh(self) -> "Mesh":
        """The same grid over the host CPUs (`GPU:1` -> `CPU:1`); a CPU mesh is its own.

        As in TensorFlow's DTensor, the host mesh of an accelerator mesh has no name.
        """
        host = Mesh._wrap(self._mesh.host_mesh())
        if host is not self and host._mesh != self._mesh and host.name:
            host._name = ""
        return host

    def coords(self, device_idx: int) -> tf.Tensor:
        """The mesh coordinates of a device, as an int32 tensor (as TF's `Mesh.coords`).

        Example:
          >>> cpus = [f"CPU:{i}" for i in range(4)]
          >>> Mesh(["x", "y"], np.arange(4).reshape(2, 2), [0, 1, 2, 3], cpus).coords(2)
          <tf.Tensor: shape=(2,), dtype=int32, numpy=array([1, 0], dtype=int32)>

        Ids wrap around (`coords(n + size) == coords(n)`), as in TensorFlow's DTensor.
        """
        # As TensorFlow's (`(device_idx // strides) % shape`), an id past the mesh's size
        # wraps around. The parameter keeps TensorFlow's name: `coords(device_idx=...)`.
        return tf.constant(self._mesh.coords(int(device_idx) % max(self.size, 1)),
                           dtype=tf.int32)

    def unravel_index(self) -> Dict[int, Dict[str, int]]:
        """Every global device id mapped to its coordinates, `{id: {dim_name: index}}`."""
        names = self.dim_names
        return {int(device_id): dict(zip(names, self._mesh.coords(int(device_id))))
                for device_id in self._mesh.global_device_ids}

    def local_device_locations(self) -> List[Dict[str, int]]:
        """The coordinates `{dim_name: index}` of each local device, in local device order.

        Example:
          >>> Mesh(["x"], np.arange(2), [0, 1], ["CPU:0", "CPU:1"]).local_device_locations()
          [{'x': 0}, {'x': 1}]
        """
        mapping = self.unravel_index()
        return [mapping[device_id] for device_id in self.local_device_ids()]

    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and self._mesh == other._mesh

    def __hash__(self) -> int:
        return hash(self._mesh)

    def __reduce__(self):
        return Mesh.from_string, (self.to_string(),)

    def __repr__(self) -> str:
        # A multi-device mesh prints as in the DTensor overview guide; a single-device mesh,
        # which that form cannot show, as TF DTensor 2.21 prints every mesh.
        if self.is_single_device():
            return f"Mesh.from_string({self.to_string()})"
        dims = [(n, s) for n, s in zip(self.dim_names, self.shape())]
        return (f"<Mesh object with dims={dims}, device_type=\"{self.device_type()}\", "
                f"num_local_devices={self.num_local_devices()}), size={self.size}>")
