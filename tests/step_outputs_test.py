"""Tests for impala_tf.step_outputs: a call's step outputs packed and folded.

The calls themselves (`CallSteps`, through `Learner.step_from_iterator`) are
tested in `tests/learner_test.py`.
"""

import tensorflow as tf

from impala_tf import step_outputs


def test_packed_fold_sums_counts_keeps_the_max_and_the_first_only_keys():
  first = {'steps': 1, 'fresh_frames': 80.0, 'policy_lag_max': 3.0, 'loss': 2.5,
           'grad_norm_policy': 7.0, 'data_wait_seconds': 0.25}
  later = {'steps': 1, 'fresh_frames': 40.0, 'policy_lag_max': 1.0, 'loss': -1.5}
  packer = step_outputs.Packed(first)
  assert packer.keys == sorted(first)
  acc = packer.pack({k: tf.constant(v) for k, v in first.items()})
  # The later step lacks two keys: packed as 0, folded as the first's.
  new = packer.pack({k: tf.constant(v) for k, v in later.items()})
  out = dict(zip(packer.keys, packer.fold(acc, new, later).numpy().tolist()))
  assert out == {'steps': 2.0, 'fresh_frames': 120.0, 'policy_lag_max': 3.0,
                 'loss': -1.5, 'grad_norm_policy': 7.0, 'data_wait_seconds': 0.25}
