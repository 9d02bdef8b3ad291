"""Tests for impala_tf.networks."""

import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import layers
from impala_tf import networks
from impala_tf import numpy_policy
from impala_tf import popart as popart_lib
from impala_tf import torsos
from impala_tf import types
from impala_tf import user_torso

import network_inputs

T, B, A, H = 3, 2, 4, 8

# Tiny observation shapes per torso (shallow needs >= 20 pixels).
OBS = {
    'mlp': ((5,), np.float32),
    'shallow': ((20, 20, 3), np.uint8),
    'deep': ((12, 12, 2), np.uint8),
}


def _net(torso, use_lstm, seed=0, **kw):
  shape, dtype = OBS[torso]
  return networks.AgentNetwork(shape, dtype, A, torso=torso, mlp_hidden_sizes=(16,),
                               use_lstm=use_lstm, lstm_size=H, seed=seed, **kw)


_inputs = network_inputs.random_inputs
_num_params = network_inputs.num_params
_slice = network_inputs.time_slice


@pytest.mark.parametrize('use_lstm', [False, True])
@pytest.mark.parametrize('torso', ['mlp', 'shallow', 'deep'])
def test_output_shapes_and_dtypes(torso, use_lstm):
  net = _net(torso, use_lstm)
  shape, dtype = OBS[torso]
  assert net.num_actions == A and net.use_lstm == use_lstm
  assert net.observation_shape == shape

  state = net.initial_state(B)
  if use_lstm:
    assert len(state) == 2
    for s in state:
      assert s.shape == (B, H) and s.dtype == tf.float32
      assert not np.any(s.numpy())
  else:
    assert state == ()

  out, new_state = net.step(_inputs((B,), shape, dtype), state)
  assert out.policy_logits.shape == (B, A) and out.policy_logits.dtype == tf.float32
  assert out.baseline.shape == (B,) and out.baseline.dtype == tf.float32
  assert len(new_state) == len(state)

  out, final = net.unroll(_inputs((T, B), shape, dtype), state)
  assert out.policy_logits.shape == (T, B, A) and out.policy_logits.dtype == tf.float32
  assert out.baseline.shape == (T, B) and out.baseline.dtype == tf.float32
  for s in final:
    assert s.shape == (B, H) and s.dtype == tf.float32


def test_param_count_mlp():
  net = networks.AgentNetwork((4,), np.float32, 2, torso='mlp',
                              mlp_hidden_sizes=(64, 64), seed=0)
  hand = ((4 * 64 + 64)      # hidden 1
          + (64 * 64 + 64)   # hidden 2
          + (64 * 2 + 2)     # policy logits
          + (64 * 1 + 1))    # baseline
  assert hand == 4675
  assert _num_params(net) == hand


def test_param_count_shallow_and_lstm():
  net = networks.AgentNetwork((84, 84, 4), np.uint8, 6, torso='shallow', seed=0)
  # conv1 8x8/4 VALID: (84 - 8) // 4 + 1 = 20; conv2 4x4/2 VALID: (20 - 4) // 2 + 1 = 9.
  conv1 = 8 * 8 * 4 * 16 + 16        # 4112
  conv2 = 4 * 4 * 16 * 32 + 32       # 8224
  fc = (9 * 9 * 32) * 256 + 256      # 663808
  heads = (256 * 6 + 6) + (256 + 1)  # 1542 + 257
  assert net.torso.flat_size == 9 * 9 * 32
  assert _num_params(net.torso) == conv1 + conv2 + fc == 676144
  assert _num_params(net) == conv1 + conv2 + fc + heads == 677943

  lstm_net = networks.AgentNetwork((84, 84, 4), np.uint8, 6, torso='shallow',
                                   use_lstm=True, lstm_size=256, seed=0)
  lstm_in = 256 + 6 + 1  # torso output, one-hot previous action, clipped reward
  lstm = (lstm_in + 256) * 4 * 256 + 4 * 256
  assert lstm == 532480
  assert _num_params(lstm_net.core) == lstm
  assert _num_params(lstm_net) == 677943 + lstm == 1210423


def test_param_count_deep():
  net = networks.AgentNetwork((84, 84, 4), np.uint8, 6, torso='deep',
                              use_lstm=True, lstm_size=256, seed=0)

  def conv(cin, cout):
    return 3 * 3 * cin * cout + cout

  # Each section: conv, then 2 residual blocks of 2 convs (channels -> channels).
  section1 = conv(4, 16) + 4 * conv(16, 16)    # 592 + 4 * 2320 = 9872
  section2 = conv(16, 32) + 4 * conv(32, 32)   # 4640 + 4 * 9248 = 41632
  section3 = conv(32, 32) + 4 * conv(32, 32)   # 9248 + 4 * 9248 = 46240
  # Max-pools 3x3/2 SAME: 84 -> 42 -> 21 -> 11.
  fc = (11 * 11 * 32) * 256 + 256              # 991488
  torso = section1 + section2 + section3 + fc
  assert (section1, section2, section3) == (9872, 41632, 46240)
  assert net.torso.flat_size == 11 * 11 * 32
  assert _num_params(net.torso) == torso == 1089232
  lstm = (256 + 6 + 1 + 256) * 1024 + 1024
  heads = (256 * 6 + 6) + (256 + 1)
  assert _num_params(net) == torso + lstm + heads == 1623511
  no_lstm = networks.AgentNetwork((84, 84, 4), np.uint8, 6, torso='deep', seed=0)
  assert _num_params(no_lstm) == torso + heads == 1091031


@pytest.mark.parametrize('torso', ['mlp', 'deep'])
def test_unroll_equals_repeated_step(torso):
  net = _net(torso, use_lstm=True)
  shape, dtype = OBS[torso]
  inputs = _inputs((T, B), shape, dtype, first=[[True, False], [False, True],
                                                [False, False]])
  rng = np.random.default_rng(1)
  state0 = tuple(tf.constant(rng.normal(size=(B, H)), tf.float32) for _ in range(2))
  out, final = net.unroll(inputs, state0)
  state = state0
  for t in range(T):
    step_out, state = net.step(_slice(inputs, t), state)
    np.testing.assert_allclose(out.policy_logits[t], step_out.policy_logits,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.baseline[t], step_out.baseline, rtol=1e-5,
                               atol=1e-5)
  for a, b in zip(final, state):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

  plain = _net(torso, use_lstm=False)
  out, final = plain.unroll(inputs, ())
  assert final == ()
  for t in range(T):
    step_out, _ = plain.step(_slice(inputs, t), ())
    np.testing.assert_allclose(out.policy_logits[t], step_out.policy_logits,
                               rtol=1e-5, atol=1e-5)


def test_lstm_state_reset_and_carry():
  net = _net('mlp', use_lstm=True)
  shape, dtype = OBS['mlp']
  rng = np.random.default_rng(2)
  state0 = tuple(tf.constant(rng.normal(size=(B, H)) * 3, tf.float32)
                 for _ in range(2))
  zeros = net.initial_state(B)
  step_in = _inputs((B,), shape, dtype, first=[True, False])
  out, new_state = net.step(step_in, state0)
  out_zero, state_zero = net.step(step_in, zeros)
  # Batch entry 0 starts an episode: the incoming state is ignored.
  np.testing.assert_allclose(out.policy_logits[0], out_zero.policy_logits[0],
                             atol=1e-6)
  np.testing.assert_allclose(new_state[1][0], state_zero[1][0], atol=1e-6)
  # Batch entry 1 continues: the incoming state matters.
  assert not np.allclose(new_state[1][1], state_zero[1][1], atol=1e-3)

  # In an unroll, a reset at step 2 makes steps 2.. independent of steps 0, 1.
  first = np.array([[False, False], [False, False], [True, False]])
  a = _inputs((T, B), shape, dtype, seed=3, first=first)
  b = _inputs((T, B), shape, dtype, seed=4, first=first)
  b = b._replace(**{k: np.concatenate([getattr(b, k)[:2], getattr(a, k)[2:]])
                    for k in ('observation', 'prev_action', 'reward')})
  out_a, fin_a = net.unroll(a, state0)
  out_b, fin_b = net.unroll(b, zeros)
  np.testing.assert_allclose(out_a.policy_logits[2, 0], out_b.policy_logits[2, 0],
                             atol=1e-6)
  np.testing.assert_allclose(fin_a[0][0], fin_b[0][0], atol=1e-6)
  assert not np.allclose(out_a.policy_logits[2, 1], out_b.policy_logits[2, 1],
                         atol=1e-4)
  # The state carries over between unrolls: two halves equal the whole.
  out_1, mid = net.unroll(_slice(a, slice(0, 1)), state0)
  out_2, fin = net.unroll(_slice(a, slice(1, T)), mid)
  np.testing.assert_allclose(
      np.concatenate([out_1.baseline, out_2.baseline]), out_a.baseline, atol=1e-5)
  np.testing.assert_allclose(fin[1], fin_a[1], atol=1e-5)


def test_lstm_input_uses_prev_action_and_clipped_reward():
  net = _net('mlp', use_lstm=True)
  shape, dtype = OBS['mlp']
  x = _inputs((B,), shape, dtype, first=[True, True])
  base, _ = net.step(x._replace(reward=np.array([1.0, -1.0], np.float32)))
  clipped, _ = net.step(x._replace(reward=np.array([7.0, -3.0], np.float32)))
  np.testing.assert_allclose(base.policy_logits, clipped.policy_logits, atol=1e-6)
  other, _ = net.step(x._replace(prev_action=(x.prev_action + 1) % A))
  assert not np.allclose(base.baseline, other.baseline, atol=1e-6)


def test_uint8_equals_float_over_255():
  net = _net('deep', use_lstm=False)
  shape, _ = OBS['deep']
  x = _inputs((T, B), shape, np.uint8)
  out_u8, _ = net.unroll(x, ())
  out_f, _ = net.unroll(x._replace(observation=x.observation.astype(np.float32) / 255),
                        ())
  np.testing.assert_allclose(out_u8.policy_logits, out_f.policy_logits, atol=1e-6)
  np.testing.assert_allclose(out_u8.baseline, out_f.baseline, atol=1e-6)


@pytest.mark.parametrize('compute_dtype', ['float32', 'bfloat16'])
def test_scaled_observations_give_the_same_outputs(compute_dtype):
  # The learner scales a batch's pixels once and unrolls on them for each reuse.
  net = _net('shallow', use_lstm=True, compute_dtype=compute_dtype)
  shape, _ = OBS['shallow']
  x = _inputs((T, B), shape, np.uint8)
  scaled = net.scale_observation(x.observation)
  assert scaled.dtype == tf.as_dtype(compute_dtype)
  np.testing.assert_array_equal(
      tf.cast(scaled, tf.float32),
      tf.cast(tf.cast(x.observation, compute_dtype) / 255, tf.float32))
  # Already in the compute dtype: unchanged (not divided again).
  again = net.scale_observation(scaled)
  np.testing.assert_array_equal(tf.cast(again, tf.float32),
                                tf.cast(scaled, tf.float32))
  out_raw, final_raw = net.unroll(x, net.initial_state(B))
  out_scaled, final_scaled = net.unroll(x._replace(observation=scaled),
                                        net.initial_state(B))
  for a, b in zip(tf.nest.flatten((out_raw, final_raw)),
                  tf.nest.flatten((out_scaled, final_scaled))):
    np.testing.assert_array_equal(a, b)
  # Non-uint8 observations are only cast.
  floats = np.array([[0.5, 300.0]], np.float64)
  np.testing.assert_array_equal(_net('mlp', False).scale_observation(floats),
                                floats.astype(np.float32))


def test_variables_exist_after_construction_and_checkpoint_restore(tmp_path):
  net = _net('shallow', use_lstm=True, seed=1)
  assert _num_params(net) > 0
  assert len(net.trainable_variables) == 2 * 3 + 3 + 2 * 2  # convs+fc, lstm, heads
  path = tf.train.Checkpoint(network=net).save(str(tmp_path / 'ckpt'))
  # A fresh network (other seed) restored before any call computes the same thing.
  other = _net('shallow', use_lstm=True, seed=2)
  tf.train.Checkpoint(network=other).restore(path).assert_consumed()
  shape, dtype = OBS['shallow']
  x = _inputs((T, B), shape, dtype)
  np.testing.assert_allclose(net.unroll(x)[0].baseline, other.unroll(x)[0].baseline,
                             atol=1e-6)


def test_variables_created_under_strategy_scope():
  strategy = tf.distribute.MirroredStrategy(['/cpu:0'])
  with strategy.scope():
    net = _net('mlp', use_lstm=True)
  assert all(isinstance(v, tf.distribute.DistributedValues)
             for v in net.trainable_variables)
  shape, dtype = OBS['mlp']
  x = _inputs((T, B), shape, dtype)
  out = strategy.run(tf.function(lambda: net.unroll(x)[0].baseline))
  assert out.shape == (T, B)


def test_seed_determinism():
  a, b, c = _net('mlp', True, seed=5), _net('mlp', True, seed=5), _net('mlp', True,
                                                                       seed=6)
  for va, vb in zip(a.trainable_variables, b.trainable_variables):
    np.testing.assert_array_equal(va, vb)
  assert not np.array_equal(a.torso.layers[0].w, c.torso.layers[0].w)


@pytest.mark.parametrize('torso', ['mlp', 'shallow', 'deep'])
def test_orthogonal_weight_init_gains(torso):
  """sqrt(2) in the torso, 0.01 for the logits, 1 for the baseline (CleanRL's)."""
  net = _net(torso, False, weight_init='orthogonal')

  def unit_norms(w):
    """Norms of the orthogonal vectors: columns of [fan_in, out], or its rows."""
    w = w.numpy()
    m = w.reshape(-1, w.shape[-1])
    return np.linalg.norm(m, axis=0 if m.shape[0] >= m.shape[1] else 1)

  kernels = [v for v in net.torso.trainable_variables if v.name.endswith('w:0')]
  assert len(kernels) == {'mlp': 1, 'shallow': 3, 'deep': 16}[torso]
  for w in kernels:
    np.testing.assert_allclose(unit_norms(w), np.sqrt(2.0), rtol=1e-4)
  np.testing.assert_allclose(unit_norms(net.policy_head.w), 0.01, rtol=1e-4)
  np.testing.assert_allclose(unit_norms(net.baseline_head.w), 1.0, rtol=1e-4)
  # Glorot is the default: the same seed gives the same weights.
  glorot, default = _net(torso, False, weight_init='glorot'), _net(torso, False)
  for va, vb in zip(glorot.trainable_variables, default.trainable_variables):
    np.testing.assert_array_equal(va, vb)
  assert not np.array_equal(glorot.policy_head.w, net.policy_head.w)
  with pytest.raises(ValueError, match="weight_init='he': must be one of"):
    _net(torso, False, weight_init='he')


def test_inside_tf_function_static_and_dynamic_time(monkeypatch):
  net = _net('mlp', use_lstm=True)
  shape, dtype = OBS['mlp']
  x = _inputs((T, B), shape, dtype)
  state = net.initial_state(B)
  eager, eager_final = net.unroll(x, state)

  static = tf.function(net.unroll)
  out, _ = static(x, state)
  np.testing.assert_allclose(out.policy_logits, eager.policy_logits, atol=1e-5)

  spec = types.AgentInput(
      tf.TensorSpec([None, None, *shape], tf.float32),
      tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.float32),
      tf.TensorSpec([None, None], tf.bool))
  state_spec = (tf.TensorSpec([None, H], tf.float32),) * 2
  dynamic = tf.function(net.unroll, input_signature=[spec, state_spec])  # tf.scan
  out, final = dynamic(x, state)
  np.testing.assert_allclose(out.policy_logits, eager.policy_logits, atol=1e-5)
  np.testing.assert_allclose(final[0], eager_final[0], atol=1e-5)

  # The scan path also runs eagerly when forced.
  monkeypatch.setattr(networks, 'MAX_STATIC_UNROLL', 0)
  out, _ = net.unroll(x, state)
  np.testing.assert_allclose(out.baseline, eager.baseline, atol=1e-5)


@pytest.mark.parametrize('torso', ['mlp', 'shallow', 'deep'])
def test_gradients_reach_every_variable(torso):
  net = _net(torso, use_lstm=True)
  shape, dtype = OBS[torso]
  x = _inputs((T, B), shape, dtype)

  @tf.function
  def grads():
    with tf.GradientTape() as tape:
      out, _ = net.unroll(x, net.initial_state(B))
      loss = tf.reduce_sum(out.policy_logits**2) + tf.reduce_sum(out.baseline**2)
    return tape.gradient(loss, net.trainable_variables)

  for g, v in zip(grads(), net.trainable_variables):
    assert g is not None, v.name
    assert g.shape == v.shape


def test_saved_model_of_step(tmp_path):
  net = networks.AgentNetwork((4,), np.float32, 2, torso='mlp',
                              mlp_hidden_sizes=(8,), seed=0)

  class Policy(tf.Module):

    def __init__(self, network):
      super().__init__()
      self.network = network

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def __call__(self, observation):
      batch = tf.shape(observation)[0]
      out, _ = self.network.step(types.AgentInput(
          observation, tf.zeros([batch], tf.int32), tf.zeros([batch]),
          tf.zeros([batch], tf.bool)), ())
      return tf.argmax(out.policy_logits, axis=-1, output_type=tf.int32)

  policy = Policy(net)
  obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
  tf.saved_model.save(policy, str(tmp_path / 'policy'))
  loaded = tf.saved_model.load(str(tmp_path / 'policy'))
  np.testing.assert_array_equal(loaded(obs), policy(obs))


def test_wrong_observation_shape_raises():
  net = _net('mlp', use_lstm=False)
  with pytest.raises(ValueError, match='observation shape'):
    net.step(_inputs((B,), (6,), np.float32), ())


def test_shallow_too_small_raises():
  with pytest.raises(ValueError, match='network=shallow'):
    networks.AgentNetwork((10, 10, 1), np.uint8, A, torso='shallow')


def test_make_network_auto_and_errors():
  cfg = config_lib.Config(network='auto', mlp_hidden_sizes=(8,), use_lstm=True,
                          lstm_size=H)
  vec = gym.spaces.Box(-1, 1, (4,), np.float32)
  img = gym.spaces.Box(0, 255, (20, 20, 3), np.uint8)
  net = networks.make_network(cfg, vec, gym.spaces.Discrete(3))
  assert (net.torso_name, net.num_actions, net.use_lstm) == ('mlp', 3, True)
  assert net.observation_shape == (4,) and net.observation_dtype == tf.float32
  net = networks.make_network(cfg.replace(use_lstm=False), img,
                              gym.spaces.Discrete(5))
  assert net.torso_name == 'deep' and net.observation_dtype == tf.uint8
  net = networks.make_network(cfg.replace(network='shallow'), img,
                              gym.spaces.Discrete(5))
  assert net.torso_name == 'shallow' and net.compute_dtype == tf.float32
  net = networks.make_network(cfg.replace(network='shallow', compute_dtype='bfloat16'),
                              img, gym.spaces.Discrete(5))
  assert net.compute_dtype == tf.bfloat16
  # mlp on images flattens them.
  net = networks.make_network(cfg.replace(network='mlp'), img, gym.spaces.Discrete(5))
  assert net.torso.input_size == 20 * 20 * 3

  for name in ('shallow', 'deep'):
    with pytest.raises(ValueError, match=f'network={name}'):
      networks.make_network(cfg.replace(network=name), vec, gym.spaces.Discrete(2))
  with pytest.raises(ValueError, match='Box'):
    networks.make_network(cfg, vec, gym.spaces.Box(-1, 1, (2,)))
  with pytest.raises(ValueError, match='MultiDiscrete'):
    networks.make_network(cfg, vec, gym.spaces.MultiDiscrete([2, 2]))
  with pytest.raises(ValueError, match='start'):
    networks.make_network(cfg, vec, gym.spaces.Discrete(3, start=1))
  with pytest.raises(ValueError, match='observation space'):
    networks.make_network(cfg, gym.spaces.Discrete(16), gym.spaces.Discrete(4))


@pytest.mark.e2e
@pytest.mark.parametrize('legacy_keras', ['0', '1'])
def test_works_without_keras(legacy_keras):
  """Runs with Keras 3 and with TF_USE_LEGACY_KERAS=1, importing no Keras itself.

  `import tensorflow` may load Keras on its own; the network must add nothing.
  """
  code = ('import sys, numpy as np, tensorflow\n'
          'def keras_mods():\n'
          '  return {m for m in sys.modules if m.split(".")[0] in ("keras", "tf_keras")}\n'
          'before = keras_mods()\n'
          'from impala_tf import networks\n'
          'n = networks.AgentNetwork((3,), np.float32, 2, use_lstm=True, lstm_size=4)\n'
          'out, _ = n.unroll(networks.types.AgentInput(np.zeros((2, 1, 3), np.float32), '
          'np.zeros((2, 1), np.int32), np.zeros((2, 1), np.float32), '
          'np.zeros((2, 1), bool)))\n'
          'assert out.policy_logits.shape == (2, 1, 2)\n'
          'new = sorted(keras_mods() - before)\n'
          'assert not new, new\n')
  env = dict(os.environ, TF_USE_LEGACY_KERAS=legacy_keras, TF_CPP_MIN_LOG_LEVEL='3')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  result = subprocess.run([sys.executable, '-c', code], env=env, cwd=root,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]


# --- PopArt and the separate value torso --------------------------------------


def test_popart_baseline_is_in_return_units_and_preserve_keeps_it(tmp_path):
  net = _net('mlp', False, popart=True)
  inputs = _inputs((4, 3), *OBS['mlp'])
  head = net.baseline_head.w.numpy()[:, 0]  # Normalised: no statistics yet.
  normalised = net.unroll(inputs)[0].baseline.numpy()
  net.popart.mu.assign([7.0])
  net.popart.nu.assign([7.0**2 + 3.0**2])  # sigma = 3.
  np.testing.assert_allclose(float(net.popart.sigma[0]), 3.0, rtol=1e-6)
  values = net.unroll(inputs)[0].baseline.numpy()
  np.testing.assert_allclose(values, 3.0 * normalised + 7.0, rtol=1e-5, atol=1e-5)
  # New statistics with the head rescaled: every output in return units is kept.
  popart = net.popart
  w, b = popart.preserve(net.baseline_head.w, net.baseline_head.b, popart.mu,
                         popart.sigma, tf.constant([-20.0]), tf.constant([50.0]))
  net.baseline_head.w.assign(w)
  net.baseline_head.b.assign(b)
  popart.mu.assign([-20.0])
  popart.nu.assign([(-20.0)**2 + 50.0**2])
  np.testing.assert_allclose(net.unroll(inputs)[0].baseline.numpy(), values,
                             rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(net.baseline_head.w.numpy()[:, 0], head * 3 / 50,
                             rtol=1e-6)
  # The statistics are checkpointed with the network.
  path = tf.train.Checkpoint(net=net).save(str(tmp_path / 'ckpt'))
  other = _net('mlp', False, popart=True, seed=5)
  tf.train.Checkpoint(net=other).restore(path).assert_consumed()
  np.testing.assert_allclose(other.popart.mu.numpy(), [-20.0])
  np.testing.assert_allclose(other.unroll(inputs)[0].baseline.numpy(), values,
                             rtol=1e-5, atol=1e-4)


def test_separate_value_torso():
  shared = _net('mlp', False)
  net = _net('mlp', False, shared_torso=False)
  assert shared.value_torso is None and net.value_torso is not None
  # One more MLP of the same widths.
  assert _num_params(net) == _num_params(shared) + _num_params(net.value_torso)
  inputs = _inputs((4, 3), *OBS['mlp'])
  with tf.GradientTape(persistent=True) as tape:
    out, _ = net.unroll(inputs)
    value = tf.reduce_sum(out.baseline)
    policy = tf.reduce_sum(out.policy_logits)
  torso = {v.ref() for v in net.torso.trainable_variables}
  value_torso = {v.ref() for v in net.value_torso.trainable_variables}
  for v, g in zip(net.trainable_variables,
                  tape.gradient(value, net.trainable_variables)):
    assert (g is None) == (v.ref() in torso or v is net.policy_head.w or
                           v is net.policy_head.b), v.name
  for v, g in zip(net.trainable_variables,
                  tape.gradient(policy, net.trainable_variables)):
    assert (g is None) == (v.ref() in value_torso or v is net.baseline_head.w or
                           v is net.baseline_head.b), v.name
  # The actors' numpy policy ignores the value torso.
  policy_np = numpy_policy.NumpyMLPPolicy(net)
  policy_np.set_weights([v.numpy() for v in net.variables])
  step, _ = net.step(_slice(inputs, 0))
  np.testing.assert_allclose(policy_np(_slice(inputs, 0).observation),
                             step.policy_logits.numpy(), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match='shared_torso=False'):
    _net('deep', False, shared_torso=False)


def test_saved_policy_baseline_is_in_return_units(tmp_path):
  from impala_tf import saved_policy  # pylint: disable=g-import-not-at-top
  net = networks.AgentNetwork((4,), tf.float32, 2, mlp_hidden_sizes=(8,), seed=1,
                              popart=True, shared_torso=False)
  net.popart.mu.assign([40.0])
  net.popart.nu.assign([40.0**2 + 12.0**2])
  obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
  want, _ = net.step(types.AgentInput(obs, np.zeros(5, np.int32),
                                      np.zeros(5, np.float32), np.zeros(5, bool)))
  saved_policy.save_policy(net, str(tmp_path / 'policy'))
  model = tf.saved_model.load(str(tmp_path / 'policy'))
  got = model.signatures['serving_default'](observation=tf.constant(obs))
  np.testing.assert_allclose(got['baseline'].numpy(), want.baseline.numpy(),
                             rtol=1e-5)
  assert np.abs(want.baseline.numpy() - 40.0).max() < 40  # Near mu, not near 0.


def test_documented_parts_are_importable_from_networks():
  assert (networks.Linear, networks.Conv2D, networks.LSTMCell) == (
      layers.Linear, layers.Conv2D, layers.LSTMCell)
  assert (networks.MLP, networks.ShallowTorso, networks.DeepTorso) == (
      torsos.MLP, torsos.ShallowTorso, torsos.DeepTorso)
  assert (networks.UserTorso, networks.resolve_torso_fn) == (
      user_torso.UserTorso, user_torso.resolve_torso_fn)
  assert networks.PopArt is popart_lib.PopArt
  assert networks.NumpyMLPPolicy is numpy_policy.NumpyMLPPolicy


@pytest.mark.parametrize('torso', ['mlp', 'shallow', 'deep'])
def test_torso_activation_reaches_the_torsos_and_changes_only_the_function(torso):
  relu = _net(torso, False)
  leaky = _net(torso, False, torso_activation='leaky_relu')
  assert relu.torso.activation == 'relu' and leaky.torso.activation == 'leaky_relu'
  if torso == 'mlp':
    split = _net(torso, False, torso_activation='leaky_relu', shared_torso=False)
    assert split.value_torso.activation == 'leaky_relu'
  # Same seed, same variables: only the nonlinearity differs.
  for va, vb in zip(relu.trainable_variables, leaky.trainable_variables):
    np.testing.assert_array_equal(va, vb)
  shape, dtype = OBS[torso]
  inputs = _inputs((B,), shape, dtype)
  out_relu, _ = relu.step(inputs, ())
  out_leaky, _ = leaky.step(inputs, ())
  assert not np.allclose(out_relu.baseline, out_leaky.baseline)
  with pytest.raises(ValueError, match="torso_activation='tanh': must be one of"):
    _net(torso, False, torso_activation='tanh')


def _op_dtypes(net, inputs, op_type):
  """The dtypes (attr T) of the `op_type` ops in the graph of `net.step`."""
  fn = tf.function(lambda x: net.step(x, net.initial_state(B)))
  graph = fn.get_concrete_function(inputs).graph
  return {op.get_attr('T') for op in graph.get_operations() if op.type == op_type}


@pytest.mark.parametrize('use_lstm', [False, True])
@pytest.mark.parametrize('torso', ['mlp', 'shallow', 'deep'])
def test_bfloat16_torso_computes_in_bfloat16_and_returns_float32(torso, use_lstm):
  kw = dict(shared_torso=False) if torso == 'mlp' and not use_lstm else {}
  full = _net(torso, use_lstm, seed=4, **kw)
  half = _net(torso, use_lstm, seed=4, compute_dtype='bfloat16', **kw)
  assert full.compute_dtype == tf.float32 and half.compute_dtype == tf.bfloat16
  # The same float32 variables: only the arithmetic differs.
  for va, vb in zip(full.variables, half.variables):
    assert va.dtype == vb.dtype == tf.float32
    np.testing.assert_array_equal(va, vb)
  shape, dtype = OBS[torso]
  step_inputs = _inputs((B,), shape, dtype)
  layer_op = 'MatMul' if torso == 'mlp' else 'Conv2D'
  assert _op_dtypes(full, step_inputs, layer_op) == {tf.float32}
  assert tf.bfloat16 in _op_dtypes(half, step_inputs, layer_op)
  # The heads (and the LSTM core) stay float32.
  assert tf.float32 in _op_dtypes(half, step_inputs, 'MatMul')

  inputs = _inputs((T, B), shape, dtype)

  def run(net):
    with tf.GradientTape() as tape:
      out, final = net.unroll(inputs, net.initial_state(B))
      loss = tf.reduce_sum(out.policy_logits**2) + tf.reduce_sum(out.baseline**2)
    return out, final, tape.gradient(loss, net.trainable_variables)

  (out_f, _, grads_f), (out_h, final_h, grads_h) = run(full), run(half)
  assert out_h.policy_logits.dtype == out_h.baseline.dtype == tf.float32
  assert all(s.dtype == tf.float32 for s in final_h)
  for a, b in ((out_f.policy_logits, out_h.policy_logits),
               (out_f.baseline, out_h.baseline)):
    scale = np.abs(a.numpy()).max()
    np.testing.assert_allclose(b, a, rtol=0.05, atol=0.02 * scale)
    assert not np.array_equal(a.numpy(), b.numpy())
  # Every gradient is float32 and points where the float32 one does.
  flat = lambda gs: np.concatenate([g.numpy().ravel() for g in gs])
  assert all(g.dtype == tf.float32 for g in grads_h)
  gf, gh = flat(grads_f), flat(grads_h)
  assert gf @ gh / (np.linalg.norm(gf) * np.linalg.norm(gh)) > 0.99


def test_compute_dtype_errors_name_the_argument():
  with pytest.raises(ValueError, match="compute_dtype='float16': must be one of "
                     'float32, bfloat16'):
    _net('mlp', False, compute_dtype='float16')
  with pytest.raises(ValueError, match="compute_dtype='bfloat16': a user torso"):
    networks.AgentNetwork((5,), np.float32, A, torso='my_module:my_torso',
                          spaces=(None, None), compute_dtype='bfloat16')
