"""One replica's loss and gradient on its shard of a batch, before the all-reduce.

A shard is `[B / N, T + 1, ...]` (batch-major, as `impala_tf.data` delivers it);
`prepare_shard` turns its sequence fields time-major (`[T + 1, B / N, ...]`,
see `impala_tf/types.py`) and its observations into the network's compute
dtype, once per batch (the learner reuses a prepared shard for its
`--num_sgd_iter` steps); `shard_gradients` unrolls the network on a prepared
shard, computes V-trace and the losses (`impala_tf.losses`, SUMs over the shard)
and their gradient, with PopArt's batch statistics (`impala_tf.popart`) when the
network has them. The learner all-reduces what it returns, over the replicas,
and applies it.
"""

from typing import Callable, Dict, Sequence

import numpy as np
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import losses
from impala_tf import popart as popart_lib
from impala_tf import types


def clip_rewards(rewards: tf.Tensor, mode: str) -> tf.Tensor:
  """Loss-side reward clipping. rewards: float32 `[T, B]`; mode as Config."""
  if mode == 'abs_one':
    return tf.clip_by_value(rewards, -1.0, 1.0)
  if mode == 'soft_asymmetric':
    squeezed = tf.tanh(rewards / 5.0)
    return tf.where(rewards < 0, 0.3 * squeezed, squeezed) * 5.0
  return rewards


def time_major(x: tf.Tensor) -> tf.Tensor:
  """`[B, T, ...]` -> `[T, B, ...]` (the same values as `tf.transpose`).

  With static B and T it is a gather of the `B * T` rows in time-major order:
  on CPU, oneDNN's transposes of a batch's three small float fields took ~10% of
  a CartPole learner step (docs/benchmarks.md).
  """
  b, t = x.shape[0], x.shape[1]
  if b is None or t is None or x.shape[2:].num_elements() is None:
    return tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))
  rest = x.shape[2:].as_list()
  rows = np.arange(b * t).reshape(b, t).T.reshape(-1)
  return tf.reshape(tf.gather(tf.reshape(x, [b * t] + rest), rows), [t, b] + rest)


# A shard's `[B, T + 1, ...]` fields (`prepare_shard`: `[T + 1, B, ...]`).
SEQUENCE_FIELDS = ('observation', 'reward', 'terminated', 'truncated', 'first',
                   'prev_action', 'action', 'behaviour_logits')


def prepare_shard(network: tf.Module,
                  batch: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """A shard as `impala_tf.data` delivers it -> as `shard_gradients` takes it.

  Args:
    network: the learner's `AgentNetwork` (its `scale_observation`).
    batch: one replica's shard, `[B / N, T + 1, ...]` sequence fields
      (`SEQUENCE_FIELDS`; the observation in the env's dtype) and per-unroll
      fields `[B / N, ...]`.

  Returns:
    The same keys: the sequence fields time-major, `[T + 1, B / N, ...]`, the
    observation `network.scale_observation`'s (uint8 pixels -> the compute
    dtype, divided by 255); the per-unroll fields as they were. A learner that
    steps several times on one batch prepares it once: the gather, the cast and
    the scaling of a Pong batch's 4.7M pixels were paid on each of its 4 uses
    (docs/benchmarks.md: the trainer's frames/s before and after).
  """
  out = dict(batch)
  for key in SEQUENCE_FIELDS:
    out[key] = time_major(batch[key])
  out['observation'] = network.scale_observation(out['observation'])
  return out


def sum_in_order(terms: Sequence[tf.Tensor]) -> tf.Tensor:
  """`terms[0] + terms[1] + ...`, added in the same order on every replica.

  A chain of `+` becomes one `AddN` under Grappler, and `AddN` starts from
  whichever input buffer it can reuse at run time, so two replicas adding the
  same all-reduced values can round differently and their mirrors drift apart
  (seen on CPU under load: 1e-8 in the gradient, then in the weights). A sum
  over a stacked axis has one order.

  Args:
    terms: float tensors of one shape and dtype.

  Returns:
    Their sum, of that shape and dtype.
  """
  return tf.reduce_sum(tf.stack(list(terms)), axis=0)


def shard_gradients(network: tf.Module, config: config_lib.Config,
                    batch: Dict[str, tf.Tensor], term_norms: bool,
                    reduce: Callable, entropy_cost: tf.Tensor,
                    learner_steps: tf.Variable, frames_per_unroll: int,
                    num_state: int):
  """This replica's gradient and diagnostics, before the all-reduce.

  Args:
    network: the learner's `AgentNetwork`.
    config: the run's Config.
    batch: this replica's shard, prepared (`prepare_shard`): sequence fields
      `[T + 1, B / N, ...]`, the observation in the network's compute dtype.
    term_norms: bool; True returns the three weighted loss terms' gradients.
    reduce: sums a structure of tensors over the replicas (the identity for
      one replica, which lets the whole function compile with XLA).
    entropy_cost: float `[]`, the entropy cost of this step.
    learner_steps: int64 `[]`, the learner's steps so far (for the policy lag).
    frames_per_unroll: env frames of one unroll (`unroll_length * action_repeat`).
    num_state: the number of core-state tensors (`core_state_<i>` in `batch`).

  Returns:
    `(grads, diags, lag_max, popart_stats)`: grads, a list of float tensors in
    `trainable_variables` order (with `term_norms`, three such lists: policy,
    baseline, entropy); diags, a dict of float32 `[]` sums of this shard
    (`losses.compute_loss`'s, the frame counts and the policy-lag sum);
    lag_max, float32 `[]`, the shard's largest policy lag;
    popart_stats, None without PopArt, else `(new_stats, old_mu, old_sigma)`
    for `popart.apply_update`.
  """
  c = config
  obs, reward, terminated, truncated, first, prev_action, action, \
      behaviour_logits = (batch[key] for key in SEQUENCE_FIELDS)
  state = tuple(batch[f'core_state_{i}'] for i in range(num_state))
  variables = network.trainable_variables
  popart = network.popart
  discounts = c.discounting * (1.0 - tf.cast(terminated[1:], tf.float32))
  mask = tf.logical_not(tf.logical_or(terminated[:-1], truncated[:-1]))
  num_valid = tf.reduce_sum(tf.cast(mask, tf.float32))
  if c.loss_reduction == 'mean':  # The whole batch's count, on every replica.
    normalizer = tf.maximum(reduce(num_valid), 1.0)
  else:
    normalizer = 1.0
  if popart is not None:  # The statistics the forward pass uses.
    old_mu = tf.identity(popart.mu)
    old_sigma = popart.sigma_of(old_mu, tf.identity(popart.nu))  # float64
  with tf.GradientTape(persistent=term_norms) as tape:
    out, _ = network.unroll(
        types.AgentInput(obs, prev_action, reward, first), state)
    values = out.baseline
    trajectory = losses.Trajectory(
        target_logits=out.policy_logits[:-1],
        values=values[:-1],
        bootstrap_value=values[-1],
        actions=action[:-1],
        behaviour_logits=behaviour_logits[:-1],
        rewards=clip_rewards(reward[1:] * c.reward_scale, c.reward_clipping),
        discounts=discounts,
        mask=mask)
    target_options = losses.TargetOptions(
        clip_rho_threshold=c.clip_rho_threshold,
        clip_pg_rho_threshold=c.clip_pg_rho_threshold,
        lambda_=c.vtrace_lambda,
        use_vtrace=c.vtrace)
    targets = losses.compute_targets(trajectory, target_options)
    scale = 1.0
    if popart is not None:
      new_stats = popart_lib.batch_statistics(reduce, popart, targets.vs, mask,
                                              c.popart_beta)
      scale = tf.cast(popart.sigma_of(new_stats[0], new_stats[1],
                                      new_stats[3])[0], tf.float32)
    policy_advantages = None
    if c.normalize_advantages:  # Moments of the whole batch, on every replica.
      moments = reduce(list(losses.advantage_moments(targets.pg_advantages,
                                                     mask)))
      policy_advantages = losses.normalize_advantages(
          targets.pg_advantages, mask, moments)
    loss, diags = losses.compute_loss(
        trajectory,
        losses.LossOptions(baseline_cost=c.baseline_cost,
                           entropy_cost=entropy_cost, value_scale=scale,
                           normalizer=normalizer, ppo_clip=c.ppo_clip),
        target_options, targets=targets, policy_advantages=policy_advantages)
    terms = (diags['policy_loss'], c.baseline_cost * diags['baseline_loss'],
             tf.cast(entropy_cost, tf.float32) * diags['entropy_loss'])
  # PopArt: the loss above is that of the rescaled head (new statistics), but
  # the tape saw the head before the rescale; its gradient differs from the
  # rescaled head's by old_sigma / new_sigma (the torso's is already exact).
  head = {v.ref() for v in (network.baseline_head.w, network.baseline_head.b)}

  def fix_head(grads):
    if popart is None:
      return grads
    factor = scale / tf.cast(old_sigma[0], tf.float32)
    return [g * factor if v.ref() in head and g is not None else g
            for g, v in zip(grads, variables)]

  def dense(grads):
    return [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]

  if term_norms:
    term_grads = [dense(fix_head(tape.gradient(t, variables))) for t in terms]
    del tape
  else:
    grads = dense(fix_head(tape.gradient(loss, variables)))
  # Per-step bookkeeping, summed over replicas with the gradients.
  first_use = tf.equal(batch['reuse'], 0)
  replayed = batch['replayed']
  count = lambda m: tf.reduce_sum(tf.cast(m, tf.float32)) * frames_per_unroll
  lag = tf.cast(learner_steps - batch['policy_version'], tf.float32)
  extra = {
      'fresh_frames': count(first_use & ~replayed),
      'replayed_frames': count(first_use & replayed),
      'trained_frames': count(tf.ones_like(replayed)),
      'policy_lag_sum': tf.reduce_sum(lag),
      'num_unrolls': tf.cast(tf.size(lag), tf.float32),
      # 1 on a replica whose shard is empty: a learner worker whose data ended
      # gets empty shards from the distributed iterator (the learner skips it).
      'empty_shards': tf.cast(tf.equal(tf.size(lag), 0), tf.float32),
  }
  diags = dict(diags, **extra)
  popart_stats = None if popart is None else (new_stats, old_mu, old_sigma)
  return (term_grads if term_norms else grads), diags, tf.reduce_max(lag), \
      popart_stats
