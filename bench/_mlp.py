"""The training guide's MLP step as the GPU and multi-client benchmarks time it: dense
layers over `variables` (weight, bias pairs; ReLU between), softmax cross-entropy, plain
SGD at 0.1, in one tf.function. Imported by bench/gpu.py and bench/collectives.py."""

from __future__ import annotations

from typing import List

import tensorflow as tf


def sgd_step(variables: List[tf.Variable]):
    """A tf.function `step(x, y) -> loss` that updates `variables` in place."""

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h = x
            for i in range(0, len(variables), 2):
                h = tf.matmul(h, variables[i]) + variables[i + 1]
                if i + 2 < len(variables):
                    h = tf.nn.relu(h)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h))
        for v, g in zip(variables, tape.gradient(loss, variables)):
            v.assign_sub(0.1 * g)
        return loss

    return step
