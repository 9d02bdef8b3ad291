"""Tests for impala_tf.optimizers: updates against numpy, schedules, distribution."""

import textwrap

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import optimizers

import helpers



def _np_rmsprop(w, grads, lr, decay, momentum, epsilon, style='tf1'):
  """RMSProp in numpy (float64): TF1's RMSPropOptimizer (ms from 1, epsilon inside
  the root) or, with style='torch', torch.optim.RMSprop (ms from 0, outside)."""
  w = np.array(w, np.float64)
  ms = np.ones_like(w) if style == 'tf1' else np.zeros_like(w)
  mom = np.zeros_like(w)
  for g in grads:
    ms = decay * ms + (1 - decay) * g**2
    root = np.sqrt(ms + epsilon) if style == 'tf1' else np.sqrt(ms) + epsilon
    mom = momentum * mom + lr * g / root
    w = w - mom
  return w, ms, mom


def _np_adam(w, grads, lr, b1, b2, eps):
  """Kingma & Ba Adam with bias folded into the step; eps added to sqrt(v)."""
  w = np.array(w, np.float64)
  m = np.zeros_like(w)
  v = np.zeros_like(w)
  for t, g in enumerate(grads, start=1):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g**2
    lr_t = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
    w = w - lr_t * m / (np.sqrt(v) + eps)
  return w, m, v


_W0 = np.array([[0.5, -1.0, 2.0], [0.0, 0.25, -0.75]], np.float32)
_GRADS = [np.array([[0.1, -0.2, 0.3], [1.0, -2.0, 0.0]], np.float32),
          np.array([[-0.3, 0.5, 0.05], [0.2, 0.7, -1.5]], np.float32),
          np.array([[0.4, 0.0, -0.6], [-0.1, 0.3, 0.9]], np.float32)]


def test_rmsprop_one_step_matches_tf1_formula():
  w = tf.Variable(_W0)
  opt = optimizers.RMSProp(0.1, decay=0.9, momentum=0.0, epsilon=0.01)
  opt.apply_gradients([(tf.constant(_GRADS[0]), w)])
  # By hand for one entry: g = 0.1: ms = 0.9 + 0.1 * 0.01 = 0.901,
  # w = 0.5 - 0.1 * 0.1 / sqrt(0.911).
  np.testing.assert_allclose(w.numpy()[0, 0], 0.5 - 0.01 / np.sqrt(0.911), rtol=1e-6)
  expected, ms, _ = _np_rmsprop(_W0, _GRADS[:1], 0.1, 0.9, 0.0, 0.01)
  np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(opt._ms[0].numpy(), ms, rtol=1e-6)
  assert opt.iterations.numpy() == 1
  assert not hasattr(opt, '_mom')  # No momentum slot when momentum == 0.


def test_rmsprop_two_steps_with_momentum_in_tf_function():
  w = tf.Variable(_W0)
  opt = optimizers.RMSProp(0.05, decay=0.99, momentum=0.9, epsilon=0.1)
  opt.build([w])

  @tf.function
  def step(g):
    opt.apply_gradients([(g, w)])

  for g in _GRADS[:2]:
    step(tf.constant(g))
  expected, ms, mom = _np_rmsprop(_W0, _GRADS[:2], 0.05, 0.99, 0.9, 0.1)
  np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(opt._ms[0].numpy(), ms, rtol=1e-6)
  np.testing.assert_allclose(opt._mom[0].numpy(), mom, rtol=1e-5, atol=1e-8)
  assert opt.iterations.numpy() == 2


@pytest.mark.parametrize('momentum', [0.0, 0.9])
def test_rmsprop_torch_style_matches_pytorch_formula(momentum):
  w = tf.Variable(_W0)
  opt = optimizers.RMSProp(0.01, decay=0.99, momentum=momentum, epsilon=0.01,
                           style='torch')
  opt.apply_gradients([(tf.constant(_GRADS[0]), w)])
  # By hand for one entry, first step: g = 0.1: ms = 0.01 * 0.01 = 1e-4,
  # w = 0.5 - 0.01 * 0.1 / (0.01 + 0.01) = 0.45 (tf1 would give 0.5 - 0.001 /
  # sqrt(0.9901 + 0.01) = 0.499).
  np.testing.assert_allclose(w.numpy()[0, 0], 0.45, rtol=1e-5)
  for g in _GRADS[1:]:
    opt.apply_gradients([(tf.constant(g), w)])
  expected, ms, mom = _np_rmsprop(_W0, _GRADS, 0.01, 0.99, momentum, 0.01,
                                  style='torch')
  np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(opt._ms[0].numpy(), ms, rtol=1e-5, atol=1e-9)
  if momentum:
    np.testing.assert_allclose(opt._mom[0].numpy(), mom, rtol=1e-5, atol=1e-8)
  tf1, _, _ = _np_rmsprop(_W0, _GRADS, 0.01, 0.99, momentum, 0.01)
  assert np.abs(expected - tf1).max() > 0.05  # The two styles differ here.


def test_rmsprop_style_comes_from_the_config():
  cfg = config_lib.Config(optimizer='rmsprop', rmsprop_style='torch')
  opt = optimizers.make_optimizer(cfg, 0.1)
  assert opt.style == 'torch'
  assert optimizers.make_optimizer(config_lib.Config(optimizer='rmsprop'),
                                   0.1).style == 'tf1'
  with pytest.raises(ValueError, match="style='adam': must be 'tf1' or 'torch'"):
    optimizers.RMSProp(0.1, style='adam')
  with pytest.raises(config_lib.ConfigError,
                     match='rmsprop_style=keras: must be one of tf1, torch'):
    config_lib.Config(rmsprop_style='keras')


def test_adam_three_steps_matches_textbook():
  w = tf.Variable(_W0)
  b = tf.Variable([1.0, 2.0])
  opt = optimizers.Adam(0.01, beta1=0.9, beta2=0.999, epsilon=1e-3)
  for g in _GRADS:
    # b gets no gradient: it must be skipped, untouched.
    opt.apply_gradients([(tf.constant(g), w), (None, b)])
  expected, m, v = _np_adam(_W0, _GRADS, 0.01, 0.9, 0.999, 1e-3)
  np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(opt._m[0].numpy(), m, rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(opt._v[0].numpy(), v, rtol=1e-5, atol=1e-10)
  np.testing.assert_array_equal(b.numpy(), [1.0, 2.0])
  assert opt.iterations.numpy() == 3
  # First step by hand, entry [0, 0]: m = 0.01, v = 1e-5, lr_1 = 0.01 * sqrt(0.001)
  # / 0.1, step = lr_1 * 0.01 / (sqrt(1e-5) + 1e-3).
  w1 = tf.Variable(_W0)
  opt1 = optimizers.Adam(0.01, epsilon=1e-3)
  opt1.apply_gradients([(tf.constant(_GRADS[0]), w1)])
  lr1 = 0.01 * np.sqrt(0.001) / 0.1
  np.testing.assert_allclose(
      w1.numpy()[0, 0], 0.5 - lr1 * 0.01 / (np.sqrt(1e-5) + 1e-3), rtol=1e-6)


def test_callable_learning_rate_is_reread_each_step():
  w = tf.Variable([1.0])
  lr = tf.Variable(0.5)
  opt = optimizers.RMSProp(lambda: lr.read_value(), decay=0.0, epsilon=0.0)

  @tf.function
  def step():
    opt.apply_gradients([(tf.constant([2.0]), w)])

  # decay=0, eps=0: ms = g**2, so each step moves w by lr * sign(g).
  step()
  np.testing.assert_allclose(w.numpy(), [0.5], rtol=1e-6)
  lr.assign(0.25)
  step()
  np.testing.assert_allclose(w.numpy(), [0.25], rtol=1e-6)


def test_schedules():
  const = optimizers.make_schedule(0.3, 'constant', 1000)
  for pos in (0, 500, 10**9):
    np.testing.assert_allclose(const(pos).numpy(), 0.3, rtol=1e-7)
    assert const(pos).dtype == tf.float32

  linear = optimizers.make_schedule(0.6, 'linear', 1000)
  for pos, want in ((0, 0.6), (250, 0.45), (500, 0.3), (1000, 0.0), (5000, 0.0)):
    np.testing.assert_allclose(linear(tf.constant(pos, tf.int64)).numpy(), want,
                               atol=1e-7)

  points = config_lib.parse_schedule('0:1.0,100:0.5,300:0.1', 'lr_schedule')
  pw = optimizers.make_schedule(123.0, points, 1000)  # base_value is ignored.
  for pos, want in ((-5, 1.0), (0, 1.0), (50, 0.75), (100, 0.5), (200, 0.3),
                    (300, 0.1), (10**6, 0.1)):
    np.testing.assert_allclose(pw(pos).numpy(), want, atol=1e-6)

  # Works in tf.function, with the position a tensor.
  fn = tf.function(lambda p: pw(p))
  np.testing.assert_allclose(fn(tf.constant(150.0)).numpy(), 0.4, atol=1e-6)
  late = optimizers.make_schedule(1.0, ((1000.0, 2.0), (2000.0, 4.0)), 10)
  np.testing.assert_allclose(late(0).numpy(), 2.0)
  np.testing.assert_allclose(late(1500).numpy(), 3.0)
  one = optimizers.make_schedule(1.0, ((10.0, 0.7),), 10)
  np.testing.assert_allclose(one(0).numpy(), 0.7, rtol=1e-6)
  with pytest.raises(ValueError):
    optimizers.make_schedule(1.0, 'cosine', 10)


@pytest.mark.parametrize('name', ['rmsprop', 'adam'])
def test_condition_false_changes_nothing_true_applies(name):
  cfg = config_lib.Config(optimizer=name, rmsprop_momentum=0.5)
  w, ref = tf.Variable(_W0), tf.Variable(_W0)
  opt, ref_opt = (optimizers.make_optimizer(cfg, 0.1) for _ in range(2))
  opt.build([w])
  ref_opt.build([ref])

  @tf.function(autograph=False)
  def step(grad, ok):
    opt.apply_gradients([(grad, w)], condition=ok)

  step(tf.constant(_GRADS[0]), tf.constant(True))
  ref_opt.apply_gradients([(tf.constant(_GRADS[0]), ref)])
  before = [v.numpy().copy() for v in opt.variables] + [w.numpy().copy()]
  nan = np.full_like(_GRADS[1], np.nan)
  step(tf.constant(nan), tf.constant(False))  # Skipped: nothing moves.
  after = [v.numpy() for v in opt.variables] + [w.numpy()]
  for a, b in zip(before, after):
    np.testing.assert_array_equal(a, b)
  assert int(opt.iterations.numpy()) == 1
  step(tf.constant(_GRADS[1]), tf.constant(True))
  ref_opt.apply_gradients([(tf.constant(_GRADS[1]), ref)])
  np.testing.assert_allclose(w.numpy(), ref.numpy(), rtol=1e-6)
  assert int(opt.iterations.numpy()) == 2


def test_checkpoint_round_trip_restores_slots(tmp_path):
  w = tf.Variable(_W0)
  opt = optimizers.make_optimizer(
      config_lib.Config(optimizer='rmsprop', rmsprop_momentum=0.5), 0.1)
  opt.apply_gradients([(tf.constant(_GRADS[0]), w)])
  opt.apply_gradients([(tf.constant(_GRADS[1]), w)])
  path = tf.train.Checkpoint(w=w, optimizer=opt).save(str(tmp_path / 'ckpt'))

  w2 = tf.Variable(tf.zeros_like(_W0))
  opt2 = optimizers.make_optimizer(
      config_lib.Config(optimizer='rmsprop', rmsprop_momentum=0.5), 0.1)
  opt2.build([w2])
  tf.train.Checkpoint(w=w2, optimizer=opt2).restore(path).assert_consumed()
  assert opt2.iterations.numpy() == 2
  np.testing.assert_array_equal(opt2._ms[0].numpy(), opt._ms[0].numpy())
  np.testing.assert_array_equal(opt2._mom[0].numpy(), opt._mom[0].numpy())
  # The restored optimizer continues exactly like the original one.
  opt.apply_gradients([(tf.constant(_GRADS[2]), w)])
  opt2.apply_gradients([(tf.constant(_GRADS[2]), w2)])
  np.testing.assert_array_equal(w2.numpy(), w.numpy())

  wa = tf.Variable(_W0)
  adam = optimizers.make_optimizer(config_lib.Config(optimizer='adam'), 0.1)
  assert isinstance(adam, optimizers.Adam) and adam.epsilon == 1e-7
  adam.apply_gradients([(tf.constant(_GRADS[0]), wa)])
  path = tf.train.Checkpoint(optimizer=adam).save(str(tmp_path / 'adam'))
  adam2 = optimizers.Adam(0.1)
  adam2.build([tf.Variable(_W0)])
  tf.train.Checkpoint(optimizer=adam2).restore(path).assert_consumed()
  np.testing.assert_array_equal(adam2._v[0].numpy(), adam._v[0].numpy())
  assert adam2.iterations.numpy() == 1


_MIRRORED_SCRIPT = textwrap.dedent("""
    import json
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices('CPU')[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from impala_tf import optimizers

    W0 = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
    B0 = np.array([0.1, -0.3], np.float32)
    X = np.array([[1.0, 2.0], [-1.0, 0.5], [0.3, -0.7], [2.0, 1.0]], np.float32)
    STEPS = 3

    def make(kind):
      if kind == 'rmsprop':
        return optimizers.RMSProp(lambda: tf.constant(0.01), momentum=0.9)
      return optimizers.Adam(0.01)

    def loss_fn(w, b, x):
      # A sum over the batch, so per-replica sums all-reduced by SUM give the
      # full-batch gradient.
      return tf.reduce_sum(tf.tanh(x @ w + b) ** 2)

    def single(kind):
      w, b = tf.Variable(W0), tf.Variable(B0)
      opt = make(kind)
      opt.build([w, b])
      @tf.function
      def step(x):
        with tf.GradientTape() as tape:
          loss = loss_fn(w, b, x)
        grads = tape.gradient(loss, [w, b])
        opt.apply_gradients(zip(grads, [w, b]))
      for _ in range(STEPS):
        step(tf.constant(X))
      return w.numpy(), b.numpy(), int(opt.iterations.numpy())

    def mirrored(kind):
      strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
      with strategy.scope():
        w, b = tf.Variable(W0), tf.Variable(B0)
        opt = make(kind)
        opt.build([w, b])
      def replica_fn(x):
        with tf.GradientTape() as tape:
          loss = loss_fn(w, b, x)
        grads = tape.gradient(loss, [w, b])
        ctx = tf.distribute.get_replica_context()
        grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        opt.apply_gradients(zip(grads, [w, b]))
      @tf.function
      def step(dist_x):
        strategy.run(replica_fn, args=(dist_x,))
      dist = strategy.experimental_distribute_values_from_function(
          lambda ctx: tf.constant(X[ctx.replica_id_in_sync_group * 2:
                                    ctx.replica_id_in_sync_group * 2 + 2]))
      for i in range(STEPS):
        if i == STEPS - 1:  # Also eagerly, outside tf.function.
          strategy.run(replica_fn, args=(dist,))
        else:
          step(dist)
      comps = lambda v: [c.numpy().tolist() for c in strategy.experimental_local_results(v)]
      slots = [comps(s) for s in opt.variables if s.dtype == tf.float32]
      return (w.numpy(), b.numpy(), int(opt.iterations.numpy()), comps(w),
              comps(opt.iterations), slots, strategy.num_replicas_in_sync)

    out = {}
    for kind in ('rmsprop', 'adam'):
      sw, sb, sit = single(kind)
      mw, mb, mit, wcomps, itcomps, slots, n = mirrored(kind)
      out[kind] = dict(
          max_w_diff=float(np.max(np.abs(sw - mw))),
          max_b_diff=float(np.max(np.abs(sb - mb))),
          moved=float(np.max(np.abs(sw - W0))),
          single_iterations=sit, mirrored_iterations=mit,
          iteration_components=itcomps, replicas=n,
          w_components_equal=wcomps[0] == wcomps[1],
          slot_components_equal=all(s[0] == s[1] for s in slots),
          num_slots=len(slots))
    print('RESULT ' + json.dumps(out))
""")


@pytest.mark.e2e
def test_mirrored_strategy_matches_single_device(tmp_path):
  script = tmp_path / 'mirrored_check.py'
  script.write_text(_MIRRORED_SCRIPT)
  out = helpers.run_probe(script)
  for kind, r in out.items():
    assert r['replicas'] == 2, (kind, r)
    assert r['moved'] > 1e-3, (kind, r)
    assert r['max_w_diff'] < 1e-6 and r['max_b_diff'] < 1e-6, (kind, r)
    assert r['single_iterations'] == 3 and r['mirrored_iterations'] == 3, (kind, r)
    assert r['iteration_components'] == [3, 3], (kind, r)
    assert r['w_components_equal'] and r['slot_components_equal'], (kind, r)
  assert out['rmsprop']['num_slots'] == 4 and out['adam']['num_slots'] == 4
