"""Tests for impala_tf.gradients: reward clipping, the time-major gather, sums,
a shard's preparation.

`shard_gradients` itself is tested through the learner's steps
(`tests/learner_test.py`: against hand-computed updates, over replicas).
"""

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import gradients
from impala_tf import networks


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


def test_prepare_shard_makes_sequences_time_major_and_scales_pixels():
  b, t1, shape = 3, 4, (20, 20, 2)
  rng = np.random.default_rng(0)
  batch = {
      'observation': rng.integers(0, 256, (b, t1) + shape, dtype=np.uint8),
      'reward': rng.normal(size=(b, t1)).astype(np.float32),
      'terminated': rng.random((b, t1)) < 0.3,
      'truncated': rng.random((b, t1)) < 0.3,
      'first': rng.random((b, t1)) < 0.3,
      'prev_action': rng.integers(0, 5, (b, t1)).astype(np.int32),
      'action': rng.integers(0, 5, (b, t1)).astype(np.int32),
      'behaviour_logits': rng.normal(size=(b, t1, 5)).astype(np.float32),
      'reuse': np.array([0, 1, 2], np.int32),
      'policy_version': np.array([7, 8, 9], np.int64),
  }
  for dtype in ('float32', 'bfloat16'):
    net = networks.AgentNetwork(shape, np.uint8, 5, torso='shallow',
                                use_lstm=False, compute_dtype=dtype)
    out = tf.function(gradients.prepare_shard, autograph=False)(
        net, {k: tf.constant(v) for k, v in batch.items()})
    assert set(out) == set(batch)
    for key in gradients.SEQUENCE_FIELDS[1:]:
      np.testing.assert_array_equal(out[key], np.swapaxes(batch[key], 0, 1))
    for key in ('reuse', 'policy_version'):
      np.testing.assert_array_equal(out[key], batch[key])
    obs = out['observation']
    assert obs.dtype == tf.as_dtype(dtype)
    want = tf.cast(np.swapaxes(batch['observation'], 0, 1), dtype) / 255
    np.testing.assert_array_equal(tf.cast(obs, tf.float32),
                                  tf.cast(want, tf.float32))
