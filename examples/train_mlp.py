"""Distributed training with the Core APIs and DTensor, with tf_dtensor.

TensorFlow's guide "Distributed training with Core APIs and DTensor": a 784-700-500-10
MLP built from `tf.Module`s with DVariable weights replicated over a 1-D mesh
("batch", N), a hand-written Adam, and data-parallel training on global batches of 128
split over the mesh with `dtensor.pack`. `from tf_dtensor import dtensor` stands in for
`from tensorflow.experimental import dtensor`.

MNIST cannot be downloaded here, so the default data set is scikit-learn's bundled
digits (1797 images of 8x8) upscaled to 28x28; `--mnist PATH` reads a local Keras
`mnist.npz` instead. `--plain` runs the identical model and training on one plain
device, without DTensor, for comparison.

    python examples/train_mlp.py                       # 8 virtual CPUs, 3 epochs
    python examples/train_mlp.py --epochs 1 --steps-per-epoch 2 --plot /tmp/mlp.png
    python examples/train_mlp.py --plain
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from typing import Callable, Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from tf_dtensor import dtensor

BATCH_SIZE = 128
INPUT_SIZE, HIDDEN_1_SIZE, HIDDEN_2_SIZE, OUTPUT_SIZE = 784, 700, 500, 10
MNIST_EXAMPLES = 5000  # The guide trains and tests on 5000 MNIST examples each.


def configure_virtual_cpus(ncpu: int) -> None:
    """Splits the host CPU into `ncpu` logical CPUs; must run before TensorFlow starts.

    Does nothing if the split is already there (as when pytest's conftest made it).
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured and len(configured) >= ncpu:
        return
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * ncpu)


# ---------------------------------------------------------------------------------------
# Data: (x_train, y_train, x_test, y_test) as numpy arrays, x float32 in [0, 1] shaped
# (n, 784), y int64 (the guide casts labels to int64 to compare them with tf.argmax).

Data = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def load_digits_28x28(train_size: int = 1280) -> Data:
    """scikit-learn's 8x8 digits (values 0..16) upscaled bilinearly to 28x28 MNIST shape.

    The split is deterministic: a fixed permutation, then the first `train_size` images
    (10 global batches of 128) train and the other 517 test.
    """
    from sklearn.datasets import load_digits  # The `examples` extra installs it.

    digits = load_digits()
    images = digits.images.astype(np.float32)[..., np.newaxis] / 16.0
    images = tf.image.resize(images, (28, 28), method="bilinear").numpy()
    x = np.clip(images, 0.0, 1.0).reshape(-1, INPUT_SIZE)
    y = digits.target.astype(np.int64)
    order = np.random.RandomState(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:train_size], y[:train_size], x[train_size:], y[train_size:]


def load_mnist(path: str, limit: int = MNIST_EXAMPLES) -> Data:
    """A local Keras-format `mnist.npz`, the first `limit` train and test images."""
    with np.load(path) as f:
        x_train, y_train = f["x_train"][:limit], f["y_train"][:limit]
        x_test, y_test = f["x_test"][:limit], f["y_test"][:limit]

    def preprocess(x, y):
        # Reshape to 2-D and rescale to the unit interval [0, 1], as the guide does.
        return (x.reshape(-1, INPUT_SIZE).astype(np.float32) / 255.0, y.astype(np.int64))

    return preprocess(x_train, y_train) + preprocess(x_test, y_test)


def batches(x: np.ndarray, y: np.ndarray, batch_size: int = BATCH_SIZE,
            shuffle_seed: Optional[int] = None) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
    """Global batches of `batch_size`, dropping the remainder (a batch must split evenly
    over the mesh). A seed shuffles deterministically, so every run sees the same order."""
    order = np.arange(len(x))
    if shuffle_seed is not None:
        order = np.random.RandomState(shuffle_seed).permutation(len(x))
    for start in range(0, len(x) - batch_size + 1, batch_size):
        index = order[start:start + batch_size]
        yield x[index], y[index]


# ---------------------------------------------------------------------------------------
# The model. A layout of None means plain mode: the same code makes tf.Variables on one
# device instead of DVariables on the mesh.

def new_variable(initializer: Callable[..., tf.Tensor], layout: Optional[dtensor.Layout],
                 **kwargs) -> tf.Variable:
    """`DVariable(call_with_layout(initializer, layout, ...))`, or a plain `tf.Variable`."""
    if layout is None:
        return tf.Variable(initializer(**kwargs))
    return dtensor.DVariable(dtensor.call_with_layout(initializer, layout, **kwargs))


# The guide wraps stateless_uniform in a new tf.function in every layer; one shared
# function traces once per weight shape instead, and TF stops warning about retracing.
UNIFORM_INITIALIZER = tf.function(tf.random.stateless_uniform)


class DenseLayer(tf.Module):

    def __init__(self, in_dim: int, out_dim: int, weight_layout: Optional[dtensor.Layout],
                 activation=tf.identity):
        super().__init__()
        # Initialize dimensions and the activation function
        self.in_dim, self.out_dim = in_dim, out_dim
        self.activation = activation

        # Initialize the DTensor weights using the Xavier scheme
        uniform_initializer = UNIFORM_INITIALIZER
        xavier_lim = tf.sqrt(6.) / tf.sqrt(tf.cast(self.in_dim + self.out_dim, tf.float32))
        self.w = new_variable(uniform_initializer, weight_layout,
                              shape=(self.in_dim, self.out_dim), seed=(22, 23),
                              minval=-xavier_lim, maxval=xavier_lim)

        # Initialize the bias with the zeros: [*,*] -> delete([0]) -> [*]
        bias_layout = weight_layout.delete([0]) if weight_layout is not None else None
        self.b = new_variable(tf.zeros, bias_layout, shape=[out_dim])

    def __call__(self, x):
        # Compute the forward pass
        z = tf.add(tf.matmul(x, self.w), self.b)
        return self.activation(z)


class MLP(tf.Module):

    def __init__(self, layers):
        super().__init__()
        self.layers = layers

    def __call__(self, x, preds=False):
        # Execute the model's layers sequentially
        for layer in self.layers:
            x = layer(x)
        return x


def build_model(weight_layout: Optional[dtensor.Layout]) -> MLP:
    """Forward pass: ReLU(784 x 700) x ReLU(700 x 500) x Softmax(500 x 10)."""
    return MLP([
        DenseLayer(in_dim=INPUT_SIZE, out_dim=HIDDEN_1_SIZE, weight_layout=weight_layout,
                   activation=tf.nn.relu),
        DenseLayer(in_dim=HIDDEN_1_SIZE, out_dim=HIDDEN_2_SIZE, weight_layout=weight_layout,
                   activation=tf.nn.relu),
        DenseLayer(in_dim=HIDDEN_2_SIZE, out_dim=OUTPUT_SIZE, weight_layout=weight_layout),
    ])


def cross_entropy_loss(y_pred, y):
    # Compute cross entropy loss with a sparse operation
    sparse_ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=y_pred)
    return tf.reduce_mean(sparse_ce)


def accuracy(y_pred, y):
    # Compute accuracy after extracting class predictions
    class_preds = tf.argmax(y_pred, axis=1)
    is_equal = tf.equal(y, class_preds)
    return tf.reduce_mean(tf.cast(is_equal, tf.float32))


class Adam(tf.Module):

    def __init__(self, model_vars, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, ep=1e-7):
        super().__init__()
        # Initialize optimizer parameters and variable slots
        self.model_vars = model_vars
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.learning_rate = learning_rate
        self.ep = ep
        # The guide keeps `t` as a Python float. Inside the @tf.function train_step that
        # float is read once, at trace time, so every traced step would use the bias
        # correction of step 1 and `self.t += 1.` would only count traces. A variable
        # (replicated, [] on the mesh) is read and incremented on every call instead.
        layouts = [getattr(var, "layout", None) for var in model_vars]
        scalar_layout = (dtensor.Layout.replicated(layouts[0].mesh, rank=0)
                         if layouts and layouts[0] is not None else None)
        self.t = new_variable(tf.ones, scalar_layout, shape=[])
        self.v_dvar, self.s_dvar = [], []
        # Initialize optimizer variable slots
        for var, layout in zip(model_vars, layouts):
            v = new_variable(tf.zeros, layout, shape=var.shape)
            s = new_variable(tf.zeros, layout, shape=var.shape)
            self.v_dvar.append(v)
            self.s_dvar.append(s)

    def apply_gradients(self, grads):
        # Update the model variables given their gradients
        for i, (d_var, var) in enumerate(zip(grads, self.model_vars)):
            self.v_dvar[i].assign(self.beta_1 * self.v_dvar[i] + (1 - self.beta_1) * d_var)
            self.s_dvar[i].assign(
                self.beta_2 * self.s_dvar[i] + (1 - self.beta_2) * tf.square(d_var))
            v_dvar_bc = self.v_dvar[i] / (1 - (self.beta_1 ** self.t))
            s_dvar_bc = self.s_dvar[i] / (1 - (self.beta_2 ** self.t))
            var.assign_sub(self.learning_rate * (v_dvar_bc / (tf.sqrt(s_dvar_bc) + self.ep)))
        self.t.assign_add(1.)


# ---------------------------------------------------------------------------------------
# Data packing: send each replica only its shard of the global batch.

def repack_local_tensor(x, layout: dtensor.Layout):
    """Repacks a local Tensor-like to a DTensor with layout.

    This function assumes a single-client application.
    """
    x = tf.convert_to_tensor(x)
    sharded_dims = []

    # For every sharded dimension, use tf.split to split the along the dimension.
    # The result is a nested list of split-tensors in queue[0].
    queue = [x]
    for axis, dim in enumerate(layout.sharding_specs):
        if dim == dtensor.UNSHARDED:
            continue
        num_splits = layout.num_shards(axis)
        queue = tf.nest.map_structure(lambda x: tf.split(x, num_splits, axis=axis), queue)
        sharded_dims.append(dim)

    # Now you can build the list of component tensors by looking up the location in
    # the nested list of split-tensors created in queue[0].
    components = []
    for locations in layout.mesh.local_device_locations():
        t = queue[0]
        for dim in sharded_dims:
            split_index = locations[dim]  # Only valid on single-client mesh.
            t = t[split_index]
        components.append(t)

    return dtensor.pack(components, layout)


def repack_batch(x, y, mesh: Optional[dtensor.Mesh]):
    """The batch as DTensors sharded over "batch": x `[batch,*]`, y `[batch]`."""
    if mesh is None:  # Plain mode: regular tensors on the default device.
        return tf.convert_to_tensor(x), tf.convert_to_tensor(y)
    x = repack_local_tensor(x, layout=dtensor.Layout(["batch", dtensor.UNSHARDED], mesh))
    y = repack_local_tensor(y, layout=dtensor.Layout(["batch"], mesh))
    return x, y


# ---------------------------------------------------------------------------------------
# Training. train_step needs no DTensor annotations: the layouts of its inputs decide.

@tf.function
def train_step(model, x_batch, y_batch, loss, metric, optimizer):
    # Execute a single training step
    with tf.GradientTape() as tape:
        y_pred = model(x_batch)
        batch_loss = loss(y_pred, y_batch)
    # Compute gradients and update the model's parameters
    grads = tape.gradient(batch_loss, model.trainable_variables)
    optimizer.apply_gradients(grads)
    # Return batch loss and accuracy
    batch_acc = metric(y_pred, y_batch)
    return batch_loss, batch_acc


@tf.function
def test_step(model, x_batch, y_batch, loss, metric):
    # Execute a single testing step
    y_pred = model(x_batch)
    batch_loss = loss(y_pred, y_batch)
    batch_acc = metric(y_pred, y_batch)
    return batch_loss, batch_acc


@dataclasses.dataclass
class History:
    """Per-epoch means (and the loss of every training step, to compare runs)."""
    train_loss: List[float] = dataclasses.field(default_factory=list)
    train_acc: List[float] = dataclasses.field(default_factory=list)
    test_loss: List[float] = dataclasses.field(default_factory=list)
    test_acc: List[float] = dataclasses.field(default_factory=list)
    step_loss: List[float] = dataclasses.field(default_factory=list)


def make_mesh(mesh_size: int) -> dtensor.Mesh:
    """A 1-D mesh ("batch", N) over CPU:0..CPU:N-1."""
    return dtensor.create_mesh([("batch", mesh_size)],
                               devices=[f"CPU:{i}" for i in range(mesh_size)])


def evaluate(model, data: Data, mesh: Optional[dtensor.Mesh]) -> Tuple[float, float]:
    """Mean loss and accuracy of `model` over the test batches."""
    losses, accs = [], []
    for x_batch, y_batch in batches(data[2], data[3]):
        x_batch, y_batch = repack_batch(x_batch, y_batch, mesh)
        batch_loss, batch_acc = test_step(model, x_batch, y_batch, cross_entropy_loss, accuracy)
        # Loss and accuracy come back replicated, so each device holds the full scalar.
        losses.append(float(batch_loss.numpy()))
        accs.append(float(batch_acc.numpy()))
    return float(np.mean(losses)), float(np.mean(accs))


def fit(model, optimizer, data: Data, mesh: Optional[dtensor.Mesh], epochs: int,
        steps_per_epoch: Optional[int] = None, log: Callable[[str], None] = print) -> History:
    """Trains for `epochs` (each at most `steps_per_epoch` global batches) and evaluates
    on the test data after each; reports one line per epoch through `log`."""
    history = History()
    for epoch in range(epochs):
        start = time.perf_counter()
        batch_losses_train, batch_accs_train = [], []
        # Iterate through training data
        for step, (x_batch, y_batch) in enumerate(batches(data[0], data[1], shuffle_seed=epoch)):
            if steps_per_epoch is not None and step >= steps_per_epoch:
                break
            x_batch, y_batch = repack_batch(x_batch, y_batch, mesh)
            batch_loss, batch_acc = train_step(model, x_batch, y_batch, cross_entropy_loss,
                                               accuracy, optimizer)
            # Keep track of batch-level training performance
            batch_losses_train.append(float(batch_loss.numpy()))
            batch_accs_train.append(float(batch_acc.numpy()))
        history.step_loss.extend(batch_losses_train)
        history.train_loss.append(float(np.mean(batch_losses_train)))
        history.train_acc.append(float(np.mean(batch_accs_train)))
        # Iterate through testing data
        test_loss, test_acc = evaluate(model, data, mesh)
        history.test_loss.append(test_loss)
        history.test_acc.append(test_acc)
        log(f"Epoch {epoch + 1}/{epochs}: training loss {history.train_loss[-1]:.3f}, "
            f"accuracy {history.train_acc[-1]:.3f}; testing loss {test_loss:.3f}, "
            f"accuracy {test_acc:.3f} ({len(batch_losses_train)} steps, "
            f"{time.perf_counter() - start:.1f} s)")
    return history


def setup(mesh_size: int, plain: bool):
    """(mesh, weight_layout): replicated weights on ("batch", N), or (None, None) for plain."""
    if plain:
        return None, None
    mesh = make_mesh(mesh_size)
    return mesh, dtensor.Layout([dtensor.UNSHARDED, dtensor.UNSHARDED], mesh)


def train(mesh_size: int = 8, epochs: int = 3, steps_per_epoch: Optional[int] = None,
          plain: bool = False, data: Optional[Data] = None,
          log: Callable[[str], None] = print) -> History:
    """Builds the model and optimizer and trains them; the function tests call.

    Args:
      mesh_size: number of virtual CPUs in the ("batch", N) mesh (ignored when `plain`).
      epochs: passes over the training data.
      steps_per_epoch: at most this many global batches per epoch (None: all).
      plain: run on one plain device without DTensor.
      data: (x_train, y_train, x_test, y_test); defaults to the upscaled digits.
      log: receives one progress line per epoch.

    Returns:
      The History of the run.
    """
    data = load_digits_28x28() if data is None else data
    mesh, weight_layout = setup(mesh_size, plain)
    model = build_model(weight_layout)
    optimizer = Adam(model.trainable_variables)
    return fit(model, optimizer, data, mesh, epochs, steps_per_epoch, log)


def checkpoint_round_trip(model, optimizer, data: Data, mesh: Optional[dtensor.Mesh],
                          weight_layout: Optional[dtensor.Layout],
                          directory: str) -> Tuple[float, float]:
    """Writes model and optimizer to a checkpoint, restores it into a fresh model and
    optimizer on the same mesh, and returns the restored model's test loss and accuracy."""
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).write(
        os.path.join(directory, "mlp"))
    fresh_model = build_model(weight_layout)
    fresh_optimizer = Adam(fresh_model.trainable_variables)
    status = tf.train.Checkpoint(model=fresh_model, optimizer=fresh_optimizer).read(path)
    status.assert_consumed()
    return evaluate(fresh_model, data, mesh)


def plot_metrics(history: History, path: str) -> bool:
    """Saves loss and accuracy against epochs, training and testing, as a PNG at `path`."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # No display needed.
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed, so no plot was written to {path} "
              f"(pip install matplotlib).")
        return False
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    epochs = range(1, len(history.train_loss) + 1)
    for axis, metric_type, train_metric, test_metric in (
            (axes[0], "loss", history.train_loss, history.test_loss),
            (axes[1], "accuracy", history.train_acc, history.test_acc)):
        axis.plot(epochs, train_metric, marker="o", label=f"Training {metric_type}")
        axis.plot(epochs, test_metric, marker="o", label=f"Testing {metric_type}")
        axis.set_xlabel("Epochs")
        axis.set_ylabel(metric_type)
        axis.legend()
        axis.set_title(f"{metric_type} vs training epochs")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    print(f"Saved the loss and accuracy plot to {path}")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8,
                        help="virtual CPUs in the ('batch', N) mesh (default 8)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=None,
                        help="at most this many global batches per epoch, for quick runs")
    parser.add_argument("--plain", action="store_true",
                        help="run the same model and training on one plain device, no DTensor")
    parser.add_argument("--mnist", metavar="PATH",
                        help="a local Keras-format mnist.npz instead of the upscaled digits")
    parser.add_argument("--plot", metavar="PATH", help="save a loss/accuracy PNG here")
    parser.add_argument("--checkpoint-dir", metavar="DIR",
                        help="where to write the checkpoint (default: a temporary directory)")
    args = parser.parse_args()

    if BATCH_SIZE % args.devices:
        parser.error(f"--devices {args.devices} must divide the global batch of {BATCH_SIZE}")
    configure_virtual_cpus(args.devices)
    print("TensorFlow version:", tf.__version__)
    data = load_mnist(args.mnist) if args.mnist else load_digits_28x28()
    print(f"{len(data[0])} training and {len(data[2])} testing examples of {INPUT_SIZE} "
          f"pixels ({'MNIST' if args.mnist else 'digits upscaled to 28x28'})")

    mesh, weight_layout = setup(args.devices, args.plain)
    print("Plain single device, no DTensor" if mesh is None else f"Mesh: {mesh}")
    model = build_model(weight_layout)
    optimizer = Adam(model.trainable_variables)
    history = fit(model, optimizer, data, mesh, args.epochs, args.steps_per_epoch)

    if args.plot:
        plot_metrics(history, args.plot)

    with tempfile.TemporaryDirectory() as temporary:
        directory = args.checkpoint_dir or temporary
        test_loss, test_acc = checkpoint_round_trip(model, optimizer, data, mesh,
                                                    weight_layout, directory)
    print(f"Restored from the checkpoint into a fresh model: testing loss {test_loss:.3f}, "
          f"accuracy {test_acc:.3f}")


if __name__ == "__main__":
    main()
