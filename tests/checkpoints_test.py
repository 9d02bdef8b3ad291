"""Tests of impala_tf.checkpoints: Checkpointer round trips, keep, run directories."""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import checkpoints
from impala_tf import testing


def _state(seed=0):
  return dict(
      weights=tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3) + seed),
      counter=tf.Variable(seed, dtype=tf.int64),
      rng=tf.random.Generator.from_seed(seed))


def test_round_trip_restores_variables_and_rng_state(tmp_path):
  saved = _state(0)
  saved['counter'].assign(41)
  saved['rng'].normal([5])  # Advance the generator past its seed state.
  ckpt = checkpoints.Checkpointer(str(tmp_path), 3, **saved)
  path = ckpt.save(7)
  assert path.endswith('ckpt-7')
  assert ckpt.latest == path
  expected_next = saved['rng'].normal([4]).numpy()  # What follows the saved state.

  fresh = _state(5)
  restored = checkpoints.Checkpointer(str(tmp_path), 3, **fresh).restore_latest()
  assert restored == path
  np.testing.assert_array_equal(fresh['weights'].numpy(), saved['weights'].numpy())
  assert int(fresh['counter'].numpy()) == 41
  np.testing.assert_array_equal(fresh['rng'].normal([4]).numpy(), expected_next)


def test_keep_two_keeps_the_two_newest(tmp_path):
  state = _state()
  ckpt = checkpoints.Checkpointer(str(tmp_path), 2, **state)
  for step in (1, 2, 3, 4):
    state['counter'].assign(step)
    ckpt.save(step)
  names = sorted(f for f in os.listdir(tmp_path / 'checkpoints') if f.endswith('.index'))
  assert names == ['ckpt-3.index', 'ckpt-4.index']
  assert [os.path.basename(p) for p in ckpt.checkpoints] == ['ckpt-3', 'ckpt-4']
  fresh = _state()
  checkpoints.Checkpointer(str(tmp_path), 2, **fresh).restore_latest()
  assert int(fresh['counter'].numpy()) == 4


def test_restore_latest_of_an_empty_dir_returns_none(tmp_path):
  state = _state(3)
  assert checkpoints.Checkpointer(str(tmp_path), 3, **state).restore_latest() is None
  assert int(state['counter'].numpy()) == 3  # Untouched.
  assert checkpoints.latest_checkpoint(str(tmp_path)) is None


def test_restore_of_a_mismatched_checkpoint_fails_loudly(tmp_path):
  checkpoints.Checkpointer(str(tmp_path), 1, **_state()).save(1)
  other = dict(weights=tf.Variable(np.zeros([4], np.float32)))
  with pytest.raises(checkpoints.CheckpointMismatchError, match='cannot resume from'):
    checkpoints.Checkpointer(str(tmp_path), 1, **other).restore_latest()
  missing = dict(weights=tf.Variable(np.zeros([2, 3], np.float32)),
                 not_saved=tf.Variable(1.0))
  with pytest.raises(checkpoints.CheckpointMismatchError, match='use a new --logdir'):
    checkpoints.Checkpointer(str(tmp_path), 1, **missing).restore_latest()


def test_optional_trackables_may_be_missing(tmp_path):
  rng0 = tf.random.Generator.from_seed(0)
  rng0.normal([3])
  checkpoints.Checkpointer(str(tmp_path), 1, optional=['rng_0'], rng_0=rng0,
                           counter=tf.Variable(4, dtype=tf.int64)).save(1)
  # One more actor RNG than in the checkpoint: restored where saved, fresh where not.
  new0, new1 = tf.random.Generator.from_seed(5), tf.random.Generator.from_seed(6)
  fresh1 = new1.state.numpy().copy()
  counter = tf.Variable(0, dtype=tf.int64)
  ckpt = checkpoints.Checkpointer(str(tmp_path), 1, optional=['rng_0', 'rng_1'],
                                  rng_0=new0, rng_1=new1, counter=counter)
  assert ckpt.restore_latest()
  assert ckpt.not_restored == ['rng_1']
  np.testing.assert_array_equal(new0.state.numpy(), rng0.state.numpy())
  np.testing.assert_array_equal(new1.state.numpy(), fresh1)
  assert int(counter.numpy()) == 4
  # A missing trackable that is not optional is still an error.
  with pytest.raises(checkpoints.CheckpointMismatchError):
    checkpoints.Checkpointer(str(tmp_path), 1, optional=['rng_1'], rng_0=new0,
                             rng_1=new1, counter=counter,
                             other=tf.Variable(1.0)).restore_latest()


def test_load_config_errors_name_the_problem(tmp_path):
  with pytest.raises(checkpoints.RunDirError, match='no such directory'):
    checkpoints.load_config(str(tmp_path / 'missing'))
  with pytest.raises(checkpoints.RunDirError, match='has no config.json'):
    checkpoints.load_config(str(tmp_path))
  (tmp_path / 'config.json').write_text('{"batch_size": 0}')
  with pytest.raises(checkpoints.RunDirError, match='batch_size=0'):
    checkpoints.load_config(str(tmp_path))


def test_restore_network_round_trip(tmp_path):
  cfg = testing.tiny_config(logdir=str(tmp_path), use_lstm=True)
  (tmp_path / 'config.json').write_text(cfg.to_json())
  with pytest.raises(checkpoints.RunDirError, match='has no checkpoint'):
    checkpoints.restore_network(str(tmp_path))
  net = checkpoints.build_network(cfg)
  for v in net.variables:
    v.assign(tf.random.normal(v.shape, seed=1))
  extra = tf.Variable(3, dtype=tf.int64)  # Like the learner's counters: ignored.
  checkpoints.Checkpointer(str(tmp_path), 1, network=net, learner_steps=extra).save(3)
  loaded_cfg, loaded, path = checkpoints.restore_network(str(tmp_path))
  assert loaded_cfg == cfg
  assert path.endswith('ckpt-3')
  for a, b in zip(loaded.variables, net.variables):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_save_policy_serves_the_network(tmp_path):
  cfg = testing.tiny_config(logdir=str(tmp_path))
  net = checkpoints.build_network(cfg)
  checkpoints.save_policy(net, str(tmp_path / 'policy'))
  sig = tf.saved_model.load(str(tmp_path / 'policy')).signatures['serving_default']
  obs = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
  out = sig(observation=tf.constant(obs))
  from impala_tf import types  # pylint: disable=g-import-not-at-top
  zeros = types.AgentInput(obs, np.zeros(5, np.int32), np.zeros(5, np.float32),
                           np.zeros(5, bool))
  expected, _ = net.step(zeros, ())
  np.testing.assert_allclose(out['policy_logits'].numpy(),
                             expected.policy_logits.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out['baseline'].numpy(), expected.baseline.numpy(),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(out['greedy_action'].numpy(),
                                np.argmax(expected.policy_logits.numpy(), -1))


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
