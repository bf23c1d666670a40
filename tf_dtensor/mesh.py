"""`Mesh`: a named Cartesian grid of devices."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Union

import numpy as np

from tf_dtensor import _core
from tf_dtensor._errors import MeshError


def _device_str(device) -> str:
    return device.to_string() if hasattr(device, "to_string") else str(device)


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
        names = list(dim_names)
        if ids.ndim != len(names):
            raise MeshError(
                f"`global_device_ids` has shape {list(ids.shape)} but {len(names)} dimension "
                f"names {names} were given; pass the ids as an array shaped like the mesh, "
                f"e.g. np.arange(n).reshape(...).")
        dims = list(zip(names, [int(s) for s in ids.shape]))
        self._mesh = _core.Mesh.create(
            dims,
            [int(i) for i in ids.ravel()],
            [int(i) for i in local_device_ids],
            [_device_str(d) for d in local_devices],
            mesh_name,
            [_device_str(d) for d in (global_devices or [])],
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
        return Mesh._wrap(_core.Mesh.from_string(mesh_str))

    def to_string(self) -> str:
        return self._mesh.to_string()

    def short(self) -> str:
        """The short form used in messages: `mesh(x=2,y=4)`."""
        return self._mesh.short_string()

    @property
    def dim_names(self) -> List[str]:
        return list(self._mesh.dim_names)

    @property
    def name(self) -> str:
        return self._mesh.name

    @property
    def size(self) -> int:
        return self._mesh.size

    def shape(self) -> List[int]:
        return list(self._mesh.dim_sizes)

    def dim_size(self, dim_name: str) -> int:
        index = self._mesh.dim_index(dim_name)
        if index < 0:
            raise ValueError(f"Mesh {self.short()} has no dimension `{dim_name}`.")
        return self._mesh.dim_sizes[index]

    def contains_dim(self, dim_name: str) -> bool:
        return self._mesh.dim_index(dim_name) >= 0

    def global_device_ids(self) -> np.ndarray:
        return np.array(self._mesh.global_device_ids).reshape(self.shape())

    def local_device_ids(self) -> List[int]:
        return list(self._mesh.local_device_ids)

    def local_devices(self) -> List[str]:
        return list(self._mesh.local_devices)

    def global_devices(self) -> List[str]:
        return list(self._mesh.global_devices)

    def num_local_devices(self) -> int:
        return len(self._mesh.local_devices)

    def device_type(self) -> str:
        return self._mesh.device_type

    def is_remote(self) -> bool:
        return not self._mesh.local_device_ids

    def use_xla_spmd(self) -> bool:
        return self._mesh.use_xla_spmd

    def coords(self, device_id: int) -> List[int]:
        """Coordinates of a device id in the grid (first dimension outermost)."""
        return list(self._mesh.coords(device_id))

    def unravel_index(self) -> Dict[int, Dict[str, int]]:
        """Every global device id mapped to its coordinates, `{id: {dim_name: index}}`."""
        names = self.dim_names
        return {int(device_id): dict(zip(names, self.coords(int(device_id))))
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

    def __repr__(self) -> str:
        dims = [(n, s) for n, s in zip(self.dim_names, self.shape())]
        return (f"<Mesh object with dims={dims}, device_type=\"{self.device_type()}\", "
                f"num_local_devices={self.num_local_devices()}), size={self.size}>")
