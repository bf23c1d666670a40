"""Imported first by the processes that TensorFlow's multi-client tests fork (through
multiprocessing's forkserver preload, see tools/tf_suite.py `_run_file`): the same set-up
as the test process, so that a client runs the backend under test (TF_SUITE_BACKEND) with
the support helpers of TF_SUITE_SUPPORT."""

import os

import tf_suite

# pylint: disable=protected-access
tf_suite._portpicker()
if os.environ.get("TF_SUITE_BACKEND") == "ours":
    tf_suite._install_ours()
tf_suite._install_support(os.environ.get("TF_SUITE_SUPPORT", ""))
