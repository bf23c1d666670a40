"""A small decoder-only transformer trained with data and tensor parallelism.

One or more decoder blocks (token and position embeddings, causal multi-head attention
written with `tf.einsum`, layer norm, a GELU MLP) and a language-model head, trained with
Adam on a synthetic next-token task. On a 2-D mesh ("batch", B) x ("model", M):

- data parallelism: tokens and every activation are sharded over "batch";
- Megatron-style tensor parallelism over "model": the attention heads and the MLP's
  hidden units are split over "model" (Q/K/V and the first MLP weight are
  column-parallel, the attention output and the second MLP weight row-parallel), so each
  attention and each MLP costs one all-reduce of the activations;
- the embedding table is sharded by vocabulary rows and the head by vocabulary columns,
  so the logits stay sharded over "model" into the cross entropy.

The model code carries no DTensor annotations beyond the weights' layouts and the batch's
layout; the same code runs on one plain device (`--plain`) and, in `bench/models.py`, on
TensorFlow's built-in DTensor. Every weight starts from the same NumPy values in every
mode, so the runs can be compared step by step.

    python examples/transformer.py                     # 2x4 mesh of 8 virtual CPUs
    python examples/transformer.py --steps 20 --strict # fail if any op had no rule
    python examples/transformer.py --plain
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 64
    seq: int = 16
    d_model: int = 32
    heads: int = 4
    d_head: int = 8
    d_ff: int = 64
    blocks: int = 2
    batch: int = 8          # global batch
    learning_rate: float = 3e-3


def configure_virtual_cpus(ncpu: int) -> None:
    """Splits the host CPU into `ncpu` logical CPUs (before TensorFlow starts)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured and len(configured) >= ncpu:
        return
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * ncpu)


# ---------------------------------------------------------------------------------------
# Where values live: a DTensor api module (tf_dtensor's or TensorFlow's) and a mesh, or
# one plain device.

U = "unsharded"


class Placement:
    """Makes variables and batches for one mode. `api` is None for plain TensorFlow."""

    def __init__(self, api=None, mesh=None):
        self.api, self.mesh = api, mesh

    def layout(self, specs: Sequence[str]):
        return self.api.Layout(list(specs), self.mesh)

    def tensor(self, value: np.ndarray, specs: Sequence[str]) -> tf.Tensor:
        """`value` on the mesh with layout `specs` (or a plain tensor)."""
        value = tf.convert_to_tensor(value)
        if self.api is None:
            return value
        replicated = self.api.copy_to_mesh(value, self.layout([U] * len(specs)))
        return self.api.relayout(replicated, self.layout(specs))

    def variable(self, value: np.ndarray, specs: Sequence[str], name: str) -> tf.Variable:
        if self.api is None:
            return tf.Variable(value, name=name)
        return self.api.DVariable(self.tensor(value, specs), name=name)


# ---------------------------------------------------------------------------------------
# The model.

# Layouts of the weights, per mesh dimension name; "model" shards heads, hidden units and
# the vocabulary.
WEIGHT_SPECS: Dict[str, Sequence[str]] = {
    "embedding": ("model", U),        # [vocab, d_model]: vocabulary rows
    "position": (U, U),               # [seq, d_model]
    "ln_scale": (U,), "ln_bias": (U,),
    "wq": (U, "model", U), "wk": (U, "model", U), "wv": (U, "model", U),  # [d, heads, d_head]
    "wo": ("model", U, U),            # [heads, d_head, d]: row-parallel
    "w1": (U, "model"), "b1": ("model",),  # [d, d_ff]: column-parallel
    "w2": ("model", U), "b2": (U,),   # [d_ff, d]: row-parallel
    "head": (U, "model"),             # [d_model, vocab]: vocabulary columns
}


def initial_values(config: Config, seed: int = 0) -> Dict[str, np.ndarray]:
    """Every weight as a NumPy array, the same in every mode."""
    rng = np.random.RandomState(seed)
    c = config

    def normal(*shape, scale=0.02):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    values = {"embedding": normal(c.vocab, c.d_model, scale=0.1),
              "position": normal(c.seq, c.d_model, scale=0.1),
              "head": normal(c.d_model, c.vocab, scale=0.1),
              "final/ln_scale": np.ones(c.d_model, np.float32),
              "final/ln_bias": np.zeros(c.d_model, np.float32)}
    for b in range(c.blocks):
        for ln in ("ln1", "ln2"):
            values[f"block{b}/{ln}/ln_scale"] = np.ones(c.d_model, np.float32)
            values[f"block{b}/{ln}/ln_bias"] = np.zeros(c.d_model, np.float32)
        for w in ("wq", "wk", "wv"):
            values[f"block{b}/{w}"] = normal(c.d_model, c.heads, c.d_head, scale=0.2)
        values[f"block{b}/wo"] = normal(c.heads, c.d_head, c.d_model, scale=0.2)
        values[f"block{b}/w1"] = normal(c.d_model, c.d_ff, scale=0.2)
        values[f"block{b}/b1"] = np.zeros(c.d_ff, np.float32)
        values[f"block{b}/w2"] = normal(c.d_ff, c.d_model, scale=0.2)
        values[f"block{b}/b2"] = np.zeros(c.d_model, np.float32)
    return values


class Transformer(tf.Module):

    def __init__(self, config: Config, placement: Placement, seed: int = 0,
                 weight_specs: Optional[Dict[str, Sequence[str]]] = None):
        super().__init__()
        self.config = config
        self.weights = {}
        weight_specs = {**WEIGHT_SPECS, **(weight_specs or {})}
        for name, value in initial_values(config, seed).items():
            specs = weight_specs[name.rsplit("/", 1)[-1]]
            self.weights[name] = placement.variable(value, specs, name.replace("/", "_"))
        mask = np.triu(np.full((config.seq, config.seq), -1e9, np.float32), k=1)
        self.causal_mask = placement.tensor(mask, (U, U))  # [query, key]

    def layer_norm(self, x, prefix: str, epsilon: float = 1e-5):
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        normed = (x - mean) * tf.math.rsqrt(variance + epsilon)
        return normed * self.weights[f"{prefix}/ln_scale"] + self.weights[f"{prefix}/ln_bias"]

    def attention(self, x, b: int):
        w = lambda name: self.weights[f"block{b}/{name}"]  # noqa: E731
        q = tf.einsum("btd,dhk->bthk", x, w("wq"))
        k = tf.einsum("btd,dhk->bthk", x, w("wk"))
        v = tf.einsum("btd,dhk->bthk", x, w("wv"))
        scores = tf.einsum("bqhk,bshk->bhqs", q, k) * (1.0 / np.sqrt(self.config.d_head))
        probs = tf.nn.softmax(scores + self.causal_mask, axis=-1)
        context = tf.einsum("bhqs,bshk->bqhk", probs, v)
        return tf.einsum("bqhk,hkd->bqd", context, w("wo"))  # the block's first all-reduce

    def mlp(self, x, b: int):
        w = lambda name: self.weights[f"block{b}/{name}"]  # noqa: E731
        hidden = tf.nn.gelu(tf.einsum("btd,df->btf", x, w("w1")) + w("b1"), approximate=True)
        return tf.einsum("btf,fd->btd", hidden, w("w2")) + w("b2")  # the second

    def __call__(self, tokens):
        x = tf.gather(self.weights["embedding"], tokens) + self.weights["position"]
        for b in range(self.config.blocks):
            x = x + self.attention(self.layer_norm(x, f"block{b}/ln1"), b)
            x = x + self.mlp(self.layer_norm(x, f"block{b}/ln2"), b)
        x = self.layer_norm(x, "final")
        return tf.einsum("btd,dv->btv", x, self.weights["head"])  # logits, vocab-sharded


def loss_fn(logits, targets):
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits))


class Adam(tf.Module):
    """Adam with slots laid out like their variables."""

    def __init__(self, variables: List[tf.Variable], placement: Placement,
                 learning_rate: float, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
        super().__init__()
        self.learning_rate, self.beta_1, self.beta_2 = learning_rate, beta_1, beta_2
        self.epsilon = epsilon
        self.step = placement.variable(np.float32(0.0), (), "step")
        self.m = [self._zeros_like(v) for v in variables]
        self.v = [self._zeros_like(v) for v in variables]

    @staticmethod
    def _zeros_like(variable):
        # tf.Variable or DVariable: zeros with the variable's layout.
        return type(variable)(tf.zeros_like(variable))

    def apply(self, grads, variables):
        self.step.assign_add(1.0)
        correction_1 = 1.0 - self.beta_1 ** self.step
        correction_2 = 1.0 - self.beta_2 ** self.step
        for g, var, m, v in zip(grads, variables, self.m, self.v):
            # The embedding's gradient is an IndexedSlices (rows of the looked-up tokens);
            # Adam's moments are dense, so sum it into a dense [vocab, d_model] gradient.
            g = tf.convert_to_tensor(g)
            m.assign(self.beta_1 * m + (1.0 - self.beta_1) * g)
            v.assign(self.beta_2 * v + (1.0 - self.beta_2) * tf.square(g))
            update = (m / correction_1) / (tf.sqrt(v / correction_2) + self.epsilon)
            var.assign_sub(self.learning_rate * update)


# ---------------------------------------------------------------------------------------
# Data: sequences of a fixed random permutation's orbit, so the next token is learnable.

def batches(config: Config, steps: int, seed: int = 1):
    rng = np.random.RandomState(seed)
    successor = rng.permutation(config.vocab)
    for _ in range(steps):
        starts = rng.randint(0, config.vocab, size=config.batch)
        seqs = np.empty((config.batch, config.seq + 1), np.int32)
        seqs[:, 0] = starts
        for t in range(config.seq):
            seqs[:, t + 1] = successor[seqs[:, t]]
        yield seqs[:, :-1], seqs[:, 1:]


def make_train_step(model: Transformer, optimizer: Adam):
    variables = list(model.weights.values())

    @tf.function
    def train_step(tokens, targets):
        with tf.GradientTape() as tape:
            loss = loss_fn(model(tokens), targets)
        grads = tape.gradient(loss, variables)
        optimizer.apply(grads, variables)
        return loss

    return train_step


def make_placement(api=None, mesh_shape=(2, 4)) -> Placement:
    if api is None:
        return Placement()
    batch, model = mesh_shape
    mesh = api.create_mesh([("batch", batch), ("model", model)],
                           devices=[f"CPU:{i}" for i in range(batch * model)])
    return Placement(api, mesh)


def train(steps: int = 5, plain: bool = False, mesh_shape=(2, 4), config: Config = Config(),
          api=None, weight_specs: Optional[Dict[str, Sequence[str]]] = None,
          log=print, on_ledger=None) -> List[float]:
    """Trains for `steps` and returns the loss of every step.

    `weight_specs` overrides entries of WEIGHT_SPECS (TensorFlow's DTensor, for one,
    cannot look up rows of a row-sharded table). With `on_ledger` (tf_dtensor only), the
    second step runs inside `tf_dtensor.debug.collectives()` and the ledger is passed to
    `on_ledger`.
    """
    if api is None and not plain:
        from tf_dtensor import dtensor as api
    placement = make_placement(None if plain else api, mesh_shape)
    model = Transformer(config, placement, weight_specs=weight_specs)
    optimizer = Adam(list(model.weights.values()), placement, config.learning_rate)
    train_step = make_train_step(model, optimizer)
    losses = []
    for step, (tokens, targets) in enumerate(batches(config, steps)):
        start = time.perf_counter()
        inputs = (placement.tensor(tokens, ("batch", U)), placement.tensor(targets, ("batch", U)))
        if on_ledger is not None and step == 1:  # traced at step 0: one call's collectives
            from tf_dtensor import debug  # pylint: disable=import-outside-toplevel
            with debug.collectives() as ledger:
                loss = train_step(*inputs)
            on_ledger(ledger)
        else:
            loss = train_step(*inputs)
        losses.append(float(loss.numpy()))
        log(f"step {step + 1}: loss {losses[-1]:.5f} ({time.perf_counter() - start:.3f} s)")
    return losses


def estimate(mesh_shapes: Sequence[Sequence[int]], config: Config = Config(), api=None) -> str:
    """What one training step costs per device on each mesh shape (batch x model), side by
    side: `debug.estimate` plans the step for abstract token batches, nothing runs."""
    from tf_dtensor import debug
    estimates = {}
    for shape in mesh_shapes:
        placement = make_placement(api, shape)
        model = Transformer(config, placement)
        optimizer = Adam(list(model.weights.values()), placement, config.learning_rate)
        step = make_train_step(model, optimizer)
        tokens = debug.spec([config.batch, config.seq], tf.int32,
                            api.Layout(["batch", U], placement.mesh))
        estimates[f"batch={shape[0]},model={shape[1]}"] = debug.estimate(step, tokens, tokens)
    return debug.compare(estimates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--plain", action="store_true", help="one plain device, no DTensor")
    parser.add_argument("--mesh", default="2x4", help="batch x model, e.g. 2x4 or 1x8")
    parser.add_argument("--strict", action="store_true",
                        help="raise if any op has no sharding rule")
    parser.add_argument("--collectives", metavar="PNG", nargs="?", const="",
                        help="print the collectives of one training step (and draw them "
                             "to PNG, if given)")
    parser.add_argument("--estimate", action="store_true",
                        help="print what one step costs per device on every batch x model "
                             "mesh of as many devices as --mesh, side by side, and stop")
    args = parser.parse_args()
    mesh_shape = tuple(int(n) for n in args.mesh.split("x"))
    configure_virtual_cpus(mesh_shape[0] * mesh_shape[1])
    from tf_dtensor import dtensor
    if args.strict:
        dtensor.set_strict_mode(True)
    if args.estimate:
        n = mesh_shape[0] * mesh_shape[1]
        print(estimate([(b, n // b) for b in range(n, 0, -1) if n % b == 0], api=dtensor))
        return
    def show(ledger):
        print(ledger.table())
        if args.collectives:
            ledger.plot(args.collectives, title="transformer training step: collectives")

    losses = train(args.steps, plain=args.plain, mesh_shape=mesh_shape, api=dtensor,
                   on_ledger=show if args.collectives is not None and not args.plain else None)
    print(f"first loss {losses[0]:.4f}, last loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
