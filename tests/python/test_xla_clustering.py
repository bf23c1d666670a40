"""XLA reaches the SPMD function: `tf.config.optimizer.set_jit` and `jit_compile=True`.

A tf.function on a mesh runs as one SPMD function of every device's ops. TF's clustering
pass fuses each device's ops into XLA clusters when the call's `config_proto` asks for it
(`set_jit`); tf_dtensor carries that choice from the user's call to the SPMD function
(before, it kept only soft placement, and nothing was ever clustered). A function traced
with `jit_compile=True` has each device's ops marked for XLA (`_XlaCompile`), so they are
compiled per device (one XLA computation cannot span devices; TensorFlow's DTensor ignores
the flag). On GPUs this is what cuts a step's kernel launches. Each program runs in its own process: TF reads `TF_XLA_FLAGS` (CPUs
cluster only with `--tf_xla_cpu_global_jit`) once, and XLA dumps each compiled cluster, which
is how the test sees that clustering happened.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

from dtensor_testing import run_python

_PROGRAM = """
import json
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 5)
if JIT == "set_jit":
    tf.config.optimizer.set_jit("autoclustering")
from tf_dtensor import config, dtensor
config.set_collective_lowering(LOWERING)
# CPU:1-4, apart from the host's CPU:0 as GPUs are (the default lowering of virtual CPUs
# makes the mesh's first device the host all the same).
mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{i}" for i in range(1, 5)])
rng = np.random.RandomState(0)
x_value = rng.rand(8, 16).astype(np.float32)
w_value = rng.rand(16, 4).astype(np.float32) - 0.5
w = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(w_value),
                                           dtensor.Layout.replicated(mesh, 2)))

@tf.function(jit_compile=JIT == "jit_compile")
def step(x):
    with tf.GradientTape() as tape:
        h = tf.nn.relu(tf.matmul(x, w) * 2.0 + 1.0)
        loss = tf.reduce_sum(tf.tanh(h))
    w.assign_sub(0.1 * tape.gradient(loss, w))
    return loss

x = dtensor.pack(np.split(x_value, 4), dtensor.Layout(["x", "unsharded"], mesh))
losses = [float(dtensor.unpack(step(x))[0].numpy()) for _ in range(2)]
print(json.dumps({"losses": losses, "w": dtensor.unpack(w.read_value())[1].numpy().tolist()}))
"""


def _reference():
    """The two steps in NumPy (float64)."""
    import numpy as np
    rng = np.random.RandomState(0)
    x = rng.rand(8, 16).astype(np.float32).astype(np.float64)
    w = (rng.rand(16, 4).astype(np.float32) - 0.5).astype(np.float64)
    losses = []
    for _ in range(2):
        pre = x @ w * 2.0 + 1.0
        h = np.maximum(pre, 0.0)
        losses.append(np.tanh(h).sum())
        grad_h = (1.0 - np.tanh(h) ** 2) * (pre > 0)
        w = w - 0.1 * (x.T @ (grad_h * 2.0))
    return losses, w


def _run(lowering: str, jit: str, dump: str) -> dict:
    program = (textwrap.dedent(_PROGRAM).replace("LOWERING", repr(lowering))
               .replace("JIT", repr(jit)))
    result = run_python(program, env={
        "TF_CPP_MIN_LOG_LEVEL": "2", "TF_XLA_FLAGS": "--tf_xla_cpu_global_jit",
        "XLA_FLAGS": f"--xla_dump_to={dump}"}, timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-5000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def _clusters(dump: str) -> int:
    if not os.path.isdir(dump):
        return 0
    return sum(1 for f in os.listdir(dump) if f.endswith("before_optimizations.txt"))


@pytest.mark.parametrize("lowering", ["", "copies", "ops"], ids=["default", "copies", "ops"])
def test_xla_compiles_every_device_of_the_spmd_function(tmp_path, lowering):
    import numpy as np
    losses, w = _reference()
    # Without XLA, with set_jit, with jit_compile=True: one process each.
    runs = {jit or "off": _run(lowering, jit=jit, dump=str(tmp_path / (jit or "off")))
            for jit in ("", "set_jit", "jit_compile")}
    for got in runs.values():
        np.testing.assert_allclose(got["losses"], losses, rtol=1e-5)
        np.testing.assert_allclose(got["w"], w, rtol=1e-5, atol=1e-6)
    assert _clusters(str(tmp_path / "off")) == 0
    # At least one cluster per device (the step's forward and backward ops on each of the
    # 4 devices; collectives and variable updates stay outside).
    assert _clusters(str(tmp_path / "set_jit")) >= 4
    if lowering:
        assert _clusters(str(tmp_path / "jit_compile")) >= 4
    else:
        # Where the host is one of the mesh's devices, jit_compile is ignored (as
        # TensorFlow's DTensor ignores it on every mesh): a cluster of a device's and the
        # host's ops could deadlock with other devices' collectives.
        assert _clusters(str(tmp_path / "jit_compile")) == 0


_HOST_VALUES_PROGRAM = """
import json
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
from tf_dtensor import config, dtensor
config.set_collective_lowering(LOWERING)
mesh = dtensor.create_mesh([("x", 2)], devices=["CPU:1", "CPU:2"])
value = np.random.RandomState(2).rand(8, 8)

def step(v):
    with tf.GradientTape() as tape:
        tape.watch(v)
        y = tf.pad(tf.split(v, 8, axis=0)[4], [[0, 0], [1, 2]])
        loss = tf.reduce_sum(tf.sin(y))
    return y, tape.gradient(loss, v)

want = [t.numpy() for t in tf.function(step)(tf.constant(value))]
v = dtensor.copy_to_mesh(tf.constant(value), dtensor.Layout.replicated(mesh, 2))
got = [dtensor.unpack(t)[1].numpy() for t in tf.function(step, jit_compile=True)(v)]
print(json.dumps([[w.tolist(), g.tolist()] for w, g in zip(want, got)]))
"""


@pytest.mark.parametrize("lowering", ["copies", "ops"])
def test_jit_compile_of_a_pad_gradient_on_cpus_apart_from_the_host(lowering):
    # The gradient of a Pad slices by a begin computed on the host; the device's XLA
    # cluster took it from the host's CPU and TF refused to launch it ("Multiple CPU
    # devices [CPU:2, CPU:0]"; found by the program fuzzer). Each device now reads such
    # host values through an Identity of its own.
    import numpy as np
    program = textwrap.dedent(_HOST_VALUES_PROGRAM).replace("LOWERING", repr(lowering))
    result = run_python(program, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=150)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-5000:]}"
    for want, got in json.loads(result.stdout.strip().splitlines()[-1]):
        np.testing.assert_allclose(got, want, rtol=1e-12)


_ROWS_PICKED_BY_VALUE_PROGRAM = """
import json
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 5)
from tf_dtensor import config, dtensor
config.set_collective_lowering(LOWERING)
mesh = dtensor.create_mesh([("x", 4)], devices=["CPU:1", "CPU:2", "CPU:3", "CPU:4"])
table = np.random.RandomState(3).rand(ROWS, 8).astype(np.float32)
ids = np.array(IDS, np.int32)

def step(v):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.sin(tf.nn.embedding_lookup(v, ids)))
    v.assign_sub(0.1 * tf.convert_to_tensor(tape.gradient(loss, v)))
    return loss

plain = tf.Variable(table)
want = [float(tf.function(step)(plain)), plain.numpy().tolist()]
v = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(table), dtensor.Layout(["x", "unsharded"], mesh)))
loss = tf.function(step, jit_compile=True)(v)
got = [float(dtensor.unpack(loss)[0]), dtensor.unpack(dtensor.relayout(v.read_value(), dtensor.Layout.replicated(mesh, 2)))[0].numpy().tolist()]
print(json.dumps([want, got]))
"""


@pytest.mark.parametrize("lowering", ["copies", "ops"])
@pytest.mark.parametrize("rows,ids", [(1, [[0] * 4] * 6), (6, [[0, 5, 2], [5, 5, 1]])])
def test_jit_compile_of_a_gather_from_row_blocks_picked_by_value(lowering, rows, ids):
    # A gather from a table sharded by rows keeps the ids in each device's block with a
    # Where, then pads the rows it looked up. Compiled with the Where, XLA gave the rows a
    # bounded dynamic size and the Pad a rank-1 input ("The first dimension of paddings
    # must be the rank of inputs[2,2] [8]"; found by the program fuzzer, a table of one
    # row over 4 devices). Ops sized by their input's values now stay outside XLA.
    import numpy as np
    program = textwrap.dedent(_ROWS_PICKED_BY_VALUE_PROGRAM).replace(
        "LOWERING", repr(lowering)).replace("ROWS", str(rows)).replace("IDS", repr(ids))
    result = run_python(program, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=150)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-5000:]}"
    want, got = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)


_CONTROL_FLOW_PROGRAM = """
import json
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
from tf_dtensor import config, dtensor
config.set_collective_lowering(LOWERING)
mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{i}" for i in range(4)])
value = np.random.RandomState(1).rand(8, 6).astype(np.float32) - 0.25

def loop(a):
    return tf.while_loop(lambda i, x: i < 3,
                         lambda i, x: (i + 1, x + tf.reduce_mean(x)), [0, a])[1]

def cond(a):
    return tf.cond(tf.reduce_sum(a) > 0, lambda: a + tf.reduce_mean(a),
                   lambda: a - tf.reduce_max(a))

def case(a):
    index = tf.cast(tf.reduce_sum(a) > 0, tf.int32)
    return tf.switch_case(index, [lambda: a - tf.reduce_max(a), lambda: a + tf.reduce_mean(a)])

def cond_in_loop(a):
    def body(i, x):
        return i + 1, tf.cond(i > 0, lambda: x + tf.reduce_mean(x), lambda: x * 2.0)
    return tf.while_loop(lambda i, x: i < 3, body, [0, a])[1]

out = {}
for name, fn in [("loop", loop), ("cond", cond), ("case", case), ("cond_in_loop", cond_in_loop)]:
    want = tf.function(fn)(tf.constant(value)).numpy()
    x = dtensor.pack(np.split(value, 4), dtensor.Layout(["x", "unsharded"], mesh))
    got = np.concatenate([t.numpy() for t in dtensor.unpack(tf.function(fn, jit_compile=True)(x))])
    out[name] = [want.tolist(), got.tolist()]
print(json.dumps(out))
"""


@pytest.mark.parametrize("lowering", ["", "copies", "ops"], ids=["default", "copies", "ops"])
def test_jit_compile_control_flow_with_collectives_inside_runs(lowering):
    # A tf.function(jit_compile=True) traces its tf.while_loop, tf.cond and tf.switch_case
    # without `_lower_using_switch_merge`; tf_dtensor's expanded op then stayed one
    # functional op on the host CPU, run by calling its body as a multi-device function, and
    # under the `ops` lowering a loop with an all-reduce in its body hung for good on its
    # first call (a cond failed with "BufRendezvous::ProvideBuf already called"). The
    # process runs under a timeout, so a hang fails instead of stopping the suite.
    import numpy as np
    program = textwrap.dedent(_CONTROL_FLOW_PROGRAM).replace("LOWERING", repr(lowering))
    result = run_python(program, env={
        "TF_CPP_MIN_LOG_LEVEL": "2", "TF_XLA_FLAGS": "--tf_xla_cpu_global_jit"}, timeout=150)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-5000:]}"
    runs = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(runs) == ["case", "cond", "cond_in_loop", "loop"]
    for name, (want, got) in runs.items():
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)


_BODIES_PROGRAM = """
import json
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 5)
from tf_dtensor import config, dtensor
config.set_collective_lowering(LOWERING)
mesh = dtensor.create_mesh([("x", 4)], devices=[f"CPU:{i}" for i in range(1, 5)])
rng = np.random.RandomState(3)
value = rng.rand(8, 16).astype(np.float32) - 0.25
w_value = rng.rand(16, 16).astype(np.float32) - 0.5

@tf.function
def layer(h, w):  # a nested function of its own, without jit_compile
    return tf.tanh(tf.matmul(h, w) * 0.5 + 1.0)

def PROGRAM(x, w):
    if "PROGRAM" == "loop":
        # The body's mean over the sharded rows is an all-reduce between the clusters.
        body = lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w) * 0.5 + tf.reduce_mean(h)))
        return tf.while_loop(lambda i, h: i < 3, body, [0, x])[1]
    if "PROGRAM" == "cond":
        return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.tanh(tf.matmul(x, w) * 0.5),
                       lambda: x - 1.0)
    return layer(x, w) * 2.0

want = tf.function(PROGRAM)(tf.constant(value), tf.constant(w_value)).numpy()
x = dtensor.pack(np.split(value, 4), dtensor.Layout(["x", "unsharded"], mesh))
w = dtensor.copy_to_mesh(tf.constant(w_value), dtensor.Layout.replicated(mesh, 2))
got = dtensor.unpack(tf.function(PROGRAM, jit_compile=True)(x, w))
print(json.dumps([want.tolist(), np.concatenate([t.numpy() for t in got]).tolist()]))
"""


@pytest.mark.parametrize("lowering, program", [("copies", "loop"), ("ops", "loop"),
                                               ("copies", "cond"), ("ops", "nested")])
def test_jit_compile_reaches_loop_bodies_branches_and_nested_functions(tmp_path, lowering,
                                                                         program):
    # TensorFlow compiles a jit_compile function whole, loops, branches and the functions
    # it calls included. The expansions of a loop's body, a branch and a nested function
    # are functions of their own, and their ops were not marked for XLA: a loop's matmuls
    # and tanhs ran unfused on every device. They now inherit the caller's jit_compile,
    # so each device compiles a cluster holding them (a body's all-reduce stays outside).
    import numpy as np
    dump = tmp_path / "dump"
    source = (textwrap.dedent(_BODIES_PROGRAM).replace("LOWERING", repr(lowering))
              .replace("PROGRAM", program))
    result = run_python(source, env={
        "TF_CPP_MIN_LOG_LEVEL": "2", "TF_XLA_FLAGS": "--tf_xla_cpu_global_jit",
        "XLA_FLAGS": f"--xla_dump_to={dump}"}, timeout=200)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-5000:]}"
    want, got = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    compiled_tanh = [f for f in os.listdir(dump) if f.endswith("before_optimizations.txt")
                     and "tanh(" in (dump / f).read_text()]
    assert len(compiled_tanh) >= 4, sorted(os.listdir(dump))


# The start of the programs below: JIT ("off", "jit_compile" or "set_jit") is set before
# it; the `ops` lowering (TF's collective ops) on a 2x2 mesh apart from the host's CPU:0.
_OPS_MESH = """
import json
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 5)
from tf_dtensor import config, dtensor
if JIT == "set_jit":
    tf.config.optimizer.set_jit("autoclustering")
config.set_collective_lowering("ops")
mesh = dtensor.create_mesh([("x", 2), ("y", 2)], devices=[f"CPU:{i}" for i in range(1, 5)])
"""

_COND_ON_A_COLLECTIVE_PROGRAM = _OPS_MESH + """
value = np.random.RandomState(1).uniform(-2, 2, [4, 1, 8])

def step(v):
    with tf.GradientTape() as tape:
        tape.watch(v)
        y = tf.cond(tf.reduce_max(v) > 0.3, lambda: tf.tanh(v) * 2.0, lambda: tf.square(v) - 1.0)
        loss = tf.reduce_sum(y)
    return y, tape.gradient(loss, v)

want = [t.numpy() for t in tf.function(step)(tf.constant(value))]
v = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(value),
                                           dtensor.Layout(["y", "unsharded", "x"], mesh)))
got = tf.function(step, jit_compile=JIT == "jit_compile")(v)
full = [dtensor.relayout(t, dtensor.Layout.replicated(mesh, 3)) for t in got]
print(json.dumps([[w.tolist(), dtensor.unpack(g)[0].numpy().tolist()] for w, g in zip(want, full)]))
"""


@pytest.mark.parametrize("jit", ["jit_compile", "set_jit"])
def test_jit_compile_of_a_cond_on_a_collective_under_tf_collective_ops_runs(jit):
    # TF's collective ops link the devices of a collective with no graph edge. XLA put a
    # device's op feeding its part of the all-reduce (the maximum) and ops after the cond,
    # whose predicate the host reads from another device's result, into one cluster: the
    # cluster waited for the predicate, the predicate for the all-reduce and the all-reduce
    # for the cluster, and the program hung (the program fuzzer, seed 50042). Ops after a
    # collective now never share a cluster with ops before it (cluster_phases.h).
    # Under auto-clustering (set_jit) TF's passes pruned the parts of the predicate's
    # all-reduce nobody reads (devices 1-3: the host reads device 0's), and device 0 waited
    # for them for good; every member of a collective is now a control output.
    import numpy as np
    program = f"JIT = {jit!r}\n" + textwrap.dedent(_COND_ON_A_COLLECTIVE_PROGRAM)
    result = run_python(program, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=120)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-5000:]}"
    for want, got in json.loads(result.stdout.strip().splitlines()[-1]):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


_LOOP_ON_A_COLLECTIVE_PROGRAM = _OPS_MESH + """
value = np.random.RandomState(1).uniform(-2, 2, [4, 8])

def step(v):
    return tf.while_loop(lambda i, v: tf.reduce_max(v) < 10.0,
                         lambda i, v: (i + 1, v * 1.5 + 0.1), [tf.constant(0), v])

want = [t.numpy() for t in tf.function(step)(tf.constant(value))]
got = tf.function(step, jit_compile=JIT == "jit_compile")(
    dtensor.copy_to_mesh(tf.constant(value), dtensor.Layout(["y", "x"], mesh)))
full = dtensor.relayout(got[1], dtensor.Layout.replicated(mesh, 2))
print(json.dumps([[int(want[0]), dtensor.unpack(got[0])[0].numpy().tolist()],
                  [want[1].tolist(), dtensor.unpack(full)[0].numpy().tolist()]]))
"""


@pytest.mark.parametrize("jit", ["off", "jit_compile", "set_jit"])
def test_a_loop_whose_condition_reads_a_collective_runs_under_tf_collective_ops(jit):
    # The host reads a loop's condition from the first device's part of an all-reduce (the
    # maximum). The condition is inlined into the loop's frame, where its control outputs
    # lead nowhere: under auto-clustering TF's passes pruned the other devices' parts, and
    # the first device waited for them for good. The host's answer now waits for every
    # collective of the condition.
    import numpy as np
    program = f"JIT = {jit!r}\n" + textwrap.dedent(_LOOP_ON_A_COLLECTIVE_PROGRAM)
    result = run_python(program, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=120)
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-5000:]}"
    (want_i, got_i), (want, got) = json.loads(result.stdout.strip().splitlines()[-1])
    assert got_i == want_i == 4
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
