"""One client of a multi-client run in which the last client dies (TFD_TEST_MODE): "exit"
leaves abruptly (os._exit) after one all-reduce, "raise" stops on an uncaught exception a
second later, while the others wait in a tf.function's all-reduce. Every other client keeps
issuing all-reduces and must fail with TensorFlow's error naming the lost task within the
coordination service's heartbeat timeout (an uncaught exception at once, naming it), not
hang. Prints `LOST <seconds> <message>` on the survivors."""

import os
import time

import numpy as np
import tensorflow as tf

from tf_dtensor import dtensor

mode = os.environ.get("TFD_TEST_MODE", "exit")

dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
me, clients = dtensor.client_id(), dtensor.num_clients()
mesh = dtensor.create_distributed_mesh([("x", 2 * clients)], device_type="CPU")
layout = dtensor.Layout(["x"], mesh)
t = dtensor.pack([np.ones([1], np.float32)] * 2, layout)
step = tf.function(tf.reduce_sum) if mode == "raise" else tf.reduce_sum
total = float(dtensor.unpack(step(t))[0].numpy())
assert total == 2 * clients, total
print("READY", me, flush=True)
if me == clients - 1:
    if mode == "raise":
        time.sleep(1)
        raise RuntimeError("a mistake in this client")
    os._exit(3)
start = time.monotonic()
try:
    for _ in range(10_000):
        dtensor.unpack(step(t))[0].numpy()
        time.sleep(0.05)
    print("NOT LOST", flush=True)
except Exception as error:  # noqa: BLE001 -- the error's class and text are what is checked
    message = " ".join(str(error).split())
    print(f"LOST {time.monotonic() - start:.1f} {type(error).__name__}: {message[:400]}", flush=True)
    os._exit(0)  # the coordination service is gone with the lost task: leave at once
