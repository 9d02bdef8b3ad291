"""Tests for impala_tf.user_torso: the user's own torso, --network=MODULE:FUNCTION.

The torsos are in `testdata/torsos.py`; the end-to-end runs are in
`tests/user_network_test.py`.
"""

import os

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import networks
from impala_tf import numpy_policy
from impala_tf import user_torso

import network_inputs

T, B, H = 3, 2, 8

_inputs = network_inputs.random_inputs
_num_params = network_inputs.num_params
_slice = network_inputs.time_slice

_TORSOS_FILE = 'testdata/torsos.py'  # The user torsos below, `testdata.torsos:NAME`.
_CARTPOLE_SPACES = (gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2))


def _user_net(torso, use_lstm=False, spaces=_CARTPOLE_SPACES):
  assert os.path.isfile(os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), _TORSOS_FILE))
  cfg = config_lib.Config(network=f'testdata.torsos:{torso}', use_lstm=use_lstm,
                          lstm_size=H)
  return networks.make_network(cfg, *spaces)


@pytest.mark.parametrize('use_lstm', [False, True])
@pytest.mark.parametrize('torso,features', [
    ('keras_mlp', 16), ('keras_layer', 8), ('module_mlp', 8), ('identity', 4)])
def test_user_torso_gets_impala_heads_and_core(torso, features, use_lstm):
  net = _user_net(torso, use_lstm)
  assert isinstance(net.torso, user_torso.UserTorso)
  assert net.torso_name == f'testdata.torsos:{torso}'
  assert net.torso.output_size == features
  # Variables exist before any call (checkpoint restore and optimizer build).
  torso_vars = 0 if torso == 'identity' else 2
  assert len(net.torso.torso_variables) == torso_vars
  heads = (features + 1) * 3  # Policy (A=2) and baseline heads.
  if use_lstm:
    heads = (features + 3 + H) * 4 * H + 4 * H + (H + 1) * 3
  assert len(net.trainable_variables) == torso_vars + (7 if use_lstm else 4)
  assert _num_params(net) - sum(
      int(np.prod(v.shape)) for v in net.torso.torso_variables) == heads
  # unroll equals repeated step, LSTM state carried; gradients reach the torso.
  inputs = _inputs((T, B), (4,), np.float32)
  with tf.GradientTape() as tape:
    out, _ = net.unroll(inputs)
    loss = tf.reduce_sum(out.policy_logits) + tf.reduce_sum(out.baseline)
  assert out.policy_logits.shape == (T, B, 2) and out.baseline.shape == (T, B)
  grads = tape.gradient(loss, net.trainable_variables)
  assert all(g is not None for g in grads)
  state = net.initial_state(B)
  for t in range(T):
    step_out, state = net.step(_slice(inputs, t), state)
    np.testing.assert_allclose(step_out.policy_logits, out.policy_logits[t],
                               rtol=1e-5, atol=1e-6)
  assert not numpy_policy.NumpyMLPPolicy.supports(net)


def test_user_torso_variables_checkpoint_and_copy(tmp_path):
  a, b = _user_net('keras_mlp'), _user_net('keras_mlp')
  inputs = _inputs((B,), (4,), np.float32)
  for v in a.variables:
    v.assign(tf.random.stateless_normal(v.shape, [3, len(v.name)], dtype=v.dtype))
  path = tf.train.Checkpoint(network=a).save(str(tmp_path / 'ckpt'))
  tf.train.Checkpoint(network=b).restore(path).assert_existing_objects_matched()
  out_a, _ = a.step(inputs)
  out_b, _ = b.step(inputs)
  np.testing.assert_allclose(out_a.policy_logits, out_b.policy_logits, rtol=1e-6)
  # The Keras object is not tracked (only its tf.Variables are): saved keys are the
  # list of torso variables and the heads.
  keys = [k for k, _ in tf.train.list_variables(path) if k.startswith('network/')]
  assert sum('/torso/torso_variables/' in k for k in keys) == 2, keys


@pytest.mark.parametrize('spec,message', [
    ('no_such_module_xyz:torso', "cannot import module 'no_such_module_xyz'"),
    ('testdata.torsos:no_such_function', "has no function 'no_such_function'"),
    ('testdata.torsos:NOT_A_FUNCTION', 'is not callable (type int)'),
    ('testdata.torsos:returns_int', 'returned int, not a torso'),
    ('testdata.torsos:wrong_rank', 'to shape [2, 4, 1] (rank 3)'),
    ('testdata.torsos:shared', 'FUNCTION must build a new torso at each call'),
    ('testdata.torsos:raises', 'raised ValueError: cannot build this torso second '
     'line'),
])
def test_bad_user_torsos_raise_one_line_naming_network(spec, message):
  cfg = config_lib.Config(network=spec)
  with pytest.raises(config_lib.ConfigError) as e:
    networks.make_network(cfg, *_CARTPOLE_SPACES)
    networks.make_network(cfg, *_CARTPOLE_SPACES)  # `shared` fails the 2nd time.
  assert e.value.field == 'network'
  assert str(e.value).startswith(f'network={spec}: ')
  assert message in str(e.value) and '\n' not in str(e.value)


def test_resolve_torso_fn_imports_only():
  fn = user_torso.resolve_torso_fn('testdata.torsos:keras_mlp')
  assert (fn.__module__, fn.__name__) == ('testdata.torsos', 'keras_mlp')
  with pytest.raises(config_lib.ConfigError, match='network=nope:x'):
    user_torso.resolve_torso_fn('nope:x')
