"""Tests for impala_tf.popart: the statistics, sigma, and the batch update.

The learner's steps with PopArt (against a hand computation, over replicas) are
in `tests/learner_test.py`; the network's baseline in return units in
`tests/networks_test.py`.
"""

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import popart as popart_lib


def test_popart_sigma_is_clipped_and_floored():
  popart = popart_lib.PopArt(5, sigma_floor=0.25)
  mu = tf.constant([2.0, 0.0, 0.0, -40.0, 1e5], tf.float64)
  nu = tf.constant([4.0, 1e20, 1.0, 1600.0 + 9.0, 1e10 + 25.0], tf.float64)
  peak = tf.constant([8.0, 0.0, 0.0, 40.0, 0.0], tf.float64)
  np.testing.assert_allclose(
      popart.sigma_of(mu, nu, peak).numpy(),
      # No spread: 0.25 * the peak 8; huge: SIGMA_MAX; 1; floor 10 > 3; float64
      # keeps the spread 5 of targets near 1e5 (no peak above it).
      [2.0, popart_lib.PopArt.SIGMA_MAX, 1.0, 10.0, 5.0], rtol=1e-6)
  # The floor follows the peak, not mu: the same spread and peak at any shift.
  for shift in (0.0, -500.0, 1e4):
    shifted = popart.sigma_of(mu + shift, nu + 2 * shift * mu + shift**2, peak)
    np.testing.assert_allclose(shifted.numpy()[[0, 2, 3]], [2.0, 1.0, 10.0],
                               rtol=1e-6)
  # Without a peak argument it reads the variable.
  popart.peak.assign([8.0, 0.0, 0.0, 40.0, 0.0])
  np.testing.assert_allclose(popart.sigma_of(mu, nu).numpy()[[0, 3]], [2.0, 10.0],
                             rtol=1e-6)
  assert popart_lib.PopArt(1).sigma_of(
      tf.constant([1e5], tf.float64),
      tf.constant([1e10 + 25.0], tf.float64)).numpy()[0] == pytest.approx(5.0)
  zero = popart_lib.PopArt(1).sigma_of(tf.constant([3.0], tf.float64),
                                     tf.constant([9.0], tf.float64))
  assert zero.numpy()[0] == popart_lib.PopArt.SIGMA_MIN


def test_batch_statistics_take_the_masked_moments_or_keep_the_old():
  popart = popart_lib.PopArt(1)
  vs = tf.constant([[1.0, 2.0], [3.0, 100.0]], tf.float32)  # [T, B]
  mask = tf.constant([[True, True], [True, False]])
  identity = lambda x: x  # One replica: nothing to sum over.
  mu, nu, updates, peak = popart_lib.batch_statistics(identity, popart, vs, mask,
                                                      beta=0.1)
  # The first update takes the batch moments outright (debiased step 1, which
  # is computed in float32).
  np.testing.assert_allclose(mu.numpy(), [2.0], rtol=1e-6)
  np.testing.assert_allclose(nu.numpy(), [(1.0 + 4.0 + 9.0) / 3], rtol=1e-6)
  assert float(updates) == 1.0
  np.testing.assert_allclose(peak.numpy(), [np.sqrt(14.0 / 3 - 4.0)], rtol=1e-5)
  # No valid step: the statistics as they were.
  none = popart_lib.batch_statistics(identity, popart, vs, tf.zeros_like(mask),
                                     beta=0.1)
  np.testing.assert_allclose([float(x[0]) if x.shape.rank else float(x)
                              for x in none], [0.0, 1.0, 0.0, 0.0])
