"""One client of a multi-client run in which the last client dies: it leaves abruptly
(os._exit) after one all-reduce; every other client keeps issuing all-reduces and must
fail with TensorFlow's error naming the lost task within the coordination service's
heartbeat timeout, not hang. Prints `LOST <seconds> <message>` on the survivors."""

import os
import time

import numpy as np
import tensorflow as tf

from tf_dtensor import dtensor

dtensor.initialize_accelerator_system("CPU", num_logical_cpu_devices=2)
me, clients = dtensor.client_id(), dtensor.num_clients()
mesh = dtensor.create_distributed_mesh([("x", 2 * clients)], device_type="CPU")
layout = dtensor.Layout(["x"], mesh)
t = dtensor.pack([np.ones([1], np.float32)] * 2, layout)
total = float(dtensor.unpack(tf.reduce_sum(t))[0].numpy())
assert total == 2 * clients, total
print("READY", me, flush=True)
if me == clients - 1:
    os._exit(3)
start = time.monotonic()
try:
    for _ in range(10_000):
        dtensor.unpack(tf.reduce_sum(t))[0].numpy()
        time.sleep(0.05)
    print("NOT LOST", flush=True)
except Exception as error:  # noqa: BLE001 -- the error's class and text are what is checked
    message = " ".join(str(error).split())
    print(f"LOST {time.monotonic() - start:.1f} {type(error).__name__}: {message[:400]}", flush=True)
    os._exit(0)  # the coordination service is gone with the lost task: leave at once
