"""PyTorch-style placements over tf_dtensor's one layout type.

PyTorch's DTensor describes a layout per *mesh* dimension: `Shard(dim)` (the mesh dimension
cuts tensor axis `dim`), `Replicate()` (every device along it holds the same data) or
`Partial(reduce_op)` (the devices along it hold terms still to be reduced). A `Layout`
describes the same thing per *tensor* axis. This module converts between the two and
offers PyTorch's functions on top of tf_dtensor's API:

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("x", "y"))
    t = distribute_tensor(tf.ones([4, 6]), mesh, [Shard(0), Replicate()])
    placements_of(t)                       # (Shard(dim=0), Replicate())
    u = redistribute(t, [Replicate(), Shard(1)])
    full_tensor(u)                         # a regular tf.Tensor holding the whole value

Conversions (`Layout.from_placements`, `Layout.placements`) are exact inverses. A tensor
axis sharded by several mesh dims (`[Shard(0), Shard(0)]`) is the layout spec `"x+y"`,
the earlier mesh dim major, as in PyTorch. Shapes that do not divide the mesh are cut like
`torch.chunk` (PyTorch's `Shard`), so the last blocks may be smaller or empty; reductions
over them (`tf.reduce_mean`) count the true number of elements.

Python only converts; the layout checks stay in C++. Errors raised here show layouts as
placements: `[S(0), R] @ mesh(x=2,y=2)`.
"""

from __future__ import annotations

# A facade: the values, the conversions and the functions live in the layers below it.
from tf_dtensor import _module, _placement_api
from tf_dtensor._module import (LoadResult, distribute_module, distribute_parameter,  # noqa: F401
                                load_state_dict, named_modules, named_parameters,
                                save_state_dict, state_dict)
from tf_dtensor._placement_api import (distribute_tensor, from_local, full_tensor,  # noqa: F401
                                       init_device_mesh, placements_of, redistribute, to_local)
from tf_dtensor._placement_types import (Partial, Placement, Placements,  # noqa: F401
                                         Replicate, Shard)
from tf_dtensor.layout import MULTI_DIM_SEPARATOR, format_placements  # noqa: F401

__all__ = ["Placement", "Shard", "Replicate", "Partial", "format_placements"]
__all__ += _placement_api.__all__ + _module.__all__
