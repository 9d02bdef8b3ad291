"""Tests of impala_tf.saved_policy: the SavedModel of a run's policy."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import checkpoints
from impala_tf import saved_policy
from impala_tf import testing
from impala_tf import types


@pytest.mark.parametrize('flags', [
    {},
    # The copy that is saved keeps the activation and the precision.
    dict(torso_activation='leaky_relu'),
    dict(torso_activation='leaky_relu', compute_dtype='bfloat16'),
])
def test_save_policy_serves_the_network(tmp_path, flags):
  cfg = testing.tiny_config(logdir=str(tmp_path), **flags)
  net = checkpoints.build_network(cfg)
  saved_policy.save_policy(net, str(tmp_path / 'policy'))
  sig = tf.saved_model.load(str(tmp_path / 'policy')).signatures['serving_default']
  obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
  out = sig(observation=tf.constant(obs))
  zeros = types.AgentInput(obs, np.zeros(5, np.int32), np.zeros(5, np.float32),
                           np.zeros(5, bool))
  expected, _ = net.step(zeros, ())
  np.testing.assert_allclose(out['policy_logits'].numpy(),
                             expected.policy_logits.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out['baseline'].numpy(), expected.baseline.numpy(),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(out['greedy_action'].numpy(),
                                np.argmax(expected.policy_logits.numpy(), -1))


def test_save_policy_replaces_a_previous_one_whole(tmp_path):
  cfg = testing.tiny_config(logdir=str(tmp_path))
  net = checkpoints.build_network(cfg)
  path = tmp_path / 'saved_policy'
  saved_policy.save_policy(net, str(path))
  (path / 'stale_file').write_text('from an older export')
  for v in net.variables:
    v.assign(tf.ones_like(v))
  saved_policy.save_policy(net, str(path))
  assert not (path / 'stale_file').exists()  # A new directory, not a merge.
  assert sorted(os.listdir(tmp_path)) == ['saved_policy']  # No temp dir left.
  sig = tf.saved_model.load(str(path)).signatures['serving_default']
  out = sig(observation=tf.constant(np.zeros((2, 3), np.float32)))
  expected, _ = net.step(types.AgentInput(
      np.zeros((2, 3), np.float32), np.zeros(2, np.int32), np.zeros(2, np.float32),
      np.zeros(2, bool)), ())
  np.testing.assert_allclose(out['policy_logits'].numpy(),
                             expected.policy_logits.numpy(), rtol=1e-5)


def test_save_policy_that_fails_leaves_the_previous_one(tmp_path, monkeypatch):
  cfg = testing.tiny_config(logdir=str(tmp_path))
  net = checkpoints.build_network(cfg)
  path = tmp_path / 'saved_policy'
  saved_policy.save_policy(net, str(path))
  before = sorted(os.listdir(path))

  def broken_save(obj, export_dir, signatures=None):
    del obj, signatures
    with open(os.path.join(export_dir, 'saved_model.pb'), 'wb') as f:
      f.write(b'half')
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(tf.saved_model, 'save', broken_save)
  with pytest.raises(OSError):
    saved_policy.save_policy(net, str(path))
  assert sorted(os.listdir(path)) == before
  assert (path / 'saved_model.pb').read_bytes() != b'half'
  assert sorted(os.listdir(tmp_path)) == ['saved_policy']


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
