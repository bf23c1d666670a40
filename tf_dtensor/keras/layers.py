"""Keras layers with layout arguments, as TensorFlow's Keras-2 DTensor integration had.

Each layer is Keras' own, with one more keyword per weight:

    Dense(units, kernel_layout=..., bias_layout=...)
    EinsumDense(equation, output_shape, kernel_layout=..., bias_layout=...)
    Embedding(input_dim, output_dim, embeddings_layout=...)
    Conv2D(filters, kernel_size, kernel_layout=..., bias_layout=...)
    LayerNormalization(gamma_layout=..., beta_layout=...)
    BatchNormalization(gamma_layout=..., beta_layout=..., moving_mean_layout=...,
                       moving_variance_layout=...)
    MultiHeadAttention(num_heads, key_dim, query_kernel_layout=..., query_bias_layout=...,
                       key_..., value_..., output_kernel_layout=..., output_bias_layout=...)

A layout is a tf_dtensor `Layout`, a `keras.distribution.TensorLayout`, or PyTorch-style
placements (`[Replicate(), Shard(1)]`) on the layer's `mesh=` (or the active
distribution's mesh). A weight with a layout argument is a `DVariable` in that layout,
with or without a Keras distribution; an argument overrides the distribution's LayoutMap
for that weight. Layers are registered for saving (`package="tf_dtensor"`), and their
config holds each layout in its string form.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Dict, Optional

import keras

from tf_dtensor._errors import LayoutError
from tf_dtensor.keras import _backend, _scopes
from tf_dtensor.layout import Layout, _layout_for
from tf_dtensor.mesh import Mesh


def _resolver(value: Any, mesh: Optional[Mesh], argument: str):
    """A function rank -> Layout for one layout argument."""
    if isinstance(value, str):
        value = Layout.from_string(value)

    def resolve(rank: int) -> Layout:
        if isinstance(value, (list, tuple)):
            target = mesh
            if target is None:
                distribution = _backend.active_distribution()
                target = distribution.device_mesh.backend_mesh if distribution else None
            if target is None:
                raise ValueError(
                    f"`{argument}` gives placements {list(value)} but the layer has no `mesh=` "
                    f"and no Keras distribution is set; pass `mesh=` to the layer.")
            return _layout_for(target, list(value), rank, argument)
        try:
            return _backend.to_layout(value, rank)
        except LayoutError as error:
            raise LayoutError(f"`{argument}`: {error}") from None

    return resolve


def _mesh_of(value: Any) -> Optional[Mesh]:
    if isinstance(value, str):
        value = Layout.from_string(value)
    if isinstance(value, Layout):
        return value.mesh
    if value is not None and hasattr(value, "backend_layout"):
        return value.backend_layout.mesh
    return None


class _LayoutArguments:
    """Mixin: pops `<weight>_layout` keywords and applies them while the layer builds."""

    # keyword -> path of the weight under the layer ("kernel", "query/kernel")
    LAYOUT_ARGUMENTS: Dict[str, str] = {}

    def __init__(self, *args, mesh: Optional[Mesh] = None, **kwargs):
        self._layout_values = {k: kwargs.pop(k, None) for k in self.LAYOUT_ARGUMENTS}
        self._layout_mesh = mesh
        super().__init__(*args, **kwargs)

    @contextlib.contextmanager
    def _weight_layouts(self):
        """While building: the layout arguments apply, and the layer's other weights are
        replicated on its mesh (a layer's weights all live on one mesh)."""
        layouts = {self.LAYOUT_ARGUMENTS[k]: _resolver(v, self._layout_mesh, k)
                   for k, v in self._layout_values.items() if v is not None}
        mesh = self._tf_dtensor_mesh()
        with _scopes.weight_layouts(layouts), \
                (_scopes.default_mesh(mesh) if mesh is not None else contextlib.nullcontext()):
            yield

    def _tf_dtensor_mesh(self) -> Optional[Mesh]:
        """The mesh this layer's weights will live on: its `mesh=`, else that of a layout
        argument; None when neither names one (placements then use the distribution's)."""
        return self._layout_mesh or next(
            (m for m in map(_mesh_of, self._layout_values.values()) if m is not None), None)

    def get_config(self):
        config = super().get_config()
        for keyword, value in self._layout_values.items():
            if isinstance(value, Layout):
                config[keyword] = value.to_string()
            elif value is not None and hasattr(value, "backend_layout"):
                config[keyword] = value.backend_layout.to_string()
            elif isinstance(value, str):
                config[keyword] = value
            elif value is not None:
                weight = self._built_weight(self.LAYOUT_ARGUMENTS[keyword])
                config[keyword] = weight._value.layout.to_string() if weight is not None else None
        return config

    def _built_weight(self, relative_path: str):
        for weight in self.weights:
            if weight.path.endswith("/" + relative_path) and _scopes.is_distributed(weight):
                return weight
        return None


def _layer(base, arguments: Dict[str, str], doc: str):
    @functools.wraps(base.build)  # Keras reads build's signature for the shape arguments
    def build(self, *args, **kwargs):
        with self._weight_layouts():
            return base.build(self, *args, **kwargs)

    cls = type(base.__name__, (_LayoutArguments, base),
               {"LAYOUT_ARGUMENTS": arguments, "__doc__": doc, "build": build,
                "__module__": __name__})
    return keras.saving.register_keras_serializable(package="tf_dtensor")(cls)


_DENSE = {"kernel_layout": "kernel", "bias_layout": "bias"}

Dense = _layer(keras.layers.Dense, _DENSE,
               "`keras.layers.Dense` with `kernel_layout=` and `bias_layout=`.")
EinsumDense = _layer(keras.layers.EinsumDense, _DENSE,
                     "`keras.layers.EinsumDense` with `kernel_layout=` and `bias_layout=`.")
Conv2D = _layer(keras.layers.Conv2D, _DENSE,
                "`keras.layers.Conv2D` with `kernel_layout=` and `bias_layout=`.")
Embedding = _layer(keras.layers.Embedding, {"embeddings_layout": "embeddings"},
                   "`keras.layers.Embedding` with `embeddings_layout=`.")
LayerNormalization = _layer(
    keras.layers.LayerNormalization, {"gamma_layout": "gamma", "beta_layout": "beta"},
    "`keras.layers.LayerNormalization` with `gamma_layout=` and `beta_layout=`.")
BatchNormalization = _layer(
    keras.layers.BatchNormalization,
    {"gamma_layout": "gamma", "beta_layout": "beta", "moving_mean_layout": "moving_mean",
     "moving_variance_layout": "moving_variance"},
    "`keras.layers.BatchNormalization` with `gamma_layout=`, `beta_layout=`, "
    "`moving_mean_layout=` and `moving_variance_layout=`.")
MultiHeadAttention = _layer(
    keras.layers.MultiHeadAttention,
    {f"{part}_{weight}_layout": f"{sub}/{weight}"
     for part, sub in (("query", "query"), ("key", "key"), ("value", "value"),
                       ("output", "attention_output"))
     for weight in ("kernel", "bias")},
    "`keras.layers.MultiHeadAttention` with `{query,key,value,output}_{kernel,bias}_layout=` "
    "(the projections' EinsumDense weights).")

__all__ = ["BatchNormalization", "Conv2D", "Dense", "EinsumDense", "Embedding",
           "LayerNormalization", "MultiHeadAttention"]
