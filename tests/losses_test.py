"""Tests for impala_tf.losses against numpy hand computations."""

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import losses

import loss_inputs

T, B, A = 5, 4, 3


def _np_log_softmax(logits):
  z = logits - logits.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _np_vtrace(log_rhos, discounts, rewards, values, bootstrap, clip_rho, clip_pg,
               lam):
  """V-trace (paper eq. 1 and Remark 1) by backward recursion, in float64."""
  rhos = np.exp(log_rhos)
  crhos = rhos if clip_rho is None else np.minimum(clip_rho, rhos)
  pg_rhos = rhos if clip_pg is None else np.minimum(clip_pg, rhos)
  cs = lam * np.minimum(1.0, rhos)
  values_tp1 = np.concatenate([values[1:], bootstrap[None]], 0)
  deltas = crhos * (rewards + discounts * values_tp1 - values)
  acc = np.zeros_like(bootstrap)
  vs_minus_v = np.zeros_like(values)
  for t in reversed(range(len(values))):
    acc = deltas[t] + discounts[t] * cs[t] * acc
    vs_minus_v[t] = acc
  vs = vs_minus_v + values
  vs_tp1 = np.concatenate([vs[1:], bootstrap[None]], 0)
  return vs, pg_rhos * (rewards + discounts * vs_tp1 - values)


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  mask = np.ones([T, B], bool)
  mask[2, 0] = False  # E.g. truncated episode end at step 2 of env 0.
  mask[0, 3] = False
  mask[4, 1] = False
  discounts = np.full([T, B], 0.9, np.float32)
  discounts[1, 2] = 0.0  # A terminated episode.
  return dict(
      target_logits=rng.normal(size=[T, B, A]).astype(np.float32),
      values=rng.normal(size=[T, B]).astype(np.float32),
      bootstrap_value=rng.normal(size=[B]).astype(np.float32),
      actions=rng.integers(0, A, size=[T, B]).astype(np.int32),
      behaviour_logits=rng.normal(size=[T, B, A]).astype(np.float32),
      rewards=rng.normal(size=[T, B]).astype(np.float32),
      discounts=discounts,
      mask=mask)


def _np_targets(d, clip_rho=1.0, clip_pg=1.0, lam=1.0, use_vtrace=True):
  """Reference pi(a), vs and advantages for a batch dict, float64."""
  onehot = np.eye(A)[d['actions']]
  tlp = (_np_log_softmax(d['target_logits'].astype(np.float64)) * onehot).sum(-1)
  blp = (_np_log_softmax(d['behaviour_logits'].astype(np.float64)) * onehot).sum(-1)
  if use_vtrace:
    log_rhos = np.where(d['mask'], tlp - blp, -np.inf)
  else:
    log_rhos = np.where(d['mask'], 0.0, -np.inf)
    clip_rho = clip_pg = None
  vs, adv = _np_vtrace(log_rhos, d['discounts'].astype(np.float64),
                       d['rewards'].astype(np.float64),
                       d['values'].astype(np.float64),
                       d['bootstrap_value'].astype(np.float64), clip_rho, clip_pg, lam)
  return tlp, blp, vs, adv


def _np_loss(d, baseline_cost, entropy_cost, **kw):
  tlp, _, vs, adv = _np_targets(d, **kw)
  m = d['mask']
  lp = _np_log_softmax(d['target_logits'].astype(np.float64))
  neg_ent = (np.exp(lp) * lp).sum(-1)
  pg = np.sum(np.where(m, -tlp * adv, 0))
  bl = np.sum(np.where(m, 0.5 * (vs - d['values'])**2, 0))
  en = np.sum(np.where(m, neg_ent, 0))
  return pg + baseline_cost * bl + entropy_cost * en, pg, bl, en


def _grads(d, **kw):
  logits = tf.Variable(d['target_logits'])
  values = tf.Variable(d['values'])
  args = dict(d, target_logits=logits, values=values)
  with tf.GradientTape() as tape:
    loss, diag = loss_inputs.compute_loss(**args, **kw)
  g_logits, g_values = tape.gradient(loss, [logits, values])
  return loss, diag, g_logits.numpy(), g_values.numpy()


def test_policy_gradient_loss_matches_numpy():
  d = _batch()
  adv = np.random.default_rng(1).normal(size=[T, B]).astype(np.float32)
  got = losses.policy_gradient_loss(d['target_logits'], d['actions'], adv)
  assert got.shape == (T, B) and got.dtype == tf.float32
  lp = _np_log_softmax(d['target_logits'].astype(np.float64))
  want = -np.take_along_axis(lp, d['actions'][..., None], -1)[..., 0] * adv
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
  # The advantage is a constant: no gradient flows into it.
  adv_t = tf.constant(adv)
  with tf.GradientTape() as tape:
    tape.watch(adv_t)
    out = tf.reduce_sum(losses.policy_gradient_loss(d['target_logits'], d['actions'],
                                                    adv_t))
  assert tape.gradient(out, adv_t) is None


def test_baseline_loss_matches_numpy():
  vs = np.array([[1.0, 2.0], [0.5, -1.0]], np.float32)
  values = np.array([[0.0, 2.5], [0.5, 1.0]], np.float32)
  got = losses.baseline_loss(vs, values).numpy()
  np.testing.assert_allclose(got, [[0.5, 0.125], [0.0, 2.0]], rtol=1e-6)
  vs_t = tf.constant(vs)
  with tf.GradientTape() as tape:
    tape.watch(vs_t)
    out = tf.reduce_sum(losses.baseline_loss(vs_t, values))
  assert tape.gradient(out, vs_t) is None


def test_entropy_loss_matches_numpy():
  # Uniform over 4 actions: H = log 4; a peaked distribution by hand.
  logits = np.zeros([1, 2, 4], np.float32)
  logits[0, 1] = np.log([0.7, 0.1, 0.1, 0.1])
  got = losses.entropy_loss(logits).numpy()
  want_peaked = 0.7 * np.log(0.7) + 3 * 0.1 * np.log(0.1)
  np.testing.assert_allclose(got, [[-np.log(4.0), want_peaked]], rtol=1e-5)


def test_compute_loss_matches_numpy():
  d = _batch()
  for kw in (dict(), dict(clip_rho_threshold=0.8, clip_pg_rho_threshold=1.5,
                          lambda_=0.9), dict(use_vtrace=False)):
    loss, diag = loss_inputs.compute_loss(**d, baseline_cost=0.5, entropy_cost=0.01, **kw)
    np_kw = {'clip_rho': kw.get('clip_rho_threshold', 1.0),
             'clip_pg': kw.get('clip_pg_rho_threshold', 1.0),
             'lam': kw.get('lambda_', 1.0), 'use_vtrace': kw.get('use_vtrace', True)}
    want, pg, bl, en = _np_loss(d, 0.5, 0.01, **np_kw)
    assert loss.shape == () and loss.dtype == tf.float32
    np.testing.assert_allclose(loss.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(diag['policy_loss'].numpy(), pg, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(diag['baseline_loss'].numpy(), bl, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(diag['entropy_loss'].numpy(), en, rtol=1e-5, atol=1e-5)

    tlp, blp, _, adv = _np_targets(d, **np_kw)
    m = d['mask']
    rhos = np.exp(tlp - blp)
    assert set(diag) == set(losses.DIAGNOSTIC_KEYS)
    for v in diag.values():
      assert v.shape == () and v.dtype == tf.float32
    np.testing.assert_allclose(diag['num_valid'].numpy(), m.sum())
    np.testing.assert_allclose(diag['entropy_sum'].numpy(), -en, rtol=1e-5)
    np.testing.assert_allclose(diag['rho_sum'].numpy(), rhos[m].sum(), rtol=1e-5)
    clip = kw.get('clip_rho_threshold', 1.0)
    np.testing.assert_allclose(diag['rho_clipped_count'].numpy(),
                               (rhos[m] > clip).sum())
    np.testing.assert_allclose(diag['advantage_sum'].numpy(), adv[m].sum(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(diag['advantage_sq_sum'].numpy(), (adv[m]**2).sum(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(diag['value_sum'].numpy(), d['values'][m].sum(),
                               rtol=1e-5, atol=1e-5)


def test_masked_steps_contribute_nothing():
  d = _batch()
  m = d['mask']
  base_loss, base_diag, base_gl, base_gv = _grads(d, baseline_cost=0.5,
                                                  entropy_cost=0.01)
  # Scramble everything at masked steps except the value, which is the bootstrap of
  # the step before (a truncated episode's final observation).
  rng = np.random.default_rng(7)
  e = dict(d)
  for key in ('target_logits', 'behaviour_logits'):
    e[key] = np.where(m[..., None], d[key], 50 * rng.normal(size=d[key].shape)
                      ).astype(np.float32)
  e['actions'] = np.where(m, d['actions'], (d['actions'] + 1) % A).astype(np.int32)
  e['rewards'] = np.where(m, d['rewards'], 1e3).astype(np.float32)
  e['discounts'] = np.where(m, d['discounts'], 0.3).astype(np.float32)
  loss, diag, gl, gv = _grads(e, baseline_cost=0.5, entropy_cost=0.01)
  np.testing.assert_allclose(loss.numpy(), base_loss.numpy(), rtol=1e-6)
  for k in ('num_valid', 'advantage_sum', 'baseline_loss', 'entropy_loss'):
    np.testing.assert_allclose(diag[k].numpy(), base_diag[k].numpy(), rtol=1e-6)
  np.testing.assert_allclose(gl, base_gl, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(gv, base_gv, rtol=1e-6, atol=1e-7)
  assert np.all(gl[~m] == 0) and np.all(gv[~m] == 0)
  assert np.all(np.isfinite(gl)) and np.all(np.isfinite(gv))

  # A masked step cuts the trace: rewards after step 2 of env 0 do not move the
  # targets (hence the baseline gradients) of steps 0 and 1 of env 0.
  f = dict(d)
  f['rewards'] = d['rewards'].copy()
  f['rewards'][3:, 0] += 10.0
  _, _, _, gv_f = _grads(f, baseline_cost=1.0, entropy_cost=0.0)
  _, _, _, gv_d = _grads(d, baseline_cost=1.0, entropy_cost=0.0)
  np.testing.assert_allclose(gv_f[:2, 0], gv_d[:2, 0], rtol=1e-6)
  assert not np.allclose(gv_f[3:, 0], gv_d[3:, 0])

  # All steps masked: zero loss, zero gradients, zero counts.
  z = dict(d, mask=np.zeros([T, B], bool))
  loss, diag, gl, gv = _grads(z, baseline_cost=0.5, entropy_cost=0.01)
  assert loss.numpy() == 0.0 and diag['num_valid'].numpy() == 0.0
  assert not gl.any() and not gv.any()


def test_gradients_match_numpy():
  d = _batch()
  m = d['mask'].astype(np.float64)
  tlp, _, vs, adv = _np_targets(d)
  lp = _np_log_softmax(d['target_logits'].astype(np.float64))
  p = np.exp(lp)
  onehot = np.eye(A)[d['actions']]

  # Policy term alone: d/dlogits = -(onehot - softmax) * A on valid steps.
  _, _, gl, gv = _grads(d, baseline_cost=0.0, entropy_cost=0.0)
  np.testing.assert_allclose(gl, -(onehot - p) * (adv * m)[..., None],
                             rtol=1e-4, atol=1e-6)
  assert not gv.any()

  # Baseline term: d/dvalues = -baseline_cost * (vs - V) (no gradient via vs).
  _, _, gl2, gv2 = _grads(d, baseline_cost=0.5, entropy_cost=0.0)
  np.testing.assert_allclose(gv2, -0.5 * (vs - d['values']) * m, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(gl2, gl, rtol=1e-6, atol=1e-7)

  # Entropy term: d(sum_a p log p)/dlogit_j = p_j (log p_j - sum_a p_a log p_a).
  cost = tf.constant(0.1)  # A (scheduled) tensor cost.
  _, _, gl3, _ = _grads(d, baseline_cost=0.0, entropy_cost=cost)
  neg_ent = (p * lp).sum(-1, keepdims=True)
  want = gl + 0.1 * p * (lp - neg_ent) * m[..., None]
  np.testing.assert_allclose(gl3, want, rtol=1e-4, atol=1e-6)


def test_batch_split_sums_to_full_batch():
  """Per-replica sums over halves of B add up to the full-batch loss and grads."""
  d = _batch(3)
  kw = dict(baseline_cost=0.5, entropy_cost=0.01, clip_rho_threshold=1.0,
            clip_pg_rho_threshold=1.0)
  loss, diag, gl, gv = _grads(d, **kw)
  halves = []
  for sl in (slice(0, B // 2), slice(B // 2, B)):
    part = {k: (v[sl] if k == 'bootstrap_value' else v[:, sl]) for k, v in d.items()}
    halves.append(_grads(part, **kw))
  np.testing.assert_allclose(halves[0][0] + halves[1][0], loss.numpy(), rtol=1e-5)
  for k in losses.DIAGNOSTIC_KEYS:
    np.testing.assert_allclose(halves[0][1][k] + halves[1][1][k], diag[k].numpy(),
                               rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.concatenate([halves[0][2], halves[1][2]], 1), gl,
                             rtol=1e-6)
  np.testing.assert_allclose(np.concatenate([halves[0][3], halves[1][3]], 1), gv,
                             rtol=1e-6)


def test_compute_loss_in_tf_function_and_gradient_through_shared_weights():
  d = _batch(4)
  w = tf.Variable(1.5)

  @tf.function
  def f(entropy_cost):
    with tf.GradientTape() as tape:
      loss, _ = loss_inputs.compute_loss(**dict(d, target_logits=w * d['target_logits'],
                                           values=w * d['values']),
                                    baseline_cost=0.5, entropy_cost=entropy_cost)
    return loss, tape.gradient(loss, w)

  loss, g = f(tf.constant(0.01))
  e = dict(d, target_logits=1.5 * d['target_logits'], values=1.5 * d['values'])
  np.testing.assert_allclose(loss.numpy(), _np_loss(e, 0.5, 0.01)[0], rtol=1e-5)
  assert np.isfinite(g.numpy()) and g.numpy() != 0


def test_wrong_rank_raises():
  d = _batch()
  with pytest.raises(ValueError):
    loss_inputs.compute_loss(**dict(d, values=d['values'][..., None]), baseline_cost=0.5,
                        entropy_cost=0.01)
  with pytest.raises(ValueError):
    losses.entropy_loss(np.zeros([3, 4], np.float32))


def test_value_scale_and_normalizer_match_numpy():
  # PopArt's sigma divides the value error and the advantages; the normalizer
  # (loss_reduction='mean') divides every term.
  d = _batch(seed=3)
  scale, norm = 2.5, 17.0
  loss, diag = loss_inputs.compute_loss(**d, baseline_cost=0.5, entropy_cost=0.01,
                                   value_scale=scale, normalizer=norm)
  tlp, _, vs, adv = _np_targets(d)
  m = d['mask']
  lp = _np_log_softmax(d['target_logits'].astype(np.float64))
  pg = np.sum(np.where(m, -tlp * adv / scale, 0)) / norm
  bl = np.sum(np.where(m, 0.5 * ((vs - d['values']) / scale)**2, 0)) / norm
  en = np.sum(np.where(m, (np.exp(lp) * lp).sum(-1), 0)) / norm
  np.testing.assert_allclose(float(diag['policy_loss']), pg, rtol=1e-5)
  np.testing.assert_allclose(float(diag['baseline_loss']), bl, rtol=1e-5)
  np.testing.assert_allclose(float(diag['entropy_loss']), en, rtol=1e-5)
  np.testing.assert_allclose(float(loss), pg + 0.5 * bl + 0.01 * en, rtol=1e-5)
  # Diagnostics of the targets stay in return units, entropy_sum unnormalised.
  np.testing.assert_allclose(float(diag['advantage_sum']),
                             np.sum(np.where(m, adv, 0)), rtol=1e-5)
  np.testing.assert_allclose(float(diag['entropy_sum']), -en * norm, rtol=1e-5)


def test_compute_targets_match_numpy_and_can_be_passed_in():
  d = _batch(seed=4)
  targets = loss_inputs.compute_targets(**d)
  _, _, vs, adv = _np_targets(d)
  np.testing.assert_allclose(targets.vs.numpy(), vs, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(targets.pg_advantages.numpy(), adv, rtol=1e-5,
                             atol=1e-5)
  a, _ = loss_inputs.compute_loss(**d, baseline_cost=0.5, entropy_cost=0.01)
  b, _ = loss_inputs.compute_loss(**d, baseline_cost=0.5, entropy_cost=0.01,
                             targets=targets)
  assert float(a) == float(b)


def test_policy_lag_diagnostics_match_numpy():
  d = _batch(seed=5)
  _, diag = loss_inputs.compute_loss(**d, baseline_cost=0.5, entropy_cost=0.01)
  tlp, blp, _, _ = _np_targets(d)
  m = d['mask']
  log_rho = tlp - blp
  np.testing.assert_allclose(float(diag['log_rho_abs_sum']),
                             np.sum(np.where(m, np.abs(log_rho), 0)), rtol=1e-5)
  assert float(diag['rho_above_1p1_count']) == np.sum(m & (np.exp(log_rho) > 1.1))
  assert 0 < float(diag['rho_above_1p1_count']) < np.sum(m)  # Not trivial.


def test_normalize_advantages_matches_numpy_and_replaces_the_policy_term():
  d = _batch(seed=6)
  _, _, _, adv = _np_targets(d)
  m = d['mask']
  want = np.where(m, (adv - adv[m].mean()) / (adv[m].std() + 1e-6), 0)
  got = losses.normalize_advantages(adv.astype(np.float32), m)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
  assert abs(float(np.mean(got.numpy()[m]))) < 1e-5
  # Given moments (e.g. all-reduced over replicas) are used as they are.
  moments = (tf.constant(10.0), tf.constant(40.0), tf.constant(5.0))  # 2 +- 2.
  np.testing.assert_allclose(
      losses.normalize_advantages(adv.astype(np.float32), m, moments).numpy(),
      np.where(m, (adv - 2.0) / 2.0, 0), rtol=1e-4, atol=1e-5)
  loss, diag = loss_inputs.compute_loss(**d, baseline_cost=0.5, entropy_cost=0.0,
                                   policy_advantages=got)
  tlp, _, vs, _ = _np_targets(d)
  pg = np.sum(np.where(m, -tlp * want, 0))
  np.testing.assert_allclose(float(diag['policy_loss']), pg, rtol=1e-4, atol=1e-5)
  # The diagnostics still describe the V-trace advantages.
  np.testing.assert_allclose(float(diag['advantage_sum']), np.sum(adv[m]),
                             rtol=1e-5)


def _np_surrogate(d, adv, eps):
  """PPO's clipped surrogate by hand: per-step loss, d loss / d logits, clipped."""
  onehot = np.eye(A)[d['actions']]
  lp = _np_log_softmax(d['target_logits'].astype(np.float64))
  blp = _np_log_softmax(d['behaviour_logits'].astype(np.float64))
  ratio = np.exp((lp * onehot).sum(-1) - (blp * onehot).sum(-1))
  unclipped, clipped = ratio * adv, np.clip(ratio, 1 - eps, 1 + eps) * adv
  loss = -np.minimum(unclipped, clipped)
  no_grad = clipped < unclipped
  # d(-r A)/d logits = -A r (onehot - softmax), where the unclipped term is taken.
  grad = np.where(no_grad[..., None], 0.0,
                  -(adv * ratio)[..., None] * (onehot - np.exp(lp)))
  return loss, grad, no_grad, ratio


@pytest.mark.parametrize('eps', [0.1, 0.3])
def test_clipped_surrogate_matches_numpy_both_sides_and_gradient(eps):
  d = _batch(seed=4)
  adv = np.random.default_rng(5).normal(size=[T, B]).astype(np.float32)
  want, want_grad, want_clipped, ratio = _np_surrogate(d, adv.astype(np.float64),
                                                       eps)
  logits = tf.Variable(d['target_logits'])
  with tf.GradientTape() as tape:
    got, clipped = losses.clipped_surrogate_loss(logits, d['behaviour_logits'],
                                                 d['actions'], adv, eps)
    total = tf.reduce_sum(got)
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(clipped.numpy(), want_clipped)
  np.testing.assert_allclose(tape.gradient(total, logits).numpy(), want_grad,
                             rtol=1e-4, atol=1e-6)
  # Both sides occur: steps clipped above (A > 0, r > 1 + eps), below (A < 0,
  # r < 1 - eps), and outside the range but unclipped (the min keeps r A).
  outside = np.abs(ratio - 1) > eps
  assert np.any(want_clipped & (adv > 0)) and np.any(want_clipped & (adv < 0))
  assert np.any(outside & ~want_clipped)
  # A ratio of 1 (learner = behaviour): the surrogate is -A, its gradient IMPALA's.
  same = dict(d, behaviour_logits=d['target_logits'])
  logits = tf.Variable(d['target_logits'])
  with tf.GradientTape(persistent=True) as tape:
    sur, _ = losses.clipped_surrogate_loss(logits, same['behaviour_logits'],
                                           d['actions'], adv, eps)
    pg = losses.policy_gradient_loss(logits, d['actions'], adv)
    sur_sum, pg_sum = tf.reduce_sum(sur), tf.reduce_sum(pg)
  np.testing.assert_allclose(sur.numpy(), -adv, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tape.gradient(sur_sum, logits).numpy(),
                             tape.gradient(pg_sum, logits).numpy(), rtol=1e-4,
                             atol=1e-6)


def test_compute_loss_with_ppo_clip_matches_numpy():
  d = _batch(seed=6)
  m = d['mask']
  eps = 0.2
  _, _, vs, adv = _np_targets(d)
  loss, diag, g_logits, _ = _grads(d, baseline_cost=0.5, entropy_cost=0.0,
                                   ppo_clip=eps, value_scale=2.0)
  # The advantages are divided by value_scale before the surrogate.
  want2, want_grad2, want_clipped2, _ = _np_surrogate(d, adv / 2.0, eps)
  pg = np.sum(np.where(m, want2, 0))
  np.testing.assert_allclose(float(diag['policy_loss']), pg, rtol=1e-4, atol=1e-5)
  assert float(diag['ppo_clipped_count']) == np.sum(m & want_clipped2)
  assert 0 < float(diag['ppo_clipped_count']) < np.sum(m)
  bl = np.sum(np.where(m, 0.5 * ((vs - d['values']) / 2.0)**2, 0))
  np.testing.assert_allclose(float(loss), pg + 0.5 * bl, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(g_logits, np.where(m[..., None], want_grad2, 0),
                             rtol=1e-4, atol=1e-6)
  out = losses.summarize_diagnostics(diag)
  np.testing.assert_allclose(out['ppo_clip_fraction'],
                             np.sum(m & want_clipped2) / np.sum(m), rtol=1e-6)
  # ppo_clip=0 is IMPALA's loss exactly, with no clipped step.
  loss0, diag0 = loss_inputs.compute_loss(**d, baseline_cost=0.5, entropy_cost=0.0)
  loss00, _ = loss_inputs.compute_loss(**d, baseline_cost=0.5, entropy_cost=0.0,
                                  ppo_clip=0.0)
  assert float(loss0) == float(loss00) and float(diag0['ppo_clipped_count']) == 0


def test_summarize_diagnostics():
  sums = {'loss': 10.0, 'policy_loss': 4.0, 'baseline_loss': 8.0,
          'entropy_loss': -6.0, 'num_valid': 4.0, 'entropy_sum': 6.0, 'rho_sum': 3.0,
          'rho_clipped_count': 1.0, 'advantage_sum': 2.0, 'advantage_sq_sum': 5.0,
          'value_sum': -2.0, 'log_rho_abs_sum': 0.8, 'rho_above_1p1_count': 3.0}
  out = losses.summarize_diagnostics(
      dict({k: tf.constant(v) for k, v in sums.items()}, extra=tf.zeros([3])))
  assert all(isinstance(v, float) for v in out.values())
  assert out['entropy'] == 1.5 and out['rho_mean'] == 0.75
  assert out['rho_clip_fraction'] == 0.25 and out['advantage_mean'] == 0.5
  # var = 5/4 - 0.5**2 = 1.0.
  np.testing.assert_allclose(out['advantage_std'], 1.0)
  assert out['value_mean'] == -0.5 and out['loss'] == 10.0
  assert out['policy_loss'] == 4.0 and out['num_valid'] == 4.0
  np.testing.assert_allclose(out['log_rho_abs_mean'], 0.2)
  assert out['rho_above_1p1_fraction'] == 0.75
  empty = losses.summarize_diagnostics(dict(sums, num_valid=0.0))
  assert empty['entropy'] == 0.0 and empty['advantage_std'] == 0.0
