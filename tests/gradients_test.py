"""Tests for impala_tf.gradients: reward clipping, the time-major gather, sums.

`shard_gradients` itself is tested through the learner's steps
(`tests/learner_test.py`: against hand-computed updates, over replicas).
"""

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import gradients


def test_clip_rewards_against_numpy():
  r = np.array([[-7.0, -1.5, -1.0, -0.3, 0.0], [0.2, 1.0, 1.7, 5.0, 40.0]],
               np.float32)
  clip = lambda mode: gradients.clip_rewards(tf.constant(r), mode).numpy()
  np.testing.assert_allclose(clip('abs_one'),
                             np.clip(r, -1, 1))
  squeezed = np.tanh(r / 5.0)
  expected = np.where(r < 0, 0.3 * squeezed, squeezed) * 5.0
  np.testing.assert_allclose(
      clip('soft_asymmetric'), expected, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(clip('none'), r)


@pytest.mark.parametrize('shape', [(3, 5), (3, 5, 2), (2, 4, 3, 2)])
def test_time_major_is_the_transpose(shape):
  x = tf.constant(np.arange(np.prod(shape), dtype=np.float32).reshape(shape))
  want = np.swapaxes(x.numpy(), 0, 1)
  np.testing.assert_array_equal(gradients.time_major(x).numpy(), want)
  # Unknown B and T (a user's graph): the transpose itself.
  fn = tf.function(gradients.time_major, input_signature=[
      tf.TensorSpec([None, None] + list(shape[2:]), tf.float32)])
  np.testing.assert_array_equal(fn(x).numpy(), want)


def test_term_gradients_are_summed_left_to_right():
  # In float32, (1e8 + -1e8) + 1 is 1 but 1e8 + (-1e8 + 1) is 0: the sum of the
  # three term gradients has one order, the same on every replica.
  a = tf.constant([1e8, 1.0], tf.float32)
  b = tf.constant([-1e8, 2.0], tf.float32)
  e = tf.constant([1.0, 4.0], tf.float32)
  total = tf.function(gradients.sum_in_order)([a, b, e])
  np.testing.assert_array_equal(total.numpy(), [1.0, 7.0])
