"""One client of a multi-client run in which the clients run different programs
(TFD_TEST_MODE): "shapes" (the same tf.function on other input shapes), "functions"
(another tf.function), "bodies" (the same tf.function on the same inputs, whose captured
relayout target differs: an all-gather on one client, an all-to-all on the other), "missing" (the last client calls none, waits past the others'
timeout and leaves), "eager_shapes" (an eager sum to a scalar of blocks of other shapes)
or "eager" (eagerly, after a sum every client makes, the last client
takes a maximum where the others take a sum: compared by default).
Each client must get an error saying how the programs differ, or that a client did not
come, instead of hanging in a collective. Prints `MISMATCH <error class>: <message>`."""

import os
import sys
import time

import numpy as np
import tensorflow as tf

from tf_dtensor import _cluster, dtensor

mode = os.environ["TFD_TEST_MODE"]
dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
me, clients = dtensor.client_id(), dtensor.num_clients()
mesh = dtensor.create_distributed_mesh([("x", 2 * clients)], device_type="CPU")
layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
last = me == clients - 1
rows = 2 if (mode in ("shapes", "eager_shapes") and last) else 1
t = dtensor.pack([np.ones([rows, 4], np.float32)] * 2, layout)


@tf.function
def total(v):
    return tf.reduce_sum(v, axis=0)


@tf.function
def largest(v):
    return tf.reduce_max(v, axis=0)


target = dtensor.Layout([dtensor.UNSHARDED, "x"] if last else [dtensor.UNSHARDED] * 2, mesh)


@tf.function
def regathered(v):
    return dtensor.relayout(v, target)



def leave():
    # Task 0 leads the coordination service: everyone meets before leaving, so that no
    # client loses it while still reading the others' programs; then the interpreter exits
    # normally, through the coordination service's shutdown barrier (os._exit here let the
    # leader's service go while another client's barrier answer was still on its way).
    _cluster.barrier("mismatch test done", 60_000)
    sys.exit(0)


if mode == "missing" and last:
    time.sleep(10)  # past the others' 5 s wait; then leave without meeting them
    os._exit(0)
try:
    if mode == "eager_shapes":
        tf.reduce_sum(t)  # a loss: one scalar all-reduce on every client, of other blocks
    elif mode == "eager":
        np.testing.assert_allclose(dtensor.unpack(tf.reduce_sum(t, axis=0))[0].numpy(),
                                   np.full([4], 2.0 * clients))
        (tf.reduce_max if last else tf.reduce_sum)(t * 2.0, axis=0)
    elif mode == "bodies":
        regathered(t)
    else:
        (largest if (mode == "functions" and last) else total)(t)
    print("NO MISMATCH", me, flush=True)
except Exception as error:  # noqa: BLE001 -- the class and text are what is checked
    print(f"MISMATCH {type(error).__name__}: {' '.join(str(error).split())[:600]}", flush=True)
if mode == "missing":
    os._exit(0)  # the missing client never comes to a barrier either
leave()
