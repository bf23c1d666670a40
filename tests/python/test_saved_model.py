"""`tf.saved_model.save`/`load` of a `tf.Module` holding DVariables, as TensorFlow's DTensor
does it: the SavedModel holds each variable's global value and plain functions, and loads
(as plain variables on one device) in this process, in a fresh one with tf_dtensor, and,
when its functions hold no tf_dtensor op, in one without it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from dtensor_testing import MESH_2X2, layout_of, reassemble, run_python, to_dtensor
from tf_dtensor import dtensor

W = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
B = np.array([1.0, -2.0, 0.5], np.float32)
X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
WANT = np.maximum(X @ W + B, 0)


class Dense(tf.Module):
    """A sharded weight, a replicated bias and a replicated step counter."""

    def __init__(self, relayout_output: bool = False):
        super().__init__()
        self.w = dtensor.DVariable(to_dtensor(W, layout_of("[*,y]", MESH_2X2)))
        self.b = dtensor.DVariable(to_dtensor(B, layout_of("[*]", MESH_2X2)))
        self.step = dtensor.DVariable(to_dtensor(np.int64(0), layout_of("[]", MESH_2X2)))
        self.relayout_output = relayout_output

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def serve(self, x):
        return tf.nn.relu(tf.matmul(x, self.w) + self.b)

    @tf.function
    def call(self, x):
        self.step.assign_add(1)
        y = tf.nn.relu(tf.matmul(x, self.w) + self.b)
        if self.relayout_output:
            y = dtensor.relayout(y, layout_of("[*,*]", MESH_2X2))
        return y


def saved(tmp_path, relayout_output: bool = False) -> str:
    module = Dense(relayout_output)
    got = module.call(to_dtensor(X, layout_of("[x,*]", MESH_2X2)))
    np.testing.assert_array_equal(reassemble(got), WANT)
    path = str(tmp_path / "saved_model")
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path


def test_saved_model_holds_global_values_and_loads_as_plain_variables(tmp_path):
    path = saved(tmp_path)
    reader = tf.train.load_checkpoint(path + "/variables/variables")
    np.testing.assert_array_equal(reader.get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE"), W)
    np.testing.assert_array_equal(reader.get_tensor("b/.ATTRIBUTES/VARIABLE_VALUE"), B)
    assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 1
    loaded = tf.saved_model.load(path)
    np.testing.assert_array_equal(loaded.w.numpy(), W)
    np.testing.assert_array_equal(loaded.signatures["serving_default"](x=tf.constant(X))
                                  ["output_0"].numpy(), WANT)
    # The function traced for a DTensor takes one (and a plain tensor) after loading.
    got = loaded.call(to_dtensor(X, layout_of("[x,*]", MESH_2X2)))
    assert dtensor.fetch_layout(got) == layout_of("[x,*]", MESH_2X2)
    np.testing.assert_array_equal(reassemble(got), WANT)
    np.testing.assert_array_equal(loaded.call(tf.constant(X)).numpy(), WANT)
    assert loaded.step.numpy() == 3


def test_a_saved_model_with_a_relayout_loads_after_importing_tf_dtensor(tmp_path):
    # Our ops were registered only when the DTensor device was first made, so a fresh
    # process that imported tf_dtensor and loaded the model failed: "Op type not
    # registered 'TfDTensorRelayout'".
    path = saved(tmp_path, relayout_output=True)
    result = run_python(f"""
import numpy as np, tensorflow as tf
import tf_dtensor
loaded = tf.saved_model.load({path!r})
x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
print("serve:", loaded.serve(tf.constant(x)).numpy().tolist())
try:
    loaded.call(tf.constant(x))
except tf.errors.InvalidArgumentError as error:
    print("call:", "`relayout` ran on a regular device" in str(error))
""")
    assert f"serve: {WANT.tolist()}" in result.stdout, result.stdout + result.stderr
    assert "call: True" in result.stdout, result.stdout + result.stderr


def test_a_saved_model_without_tf_dtensor_ops_loads_in_plain_tensorflow(tmp_path):
    path = saved(tmp_path)
    result = run_python(f"""
import sys, numpy as np, tensorflow as tf
loaded = tf.saved_model.load({path!r})
x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
print("serve:", loaded.signatures["serving_default"](x=tf.constant(x))["output_0"]
      .numpy().tolist())
print("tf_dtensor imported:", "tf_dtensor" in sys.modules)
""")
    assert f"serve: {WANT.tolist()}" in result.stdout, result.stdout + result.stderr
    assert "tf_dtensor imported: False" in result.stdout
