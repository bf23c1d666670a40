"""One client of a multi-client checkpoint run (TFD_TEST_PHASE): "save" writes DVariables of
several layouts on a mesh spanning the clients, twice: through `tf.train.Checkpoint` (the
guide's path) and through `sharded_save`; "restore" reads both into other layouts, on a
mesh of however many clients this run has (N clients write, M read; one client is one
process). Every restored value is checked against numpy, and client 0 checks that the
files hold the global values (`tf.train.load_checkpoint`). Prints `OK checkpoint`."""

import os

import numpy as np
import tensorflow as tf

from tf_dtensor import LayoutError, dtensor

PHASE = os.environ["TFD_TEST_PHASE"]
DIR = os.environ["TFD_TEST_DIR"]
LOCAL = int(os.environ.get("TFD_TEST_LOCAL_CPUS", "2"))
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=LOCAL)
me, n = dtensor.client_id(), LOCAL * dtensor.num_clients()
assert n == 4, n
flat = dtensor.create_distributed_mesh([("x", 4)], device_type="CPU")
grid = dtensor.create_distributed_mesh([("a", 2), ("b", 2)], device_type="CPU")
U = dtensor.UNSHARDED

VALUES = {
    "w": np.arange(64, dtype=np.float32).reshape(8, 8) / 7,
    "b": np.arange(8, dtype=np.float32) - 3,
    "e": np.arange(32, dtype=np.int64).reshape(8, 4) * 3,
    "m": np.arange(96, dtype=np.float64).reshape(8, 12) / 5,
}
# name -> (layout written, layout read)
LAYOUTS = {
    "w": (dtensor.Layout(["x", U], flat), dtensor.Layout([U, "x"], flat)),
    "b": (dtensor.Layout([U], flat), dtensor.Layout(["x"], flat)),
    "e": (dtensor.Layout([U, "x"], flat), dtensor.Layout([U, U], flat)),
    "m": (dtensor.Layout(["a", "b"], grid), dtensor.Layout(["b", "a"], grid)),
}
which = 0 if PHASE == "save" else 1


def variables(fill):
    out = {}
    for name, value in VALUES.items():
        layout = LAYOUTS[name][which]
        start = value if fill else np.zeros_like(value)
        out[name] = dtensor.DVariable(dtensor.copy_to_mesh(tf.constant(start), layout))
    return out


def check(name, variable, source):
    layout = LAYOUTS[name][1]
    assert variable.layout == layout, (name, variable.layout, layout)
    whole = dtensor.relayout(variable.read_value(),
                             dtensor.Layout.replicated(layout.mesh, layout.rank))
    for component in dtensor.unpack(whole):
        np.testing.assert_array_equal(component.numpy(), VALUES[name],
                                      err_msg=f"{name} from {source}")
        assert component.dtype == VALUES[name].dtype, (name, component.dtype)


if dtensor.num_clients() > 1:
    # Uneven blocks across clients are refused where they would be made (a client cannot
    # know the sizes of the others' blocks).
    try:
        dtensor.copy_to_mesh(tf.zeros([10, 3]), dtensor.Layout(["x", U], flat))
        raise AssertionError("an uneven layout across clients was accepted")
    except LayoutError as error:
        assert "spans several clients" in str(error) and "Pad axis 0" in str(error), error

if PHASE == "save":
    saved = variables(fill=True)
    tf.train.Checkpoint(**saved).write(os.path.join(DIR, "object"))
    names = sorted(saved)
    dtensor.sharded_save(flat, os.path.join(DIR, "named"), names, [""] * len(names),
                         [saved[k] for k in names])
    dtensor.barrier(flat, "checkpoint saved", 60_000)
else:
    restored = variables(fill=False)
    tf.train.Checkpoint(**restored).read(os.path.join(DIR, "object")).assert_consumed()
    for name, variable in restored.items():
        check(name, variable, "tf.train.Checkpoint")
    named = dtensor.name_based_restore(
        flat, os.path.join(DIR, "named"),
        {name: dtensor.copy_to_mesh(tf.zeros(v.shape, v.dtype), LAYOUTS[name][1])
         for name, v in VALUES.items() if LAYOUTS[name][1].mesh == flat})
    for name, value in named.items():
        assert dtensor.fetch_layout(value) == LAYOUTS[name][1], name
        check(name, dtensor.DVariable(value), "name_based_restore")
    dtensor.barrier(flat, "checkpoint restored", 60_000)

if me == 0:
    for prefix, key in (("object", "{}/.ATTRIBUTES/VARIABLE_VALUE"), ("named", "{}")):
        reader = tf.train.load_checkpoint(os.path.join(DIR, prefix))
        for name, value in VALUES.items():
            np.testing.assert_array_equal(reader.get_tensor(key.format(name)), value,
                                          err_msg=f"{prefix} file: {name}")
print("OK checkpoint", PHASE, me, flush=True)
