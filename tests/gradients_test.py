"""Tests for impala_tf.gradients: reward clipping, the time-major gather, sums,
the unroll that keeps the bootstrap row off the tape.

`shard_gradients` itself is tested through the learner's steps
(`tests/learner_test.py`: against hand-computed updates, over replicas).
"""

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import gradients
from impala_tf import networks
from impala_tf import types


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


@pytest.mark.parametrize('use_lstm', [False, True])
def test_unroll_with_bootstrap_matches_the_full_unroll(use_lstm):
  t_len, b, num_actions = 4, 3, 2
  net = networks.AgentNetwork((5,), tf.float32, num_actions, mlp_hidden_sizes=(8,),
                              use_lstm=use_lstm, lstm_size=4, seed=3)
  rng = np.random.default_rng(0)
  inputs = types.AgentInput(
      tf.constant(rng.normal(size=(t_len + 1, b, 5)), tf.float32),
      tf.constant(rng.integers(0, num_actions, (t_len + 1, b)), tf.int32),
      tf.constant(rng.normal(size=(t_len + 1, b)), tf.float32),
      tf.constant(rng.random((t_len + 1, b)) < 0.3))
  state = net.initial_state(b)
  weights = tf.constant(rng.normal(size=(t_len, b)), tf.float32)

  def loss(logits, values, bootstrap):
    # The bootstrap enters as V-trace's targets do: through stop_gradient.
    return (tf.reduce_sum(weights * values) + tf.reduce_sum(tf.square(logits)) +
            tf.reduce_sum(tf.stop_gradient(bootstrap) * values[-1]))

  with tf.GradientTape() as tape:
    logits, values, bootstrap = gradients.unroll_with_bootstrap(net, inputs, state,
                                                               tape)
    got = loss(logits, values, bootstrap)
  got_grads = tape.gradient(got, net.trainable_variables)
  with tf.GradientTape() as tape:
    out, _ = net.unroll(inputs, state)
    want = loss(out.policy_logits[:-1], out.baseline[:-1], out.baseline[-1])
  want_grads = tape.gradient(want, net.trainable_variables)
  assert logits.shape == (t_len, b, num_actions) and values.shape == (t_len, b)
  assert bootstrap.shape == (b,)
  np.testing.assert_allclose(logits, out.policy_logits[:-1], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(values, out.baseline[:-1], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bootstrap, out.baseline[-1], rtol=1e-5, atol=1e-6)
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
