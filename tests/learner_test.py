"""Tests for impala_tf.learner: the tower property, the update, counters, clipping.

The multi-replica checks run in a subprocess (virtual CPU devices must be configured
before TensorFlow initialises, and pytest runs many files in one process): the test
writes a synthetic batch (shaped like the data pipeline's output, `[B, T + 1, ...]`)
to an .npz file, and the script trains one step on 1 and on 2 replicas of
MirroredStrategy over virtual CPU devices, feeding the batch through the real
`data.build_dataset` + `data.distribute`, and prints JSON.
"""

import json
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from impala_tf import data
from impala_tf import distribute
from impala_tf import learner as learner_lib
from impala_tf import losses
from impala_tf import networks
from impala_tf import testing
from impala_tf import types

import loss_inputs

import helpers


B, T, OBS, A = 4, 5, 3, 3
OBS_SPACE = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
ACTION_SPACE = gym.spaces.Discrete(A)


def make_batch(seed=0, lstm_size=0, reward_scale=2.0):
  """A synthetic batch `[B, T + 1, ...]` with episode ends inside the unroll.

  Row 0 terminates at step 2 (a new episode starts at 3), row 1 is truncated at
  step 3 (new episode at 4), row 3 starts an episode at step 1 without a preceding
  end in the unroll (it ended in the previous unroll).
  """
  rng = np.random.default_rng(seed)
  t1 = T + 1
  terminated = np.zeros((B, t1), bool)
  truncated = np.zeros((B, t1), bool)
  first = np.zeros((B, t1), bool)
  terminated[0, 2] = True
  first[0, 3] = True
  truncated[1, 3] = True
  first[1, 4] = True
  first[2, 0] = True
  first[3, 1] = True
  action = rng.integers(0, A, (B, t1)).astype(np.int32)
  prev_action = np.concatenate([np.zeros((B, 1), np.int32), action[:, :-1]], axis=1)
  prev_action[first] = 0
  reward = (reward_scale * rng.standard_normal((B, t1))).astype(np.float32)
  reward[first] = 0.0
  batch = {
      'observation': rng.standard_normal((B, t1, OBS)).astype(np.float32),
      'reward': reward,
      'terminated': terminated,
      'truncated': truncated,
      'first': first,
      'prev_action': prev_action,
      'action': action,
      'behaviour_logits': rng.standard_normal((B, t1, A)).astype(np.float32),
      'policy_version': np.array([5, 3, 4, 1], np.int64),
      'unroll_id': np.arange(B, dtype=np.int64),
      'replayed': np.array([False, True, False, True]),
  }
  if lstm_size:
    batch['core_state_0'] = (0.5 * rng.standard_normal((B, lstm_size))).astype(
        np.float32)
    batch['core_state_1'] = (0.5 * rng.standard_normal((B, lstm_size))).astype(
        np.float32)
  return batch


def _config(**kw):
  # PopArt off unless a test asks for it: the reference updates are without it.
  base = dict(unroll_length=T, batch_size=B, mlp_hidden_sizes=(8,), lstm_size=8,
              seed=3, total_environment_frames=10_000, popart=False)
  base.update(kw)
  return testing.tiny_config(**base)


def _make_learner(cfg, strategy=None, action_repeat=1):
  strategy = strategy or distribute.get_strategy()
  return learner_lib.Learner(
      cfg, lambda: networks.make_network(cfg, OBS_SPACE, ACTION_SPACE), strategy,
      action_repeat)


def _shards(learner, batch):
  """The batch (plus `reuse`, default 0) as a distributed value for 1 replica."""
  batch = dict(batch)
  batch.setdefault('reuse', np.zeros([B], np.int32))
  ds = tf.data.Dataset.from_tensors(batch)
  return next(iter(data.distribute(learner.strategy, lambda: ds)))


def _apply_by_hand(cfg, variables, grads):
  """Clip and one optimizer step from fresh slots, in float64 numpy."""
  norm = np.sqrt(sum(np.sum(g**2) for g in grads))
  if cfg.grad_clip > 0:
    grads = [g * min(1.0, cfg.grad_clip / norm) for g in grads]
  new = []
  for w, g in zip(variables, grads):
    w = w.numpy().astype(np.float64)
    if cfg.optimizer == 'rmsprop':
      ms = cfg.rmsprop_decay * 1.0 + (1 - cfg.rmsprop_decay) * g**2
      new.append(w - cfg.learning_rate * g / np.sqrt(ms + cfg.rmsprop_epsilon))
    else:
      m = (1 - cfg.adam_beta1) * g
      v = (1 - cfg.adam_beta2) * g**2
      lr_t = cfg.learning_rate * np.sqrt(1 - cfg.adam_beta2) / (1 - cfg.adam_beta1)
      new.append(w - lr_t * m / (np.sqrt(v) + cfg.adam_epsilon))
  return norm, new


def _tm(x):
  return np.swapaxes(x, 0, 1)


def _loss_inputs(cfg, batch, out):
  """compute_loss's arguments (bar the costs) for a network output, by hand."""
  rewards = _tm(batch['reward'])[1:] * cfg.reward_scale
  if cfg.reward_clipping == 'abs_one':
    rewards = np.clip(rewards, -1, 1)
  term, trunc = _tm(batch['terminated']), _tm(batch['truncated'])
  return dict(
      target_logits=out.policy_logits[:-1], values=out.baseline[:-1],
      bootstrap_value=out.baseline[-1], actions=_tm(batch['action'])[:-1],
      behaviour_logits=_tm(batch['behaviour_logits'])[:-1], rewards=rewards,
      discounts=cfg.discounting * (1.0 - term[1:].astype(np.float32)),
      mask=~(term | trunc)[:-1])


def _unroll(cfg, net, batch):
  state = tuple(batch[f'core_state_{i}'] for i in range(2)) if cfg.use_lstm else ()
  return net.unroll(types.AgentInput(
      _tm(batch['observation']), _tm(batch['prev_action']), _tm(batch['reward']),
      _tm(batch['first'])), state)[0]


def _reference_step(cfg, batch):
  """The update by hand: a plain network, compute_loss, numpy clip and optimizer.

  Returns (loss, grad_norm, new trainable weights, per-term grad norms).
  """
  net = networks.make_network(cfg, OBS_SPACE, ACTION_SPACE)
  with tf.GradientTape(persistent=True) as tape:
    args = _loss_inputs(cfg, batch, _unroll(cfg, net, batch))
    normalizer = (max(float(np.sum(args['mask'])), 1.0)
                  if cfg.loss_reduction == 'mean' else 1.0)
    policy_advantages = None
    if cfg.normalize_advantages:  # By hand, in float64.
      adv = loss_inputs.compute_targets(**args).pg_advantages.numpy().astype(np.float64)
      valid = adv[args['mask']]
      policy_advantages = np.where(
          args['mask'], (adv - valid.mean()) / (valid.std() + 1e-6),
          0.0).astype(np.float32)
    loss, d = loss_inputs.compute_loss(
        **args, baseline_cost=cfg.baseline_cost, entropy_cost=cfg.entropy_cost,
        normalizer=normalizer, policy_advantages=policy_advantages)
    terms = (d['policy_loss'], cfg.baseline_cost * d['baseline_loss'],
             cfg.entropy_cost * d['entropy_loss'])
  variables = net.trainable_variables
  grads = [g.numpy().astype(np.float64) for g in tape.gradient(loss, variables)]
  term_norms = []
  for t in terms:
    gs = [np.zeros(v.shape) if g is None else g.numpy()
          for g, v in zip(tape.gradient(t, variables), variables)]
    term_norms.append(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64))
                                  for g in gs)))
  norm, new = _apply_by_hand(cfg, variables, grads)
  return float(loss), norm, new, term_norms


@pytest.mark.parametrize('optimizer,use_lstm', [('rmsprop', False), ('adam', True)])
def test_one_replica_step_matches_hand_computed_update(optimizer, use_lstm):
  cfg = _config(optimizer=optimizer, use_lstm=use_lstm, learning_rate=0.05,
                grad_clip=0.5, reward_clipping='abs_one')
  batch = make_batch(seed=1, lstm_size=8 if use_lstm else 0)
  learner = _make_learner(cfg)
  assert learner.strategy.num_replicas_in_sync == 1
  before = [v.numpy() for v in learner.network.trainable_variables]
  out = learner.step(_shards(learner, batch))
  ref_loss, ref_norm, ref_weights, _ = _reference_step(cfg, batch)
  assert float(out['grad_norm']) > cfg.grad_clip  # Clipping happened.
  assert float(out['grad_clipped']) == 1.0
  np.testing.assert_allclose(float(out['grad_norm']), ref_norm, rtol=1e-5)
  np.testing.assert_allclose(float(out['loss']), ref_loss, rtol=1e-5)
  for w0, v, ref in zip(before, learner.network.trainable_variables, ref_weights):
    np.testing.assert_allclose(v.numpy(), ref, atol=1e-6, rtol=1e-5, err_msg=v.name)
  moved = max(np.max(np.abs(v.numpy() - w0))
              for w0, v in zip(before, learner.network.trainable_variables))
  assert moved > 1e-4
  assert int(learner.optimizer.iterations.numpy()) == 1


@pytest.mark.parametrize('kw', [
    dict(reward_scale=3.0, reward_clipping='abs_one'),  # Scaled, then clipped.
    dict(loss_reduction='mean', grad_clip=0.05),
    dict(shared_torso=False, reward_scale=0.5),
    dict(normalize_advantages=True),
])
def test_loss_options_match_hand_computed_update(kw):
  cfg = _config(**dict(dict(optimizer='adam', learning_rate=0.01, grad_clip=0.5),
                       **kw))
  batch = make_batch(seed=6)
  learner = _make_learner(cfg)
  out = learner.step(_shards(learner, batch))
  ref_loss, ref_norm, ref_weights, ref_terms = _reference_step(cfg, batch)
  np.testing.assert_allclose(float(out['loss']), ref_loss, rtol=1e-5)
  np.testing.assert_allclose(float(out['grad_norm']), ref_norm, rtol=1e-5)
  for v, ref in zip(learner.network.trainable_variables, ref_weights):
    np.testing.assert_allclose(v.numpy(), ref, atol=1e-6, rtol=1e-5, err_msg=v.name)
  # The gradient norm of each weighted term, on the same batch.
  for name, ref in zip(('policy', 'baseline', 'entropy'), ref_terms):
    np.testing.assert_allclose(float(out[f'grad_norm_{name}']), ref, rtol=1e-4,
                               err_msg=name)
  assert float(out['grad_clipped']) == float(ref_norm > cfg.grad_clip)


def test_bfloat16_torso_update_is_its_hand_computation_near_float32s():
  cfg = _config(optimizer='adam', learning_rate=0.01, grad_clip=0.5,
                compute_dtype='bfloat16')
  batch = make_batch(seed=6)
  learner = _make_learner(cfg)
  assert learner.network.compute_dtype == tf.bfloat16
  before = [v.numpy() for v in learner.network.trainable_variables]
  out = learner.step(_shards(learner, batch))
  ref_loss, ref_norm, ref_weights, _ = _reference_step(cfg, batch)
  np.testing.assert_allclose(float(out['loss']), ref_loss, rtol=1e-5)
  np.testing.assert_allclose(float(out['grad_norm']), ref_norm, rtol=1e-5)
  # Adam's first step is about lr * sign(g); where g is near 0, the bfloat16
  # rounding of the learner's graph and of the eager reference can differ in
  # the last bit: 1e-5 here is 0.1% of a step of lr 0.01.
  for v, ref in zip(learner.network.trainable_variables, ref_weights):
    assert v.dtype == tf.float32
    np.testing.assert_allclose(v.numpy(), ref, atol=1e-5, rtol=1e-5, err_msg=v.name)
  # The float32 network's update from the same weights: close, not the same.
  # (Adam's first step divides each gradient by its own size, so compare the
  # update's direction, not each weight.)
  _, f32_norm, f32_weights, _ = _reference_step(
      cfg.replace(compute_dtype='float32'), batch)
  np.testing.assert_allclose(float(out['grad_norm']), f32_norm, rtol=0.05)
  flat = lambda ws: np.concatenate([np.ravel(w) for w in ws])
  start = flat(before)
  step_half = flat(v.numpy() for v in learner.network.trainable_variables) - start
  step_full = flat(f32_weights) - start
  assert not np.array_equal(step_half, step_full)
  cosine = step_half @ step_full / np.linalg.norm(step_half) / np.linalg.norm(step_full)
  assert cosine > 0.95, cosine


def test_reward_scale_changes_the_loss_as_scaled_rewards_do():
  batch = make_batch(seed=7)
  scaled = dict(batch, reward=batch['reward'] * 0.25)
  losses_seen = []
  for scale, b in ((0.25, batch), (1.0, scaled), (1.0, batch)):
    learner = _make_learner(_config(reward_scale=scale, grad_clip=0.0))
    losses_seen.append(float(learner.step(_shards(learner, b))['loss']))
  np.testing.assert_allclose(losses_seen[0], losses_seen[1], rtol=1e-6)
  assert abs(losses_seen[0] - losses_seen[2]) > 1e-3


def test_term_grad_norms_off_gives_the_same_update():
  batch = make_batch(seed=8)
  weights, outs = [], []
  for on in (True, False):
    learner = _make_learner(_config(loss_term_grad_norms=on, grad_clip=0.5))
    outs.append(learner.step(_shards(learner, batch)))
    weights.append(learner.get_weights())
  for a, b in zip(*weights):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
  assert 'grad_norm_policy' in outs[0] and 'grad_norm_policy' not in outs[1]


def _popart_reference(cfg, batch, mu0, nu0, updates0, peak0=0.0):
  """One PopArt step by hand, in the order of Hessel et al.: V-trace targets with
  the current statistics; new statistics; the head rescaled so V is preserved;
  then the gradient of the normalised losses at the rescaled head.

  Returns (new trainable weights, mu1, sigma1, grad norm).
  """
  net = networks.make_network(cfg, OBS_SPACE, ACTION_SPACE)
  net.popart.mu.assign([mu0])
  net.popart.nu.assign([nu0])
  net.popart.peak.assign([peak0])
  floor = cfg.popart_sigma_floor
  spread0 = np.sqrt(nu0 - mu0**2)
  sigma0 = max(spread0, floor * max(peak0, spread0))
  out = _unroll(cfg, net, batch)
  args = _loss_inputs(cfg, batch, out)
  targets = loss_inputs.compute_targets(**args)
  m = args['mask']
  vs = targets.vs.numpy().astype(np.float64)[m]
  step = cfg.popart_beta / (1 - (1 - cfg.popart_beta)**(updates0 + 1))
  mu1 = (1 - step) * mu0 + step * vs.mean()
  nu1 = (1 - step) * nu0 + step * np.mean(vs**2)
  spread1 = np.sqrt(nu1 - mu1**2)
  peak1 = max(peak0, spread1)
  sigma1 = max(spread1, floor * peak1)
  head = net.baseline_head
  head.w.assign(head.w.numpy() * sigma0 / sigma1)
  head.b.assign((sigma0 * head.b.numpy() + mu0 - mu1) / sigma1)
  net.popart.mu.assign([mu1])
  net.popart.nu.assign([nu1])
  net.popart.peak.assign([peak1])
  with tf.GradientTape() as tape:
    out2 = _unroll(cfg, net, batch)
    normalised = (out2.baseline[:-1] - mu1) / sigma1  # The head's own output.
    zeros = tf.zeros_like(normalised)
    err = normalised - (targets.vs - mu1) / sigma1
    bl = tf.reduce_sum(tf.where(m, 0.5 * tf.square(err), zeros))
    pg = tf.reduce_sum(tf.where(m, losses.policy_gradient_loss(
        out2.policy_logits[:-1], args['actions'],
        targets.pg_advantages / sigma1), zeros))
    ent = tf.reduce_sum(tf.where(m, losses.entropy_loss(out2.policy_logits[:-1]),
                                 zeros))
    loss = pg + cfg.baseline_cost * bl + cfg.entropy_cost * ent
  # The rescaled head preserved every output in return units.
  np.testing.assert_allclose(out2.baseline.numpy(), out.baseline.numpy(),
                             rtol=1e-5, atol=1e-5)
  variables = net.trainable_variables
  grads = [g.numpy().astype(np.float64) for g in tape.gradient(loss, variables)]
  norm, new = _apply_by_hand(cfg, variables, grads)
  return new, mu1, sigma1, norm


@pytest.mark.parametrize('optimizer,floor', [('rmsprop', 0.1), ('adam', 0.1),
                                             ('adam', 0.9)])
def test_popart_step_matches_hand_computation(optimizer, floor):
  # floor=0.9: the old sigma is the floor, 0.9 * peak0 = 2.7, not the spread 2.
  cfg = _config(optimizer=optimizer, popart=True, popart_beta=0.2,
                learning_rate=0.05, grad_clip=0.5, popart_sigma_floor=floor)
  batch = make_batch(seed=9, reward_scale=5.0)
  mu0, nu0, updates0 = -3.0, 13.0, 3.0  # sigma0 = 2; the 4th update.
  learner = _make_learner(cfg)
  popart = learner.network.popart
  popart.mu.assign([mu0])
  popart.nu.assign([nu0])
  popart.updates.assign(updates0)
  popart.peak.assign([3.0])
  out = learner.step(_shards(learner, batch))
  ref_weights, mu1, sigma1, ref_norm = _popart_reference(cfg, batch, mu0, nu0,
                                                         updates0, peak0=3.0)
  np.testing.assert_allclose(float(out['popart_mu']), mu1, rtol=1e-5)
  np.testing.assert_allclose(float(out['popart_sigma']), sigma1, rtol=1e-5)
  np.testing.assert_allclose(popart.mu.numpy(), [mu1], rtol=1e-5)
  np.testing.assert_allclose(float(popart.sigma[0]), sigma1, rtol=1e-5)
  assert float(popart.updates.numpy()) == updates0 + 1
  assert abs(mu1 - mu0) > 0.1 and abs(sigma1 - 2.0) > 0.1
  np.testing.assert_allclose(float(out['grad_norm']), ref_norm, rtol=1e-4)
  for v, ref in zip(learner.network.trainable_variables, ref_weights):
    np.testing.assert_allclose(v.numpy(), ref, atol=2e-6, rtol=1e-4, err_msg=v.name)


def test_popart_first_update_takes_the_batch_moments():
  # Debiased: the first update sets mu and nu to the batch's target moments,
  # whatever beta is, and the initial (0, 1) leaves no trace.
  cfg = _config(popart=True, popart_beta=1e-4)
  batch = make_batch(seed=10, reward_scale=50.0)
  learner = _make_learner(cfg)
  out = learner.step(_shards(learner, batch))
  net = networks.make_network(cfg, OBS_SPACE, ACTION_SPACE)
  args = _loss_inputs(cfg, batch, _unroll(cfg, net, batch))
  vs = loss_inputs.compute_targets(**args).vs.numpy()[args['mask']].astype(np.float64)
  np.testing.assert_allclose(float(out['popart_mu']), vs.mean(), atol=1e-4)
  np.testing.assert_allclose(float(out['popart_sigma']), vs.std(), rtol=1e-4)
  assert vs.std() > 5


@pytest.mark.parametrize('scale,shift', [(1.0, 40.0), (1.0, -25.0), (5.0, 0.0),
                                         (3.0, -60.0)])
def test_popart_update_is_invariant_to_the_scale_and_shift_of_the_returns(
    scale, shift):
  # Returns k * G + c (rewards * k + c * (1 - discount), no terminal inside), with
  # the statistics and the value head moved alike: the same weights after each
  # step, mu moved to k * mu + c and sigma to k * sigma. Two steps, the second
  # on a batch of smaller spread, so the floor (0.9 of the peak spread) sets
  # sigma there. A floor of 0.9 * |mu| would move with c.
  cfg = _config(optimizer='adam', learning_rate=0.01, grad_clip=0.5, popart=True,
                popart_beta=0.9, popart_sigma_floor=0.9, shared_torso=False)
  gamma = cfg.discounting
  batches = [make_batch(seed=21, reward_scale=5.0),
             make_batch(seed=22, reward_scale=0.5)]
  for b in batches:
    b['terminated'][:] = False
  base, moved = _make_learner(cfg), _make_learner(cfg)
  moved.network.popart.mu.assign([shift])  # From mu = 0, nu = 1: sigma 1.
  moved.network.popart.nu.assign([scale**2 + shift**2])
  floored = []
  for b in batches:
    b2 = dict(b, reward=(b['reward'] * scale + shift * (1 - gamma)).astype(
        np.float32))
    out = base.step(_shards(base, b))
    out2 = moved.step(_shards(moved, b2))
    for v, v2 in zip(base.network.trainable_variables,
                     moved.network.trainable_variables):
      np.testing.assert_allclose(v2.numpy(), v.numpy(), rtol=1e-4, atol=1e-5,
                                 err_msg=v.name)
    np.testing.assert_allclose(float(out2['popart_mu']),
                               scale * float(out['popart_mu']) + shift,
                               rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(float(out2['popart_sigma']),
                               scale * float(out['popart_sigma']), rtol=1e-4)
    popart = base.network.popart
    spread = float(popart.spread_of(popart.mu, popart.nu)[0])
    floored.append(float(out['popart_sigma']) > spread * 1.01)
  assert floored == [False, True]


def test_repeated_steps_decrease_the_loss():
  # A simple case where the loss is a fixed objective: constant rewards, no
  # discounting, no episode ends, uniform behaviour policy, no clipping.
  cfg = _config(optimizer='rmsprop', learning_rate=0.01, grad_clip=0.0,
                entropy_cost=0.0, discounting=0.0, baseline_cost=1.0)
  batch = make_batch(seed=2)
  batch['reward'][:] = 2.0
  batch['behaviour_logits'][:] = 0.0
  for key in ('terminated', 'truncated', 'first'):
    batch[key][:] = False
  learner = _make_learner(cfg)
  shards = _shards(learner, batch)
  # The reported loss of a step is the loss at the weights before it.
  results = [learner.step(shards) for _ in range(5)]
  loss = [float(r['loss']) for r in results]
  baseline = [float(r['baseline_loss']) for r in results]
  assert all(b < a for a, b in zip(loss, loss[1:])), loss
  assert all(b < a for a, b in zip(baseline, baseline[1:])), baseline
  assert loss[-1] < 0.5 * loss[0], loss


def test_counters_and_policy_lag():
  cfg = _config(optimizer='rmsprop')
  learner = _make_learner(cfg, action_repeat=4)
  learner.learner_steps.assign(5)
  learner.consumed_frames.assign(100)
  batch = make_batch(seed=3)
  # Unrolls: 0 fresh first use, 1 replayed first use, 2 fresh reused, 3 replayed
  # reused.
  batch['replayed'] = np.array([False, True, False, True])
  batch['reuse'] = np.array([0, 0, 1, 2], np.int32)
  batch['policy_version'] = np.array([5, 3, 4, 1], np.int64)
  out = learner.step(_shards(learner, batch))
  frames = T * 4  # unroll_length * action_repeat
  assert int(learner.learner_steps.numpy()) == 6
  assert int(learner.consumed_frames.numpy()) == 100 + frames
  assert int(learner.replayed_frames.numpy()) == frames
  assert int(learner.trained_frames.numpy()) == B * frames
  assert float(out['fresh_frames']) == frames
  assert float(out['replayed_frames']) == frames
  assert float(out['trained_frames']) == B * frames
  # Lag = learner steps before this step (5) - policy_version.
  assert float(out['policy_lag_sum']) == 0 + 2 + 1 + 4
  assert float(out['policy_lag_max']) == 4
  assert float(out['num_unrolls']) == B
  # A second step: learner_steps is now 6, so every lag grows by one.
  out = learner.step(_shards(learner, batch))
  assert float(out['policy_lag_sum']) == 7 + B
  assert float(out['policy_lag_max']) == 5
  assert int(learner.learner_steps.numpy()) == 7
  assert int(learner.trained_frames.numpy()) == 2 * B * frames


def test_num_valid_counts_masked_steps():
  cfg = _config()
  learner = _make_learner(cfg)
  out = learner.step(_shards(learner, make_batch(seed=4)))
  # T * B steps carry a loss, minus the step after the termination (row 0, t=2)
  # and after the truncation (row 1, t=3).
  assert float(out['num_valid']) == T * B - 2


def test_learner_applies_reward_clipping():
  # abs_one on big rewards == none on np.clip'ed rewards (an MLP does not see
  # the reward, so only the loss can tell them apart).
  batch = make_batch(seed=5, reward_scale=4.0)
  assert np.abs(batch['reward']).max() > 1.5
  clipped = dict(batch, reward=np.clip(batch['reward'], -1, 1))
  results = []
  for mode, b in (('abs_one', batch), ('none', clipped), ('none', batch)):
    learner = _make_learner(_config(reward_clipping=mode, grad_clip=0.0))
    out = learner.step(_shards(learner, b))
    results.append((float(out['loss']), learner.get_weights()))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
  for w0, w1 in zip(results[0][1], results[1][1]):
    np.testing.assert_allclose(w0, w1, atol=1e-7)
  assert abs(results[0][0] - results[2][0]) > 1e-3


def _learner_state(learner):
  """Copies of the network's and the optimizer's variables (numpy)."""
  return [v.numpy().copy() for v in
          list(learner.network.variables) + list(learner.optimizer.variables)]


@pytest.mark.parametrize('popart', [False, True])
def test_a_step_with_an_empty_shard_trains_nothing(popart):
  # A learner worker whose data ended gets empty shards from the distributed
  # iterator; the other workers' data alone must not make an update (with
  # Adam's momentum from the step before, a zero gradient still moves weights).
  cfg = _config(optimizer='adam', learning_rate=0.01, popart=popart)
  learner = _make_learner(cfg)
  good = make_batch(seed=4)
  out = learner.step(_shards(learner, good))
  assert float(out['empty_shards']) == 0
  state = lambda: _learner_state(learner)
  before = state()
  empty = {k: v[:0] for k, v in good.items()}
  empty['reuse'] = np.zeros([0], np.int32)
  out = learner.step(_shards(learner, empty))
  assert float(out['empty_shards']) == 1.0
  assert float(out['nonfinite']) == 0.0
  for a, b in zip(before, state()):
    np.testing.assert_array_equal(a, b)
  assert int(learner.optimizer.iterations.numpy()) == 1
  out = learner.step(_shards(learner, good))
  assert float(out['empty_shards']) == 0
  assert int(learner.optimizer.iterations.numpy()) == 2


@pytest.mark.parametrize('popart', [False, True])
def test_non_finite_update_is_skipped_and_counted(popart):
  # With PopArt the statistics and the value head stay as they are too.
  cfg = _config(optimizer='adam', learning_rate=0.01, popart=popart)
  learner = _make_learner(cfg)
  good = make_batch(seed=4)
  out = learner.step(_shards(learner, good))
  assert float(out['nonfinite']) == 0 and float(out['nonfinite_streak']) == 0
  state = lambda: _learner_state(learner)
  before = state()
  for i, bad_value in enumerate([np.nan, np.inf]):
    bad = make_batch(seed=5)
    bad['reward'][2, 3] = bad_value
    out = learner.step(_shards(learner, bad))
    assert float(out['nonfinite']) == 1.0
    assert float(out['nonfinite_streak']) == i + 1
    # Weights, Adam's slots and its iteration count are exactly as before.
    for a, b in zip(before, state()):
      np.testing.assert_array_equal(a, b)
  assert int(learner.nonfinite_updates.numpy()) == 2
  assert int(learner.learner_steps.numpy()) == 3  # Skipped steps are steps.
  assert int(learner.optimizer.iterations.numpy()) == 1
  out = learner.step(_shards(learner, good))
  assert float(out['nonfinite']) == 0 and float(out['nonfinite_streak']) == 0
  assert int(learner.nonfinite_updates.numpy()) == 2
  assert int(learner.optimizer.iterations.numpy()) == 2
  assert any(not np.array_equal(a, b) for a, b in zip(before, state()))


def _iterator(learner, batches, reuse=None):
  """A distributed iterator over `batches` (batch i with `reuse` reuse[i], default
  0), for 1 replica."""
  stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}
  reuse = [0] * len(batches) if reuse is None else reuse
  stacked['reuse'] = np.repeat(np.asarray(reuse, np.int32)[:, None], B, axis=1)
  ds = tf.data.Dataset.from_tensor_slices(stacked)
  return iter(data.distribute(learner.strategy, lambda: ds))


def _check_same_state(one, other):
  """Weights, optimizer slots and counters of two learners agree."""
  for a, b in zip(one.network.variables, other.network.variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
  for a, b in zip(one.optimizer.variables, other.optimizer.variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
  for name in ('learner_steps', 'consumed_frames', 'replayed_frames',
               'trained_frames'):
    assert int(getattr(other, name).numpy()) == int(getattr(one, name).numpy()), name


def _check_call_folds_its_steps(call, group, term_norms):
  """One call's outputs against those of the single steps it made (`group`)."""
  # Counts are summed over the call's steps; the lag maximum is the maximum
  # (the lags grow by one each step: the variable is read inside the loop).
  assert int(call['steps']) == len(group)
  for key in ('policy_lag_sum', 'num_unrolls', 'fresh_frames', 'trained_frames',
              'grad_clipped', 'nonfinite'):
    assert float(call[key]) == pytest.approx(sum(float(s[key]) for s in group))
  assert float(call['policy_lag_max']) == max(
      float(s['policy_lag_max']) for s in group)
  # The rest are the last step's; the per-term norms the first step's.
  np.testing.assert_allclose(float(call['loss']), float(group[-1]['loss']),
                             rtol=1e-5)
  if term_norms:
    np.testing.assert_allclose(float(call['grad_norm_policy']),
                               float(group[0]['grad_norm_policy']), rtol=1e-5)
  else:
    assert 'grad_norm_policy' not in call
  assert float(call['data_wait_seconds']) >= 0


@pytest.mark.parametrize('term_norms, popart', [(False, False), (True, False),
                                                (False, True)])
def test_steps_per_call_give_the_updates_of_single_steps(term_norms, popart):
  # PopArt's statistics move on every step of a call, as over single steps.
  extra = dict(popart=True, popart_beta=0.3) if popart else {}
  batches = [make_batch(seed=20 + i) for i in range(5)]
  one = _make_learner(_config(loss_term_grad_norms=term_norms, **extra))
  three = _make_learner(_config(loss_term_grad_norms=term_norms,
                                learner_steps_per_call=3, **extra))
  for a, b in zip(one.network.variables, three.network.variables):
    b.assign(a)
  it = _iterator(one, batches)
  singles = [one.step_from_iterator(it) for _ in range(5)]
  it = _iterator(three, batches)
  calls = [three.step_from_iterator(it), three.step_from_iterator(it)]
  # The data ended after 5 steps: a call that finds none raises and changes no
  # counter.
  with pytest.raises(tf.errors.OutOfRangeError):
    three.step_from_iterator(it)
  assert [int(c['steps']) for c in calls] == [3, 2]
  assert all(int(s['steps']) == 1 for s in singles)
  _check_same_state(one, three)
  if popart:  # The statistics moved, and alike.
    assert float(three.network.popart.mu.numpy()[0]) != 0.0
    np.testing.assert_allclose(three.network.popart.mu.numpy(),
                               one.network.popart.mu.numpy(), rtol=1e-5)
    np.testing.assert_allclose(three.network.popart.nu.numpy(),
                               one.network.popart.nu.numpy(), rtol=1e-5)
  assert int(three.learner_steps.numpy()) == 5
  for call, group in zip(calls, (singles[:3], singles[3:])):
    _check_call_folds_its_steps(call, group, term_norms)
  # The weights returned are those after the call's last step.
  for w, v in zip(calls[-1]['weights'], three.network.variables):
    assert w.dtype == v.dtype.as_numpy_dtype
    np.testing.assert_array_equal(w, v.numpy())


def test_reuse_in_call_is_num_sgd_iter_for_a_ring_of_one_batch():
  assert learner_lib.reuse_in_call(_config(num_sgd_iter=3)) == 3
  assert learner_lib.reuse_in_call(
      _config(num_sgd_iter=3, minibatch_buffer_size=2)) == 1


@pytest.mark.parametrize('term_norms', [False, True])
def test_reuse_in_the_call_gives_the_updates_of_a_reusing_dataset(term_norms):
  _check_reuse_in_call(dict(loss_term_grad_norms=term_norms), term_norms)


def test_reuse_in_the_call_with_ppo_clip_and_popart_gives_the_same_updates():
  # The clipped surrogate measures each pass against the behaviour policy, and
  # PopArt's statistics move on every pass: both as the reusing dataset does.
  singles = _check_reuse_in_call(dict(loss_term_grad_norms=False, ppo_clip=0.2,
                                      popart=True, popart_beta=0.3), False)
  # The synthetic behaviour logits are far from the learner's: the clip acts.
  assert sum(float(s['ppo_clipped_count']) for s in singles) > 0


def _check_reuse_in_call(extra, term_norms):
  # num_sgd_iter = 2 done by the learner on batches fetched once, against single
  # steps on a dataset that emits each batch twice (reuse 0, then 1).
  batches = [make_batch(seed=40 + i) for i in range(3)]
  kw = dict(num_sgd_iter=2, optimizer='adam', **extra)
  one = _make_learner(_config(**kw))
  fused = _make_learner(_config(learner_steps_per_call=3, **kw))
  for a, b in zip(one.network.variables, fused.network.variables):
    b.assign(a)
  it = _iterator(one, [b for b in batches for _ in range(2)], reuse=[0, 1] * 3)
  singles = [one.step_from_iterator(it) for _ in range(6)]
  it = _iterator(fused, batches)
  # 3 steps per call rounds up to whole batches: 4 steps, then the last batch's 2.
  calls = [fused.step_from_iterator(it, reuse=2), fused.step_from_iterator(it, 2)]
  with pytest.raises(tf.errors.OutOfRangeError):
    fused.step_from_iterator(it, 2)
  assert [int(c['steps']) for c in calls] == [4, 2]
  _check_same_state(one, fused)
  # Fresh frames count at a batch's first use only.
  assert int(fused.consumed_frames.numpy()) == 3 * T * 2  # 2 fresh rows a batch.
  assert int(fused.trained_frames.numpy()) == 6 * B * T
  for call, group in zip(calls, (singles[:4], singles[4:])):
    _check_call_folds_its_steps(call, group, term_norms)
  for w, v in zip(calls[-1]['weights'], fused.network.variables):
    np.testing.assert_array_equal(w, v.numpy())
  with pytest.raises(ValueError, match='reuse must be >= 1, got 0'):
    fused.step_from_iterator(it, reuse=0)
  return singles


@pytest.mark.parametrize('kw', [
    dict(popart=True, loss_term_grad_norms=True, optimizer='adam'),
    dict(popart=False, loss_term_grad_norms=False, optimizer='rmsprop',
         loss_reduction='mean', normalize_advantages=True, use_lstm=True),
    dict(popart=True, ppo_clip=0.2, loss_term_grad_norms=False, optimizer='rmsprop',
         rmsprop_style='torch'),
])
def test_xla_gradient_gives_the_same_updates(kw):
  batches = [make_batch(seed=30 + i, lstm_size=8 if kw.get('use_lstm') else 0)
             for i in range(3)]
  plain = _make_learner(_config(learner_jit='off', **kw))
  jit = _make_learner(_config(learner_jit='on', **kw))
  assert plain._jit_gradients is None and jit._jit_gradients is not None
  for a, b in zip(plain.network.variables, jit.network.variables):
    b.assign(a)
  outs = []
  for learner in (plain, jit):
    it = _iterator(learner, batches)
    outs.append([learner.step_from_iterator(it) for _ in batches])
  for a, b in zip(plain.network.variables, jit.network.variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
  for a, b in zip(*outs):
    for key in ('loss', 'policy_loss', 'baseline_loss', 'grad_norm',
                'policy_lag_sum'):
      np.testing.assert_allclose(float(a[key]), float(b[key]), rtol=1e-4,
                                 atol=1e-5)


_TOWER_SCRIPT = textwrap.dedent(r"""
    import json, sys
    from impala_tf import distribute
    distribute.configure_devices(num_virtual_cpu_devices=2)
    import gymnasium as gym
    import numpy as np
    import tensorflow as tf
    # As in the test process (tests/conftest.py): 14 learners are traced here.
    tf.config.optimizer.set_experimental_options({'disable_meta_optimizer': True})
    from impala_tf import config as config_lib
    from impala_tf import data
    from impala_tf import learner as learner_lib
    from impala_tf import networks

    cases = json.load(open(sys.argv[1]))
    obs_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)
    out = {}
    for name, case in cases.items():
      cfg = config_lib.Config.from_dict(case['config'])
      arrays = dict(np.load(case['batch']))
      signature = data.unroll_signature(
          (3,), np.float32, 3, cfg.unroll_length,
          [cfg.lstm_size] * 2 if cfg.use_lstm else [])
      runs = {}
      for n in (1, 2):
        strategy = distribute.get_strategy(num_virtual_cpu_devices=n)
        learner = learner_lib.Learner(
            cfg, lambda: networks.make_network(cfg, obs_space, action_space),
            strategy)
        learner.learner_steps.assign(5)
        chunks = iter([arrays])
        source = data.ChunkSource(lambda: next(chunks, None), None)
        dist = data.distribute(strategy, lambda: data.build_dataset(
            source, signature, batch_size=cfg.batch_size,
            num_replicas=strategy.num_replicas_in_sync))
        w0 = learner.get_weights()
        diags = learner.step(next(iter(dist)))
        comps_equal = all(
            all(np.array_equal(c.numpy(), strategy.experimental_local_results(v)[0].numpy())
                for c in strategy.experimental_local_results(v))
            for v in list(learner.network.variables) + [learner.learner_steps])
        runs[n] = dict(
            replicas=strategy.num_replicas_in_sync,
            weights=learner.get_weights(), w0=w0,
            diags={k: float(v) for k, v in diags.items()},
            counters=[int(learner.learner_steps.numpy()),
                      int(learner.consumed_frames.numpy()),
                      int(learner.replayed_frames.numpy()),
                      int(learner.trained_frames.numpy())],
            iterations=int(learner.optimizer.iterations.numpy()),
            nonfinite=int(learner.nonfinite_updates.numpy()),
            comps_equal=comps_equal)
      one, two = runs[1], runs[2]
      out[name] = dict(
          replicas=[one['replicas'], two['replicas']],
          max_weight_diff=max(float(np.max(np.abs(a - b)))
                              for a, b in zip(one['weights'], two['weights'])),
          init_diff=max(float(np.max(np.abs(a - b)))
                        for a, b in zip(one['w0'], two['w0'])),
          moved=max(float(np.max(np.abs(a - b)))
                    for a, b in zip(one['weights'], one['w0'])),
          diags1=one['diags'], diags2=two['diags'],
          counters=[one['counters'], two['counters']],
          iterations=[one['iterations'], two['iterations']],
          nonfinite=[one['nonfinite'], two['nonfinite']],
          comps_equal=two['comps_equal'])
    print('RESULT ' + json.dumps(out))
""")


@pytest.mark.e2e
def test_tower_property_two_replicas_equal_one(tmp_path):
  cases = {}
  specs = {
      'rmsprop': dict(optimizer='rmsprop', learning_rate=0.05, grad_clip=0.5),
      'adam': dict(optimizer='adam', learning_rate=0.01, grad_clip=0.5),
      'lstm': dict(optimizer='rmsprop', learning_rate=0.05, grad_clip=0.5,
                   use_lstm=True, reward_clipping='abs_one',
                   entropy_cost=0.05, popart=True),
      # A NaN reward in the second replica's shard only: both skip the update.
      'nonfinite': dict(optimizer='adam', learning_rate=0.01, grad_clip=0.5),
      # PopArt statistics from the whole batch's moments on every replica, and
      # the loss divided by the whole batch's valid steps.
      'popart_mean': dict(optimizer='adam', learning_rate=0.01, grad_clip=1e-3,
                          popart=True, popart_beta=0.3, loss_reduction='mean'),
      # The clipped surrogate with PopArt and the LSTM, torch-style RMSProp.
      'ppo_lstm_popart': dict(optimizer='rmsprop', rmsprop_style='torch',
                              learning_rate=0.01, grad_clip=0.5, use_lstm=True,
                              popart=True, ppo_clip=0.2),
      'popart_value_torso': dict(optimizer='rmsprop', learning_rate=0.05,
                                 grad_clip=0.5, popart=True, shared_torso=False,
                                 reward_scale=10.0, loss_term_grad_norms=False,
                                 normalize_advantages=True),
  }
  for i, (name, kw) in enumerate(specs.items()):
    cfg = _config(**kw)
    batch = make_batch(seed=10 + i, lstm_size=cfg.lstm_size if cfg.use_lstm else 0)
    if name == 'nonfinite':
      batch['reward'][3, 2] = np.nan
    path = tmp_path / f'{name}.npz'
    np.savez(path, **batch)
    cases[name] = dict(config=cfg.to_dict(), batch=str(path))
  (tmp_path / 'cases.json').write_text(json.dumps(cases))
  script = tmp_path / 'tower_check.py'
  script.write_text(_TOWER_SCRIPT)
  out = helpers.run_probe(script, [tmp_path / 'cases.json'], timeout=600)
  assert set(out) == set(specs)
  for name, r in out.items():
    assert r['replicas'] == [1, 2], (name, r)
    assert r['init_diff'] == 0.0, (name, r['init_diff'])  # Same seeded weights.
    assert r['comps_equal'], name  # Every mirror holds the same value.
    if specs[name].get('popart'):
      # ... and what each replica computed agreed before the first's was taken.
      assert r['diags2']['popart_replica_spread'] < 1e-6, (name, r['diags2'])
    if name == 'nonfinite':
      assert r['moved'] == 0.0 and r['max_weight_diff'] == 0.0, r
      assert r['iterations'] == [0, 0] and r['nonfinite'] == [1, 1], r
      assert r['diags1']['nonfinite'] == r['diags2']['nonfinite'] == 1.0, r
      continue
    assert r['nonfinite'] == [0, 0], (name, r)
    assert r['moved'] > 1e-4, (name, r['moved'])
    assert r['max_weight_diff'] < 1e-5, (name, r['max_weight_diff'])
    assert r['iterations'] == [1, 1], (name, r['iterations'])
    d1, d2 = r['diags1'], r['diags2']
    assert d1['grad_norm'] > specs[name]['grad_clip'], (name, d1['grad_norm'])
    assert set(d1) == set(d2)
    for k in d1:
      np.testing.assert_allclose(d2[k], d1[k], rtol=1e-5, atol=1e-5,
                                 err_msg=f'{name}: {k}')
    # Fresh batch, first use: rows 1 and 3 are replayed.
    frames = T
    assert r['counters'][0] == r['counters'][1] == [6, 2 * frames, 2 * frames,
                                                     B * frames], (name, r)
    # Lags 0, 2, 1, 4: the max lives on the second replica's shard.
    assert d2['policy_lag_max'] == 4 and d2['policy_lag_sum'] == 7, (name, d2)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
