"""The IMPALA loss: policy gradient, baseline and entropy terms with V-trace targets.

Shapes follow `impala_tf/types.py`: time-major `[T, B, ...]`, here the `T` steps of an
unroll that carry a loss (the learner drops the bootstrap step `T` and passes its value
as `bootstrap_value`). `A` is the number of actions.

Reduction. Every term is a SUM over the valid steps of `T` and `B` (as in the paper and
scalable_agent), never a mean. Hence a batch split across N replicas, each computing
the loss of its slice and its gradient, all-reduced with SUM, gives exactly the
single-device loss and gradient of the whole batch; the learning rate therefore has the
scale of the paper's (a sum over `T * B` steps). The diagnostics are sums and counts for
the same reason: all-reduce them with SUM, then call `summarize_diagnostics`.

Masking. `mask[t, b]` is False where step `t` is not a real transition (the step after
an episode end under gymnasium's NEXT_STEP autoreset, see types.py). There the
log importance weight is set to -inf (rho = 0): the V-trace target `vs` equals the
step's own value, its policy-gradient advantage is 0 and the trace is cut (c = 0), and
all three loss terms are zeroed. The value of a masked step still serves as V(x_{t})
for the step before it, which is how a truncated episode bootstraps from the value of
its final observation.

Total loss: `policy + baseline_cost * baseline + entropy_cost * entropy`, with

  policy   = sum_valid -log pi(a_t | x_t) * A_t / s      (A_t: V-trace pg advantage)
             or, with ppo_clip = eps > 0, the clipped surrogate
             sum_valid -min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t) / s with
             r_t = pi(a_t | x_t) / mu(a_t | x_t) (`clipped_surrogate_loss`)
  baseline = sum_valid 0.5 * ((vs_t - V(x_t)) / s)**2    (vs_t: V-trace target)
  entropy  = sum_valid -H(pi(. | x_t))                    (negative entropy: a bonus)

each divided by `normalizer` (1 for the paper's sums; the number of valid steps of
the whole batch for `loss_reduction='mean'`). `s` is `value_scale`: 1, or PopArt's
sigma (then `(vs_t - V(x_t)) / s` is the error of the normalised value head, and the
step no longer depends on the reward scale). `A_t` and `vs_t` are targets: no
gradient flows through them. With the paper's `baseline_cost = 0.5` the effective
baseline weight is 0.25, as in scalable_agent.

Inputs and outputs are structures: a `Trajectory` (the batch as the loss reads
it), `TargetOptions` (the V-trace settings) and `LossOptions` (the weights and
scales); `compute_loss` returns a `LossOutput` (the loss and its diagnostics, which
unpacks as `loss, diagnostics`). `compute_targets` gives the V-trace targets alone
(the learner needs them first with PopArt, to move the statistics before the loss);
`compute_loss` computes them unless given. `vtrace.from_importance_weights` keeps
scalable_agent's API for code that wants the op alone.
"""

import collections
from typing import Dict, NamedTuple, Optional, Tuple, Union

import tensorflow as tf

from impala_tf import vtrace

Scalar = Union[float, tf.Tensor]

# Keys of the diagnostics dict returned by `compute_loss`; all float32 `[]` sums or
# counts over the valid steps, all-reducible with SUM.
DIAGNOSTIC_KEYS = (
    'loss',               # The total loss.
    'policy_loss',        # Sum of the policy-gradient term (unscaled).
    'baseline_loss',      # Sum of 0.5 * (vs - V)**2 (before baseline_cost).
    'entropy_loss',       # Sum of -H(pi) (before entropy_cost).
    'num_valid',          # Number of valid steps.
    'entropy_sum',        # Sum of H(pi) (nats).
    'rho_sum',            # Sum of pi(a)/mu(a), unclipped (even with use_vtrace=False).
    'rho_clipped_count',  # Valid steps with rho > clip_rho_threshold.
    'advantage_sum',      # Sum of the pg advantages.
    'advantage_sq_sum',   # Sum of the squared pg advantages.
    'value_sum',          # Sum of the baseline values V(x_t).
    'log_rho_abs_sum',    # Sum of |log rho|: how far the learner is from the actor.
    'rho_above_1p1_count',  # Valid steps with rho > 1.1.
    'ppo_clipped_count',  # Valid steps whose clipped surrogate had no gradient.
)

# The V-trace targets of a batch, all float32 `[T, B]` and without gradient:
# `vs` the value targets, `pg_advantages` the policy-gradient advantages (both in
# return units; 0 and V(x_t) on masked steps), `log_ratio` log pi(a_t) - log mu(a_t).
VTraceTargets = collections.namedtuple('VTraceTargets',
                                       ['vs', 'pg_advantages', 'log_ratio'])


class Trajectory(NamedTuple):
  """A batch as the loss reads it: the `T` steps that carry a loss, time-major.

  Attributes:
    target_logits: float32 `[T, B, A]`, the learner policy's logits (differentiated).
    values: float32 `[T, B]`, the learner baseline V(x_t) in return units
      (differentiated).
    bootstrap_value: float32 `[B]`, V(x_T), the value after the last step.
    actions: int32/int64 `[T, B]`, the actions taken by the actors.
    behaviour_logits: float32 `[T, B, A]`, the actors' logits (no gradient).
    rewards: float32 `[T, B]`, the (clipped) reward for action t, r_t.
    discounts: float32 `[T, B]`, gamma_t = discounting * (1 - terminated_{t+1}).
    mask: bool `[T, B]`, False where step t is not a real transition.
  """
  target_logits: tf.Tensor
  values: tf.Tensor
  bootstrap_value: tf.Tensor
  actions: tf.Tensor
  behaviour_logits: tf.Tensor
  rewards: tf.Tensor
  discounts: tf.Tensor
  mask: tf.Tensor


class TargetOptions(NamedTuple):
  """How the V-trace targets are computed.

  Attributes:
    clip_rho_threshold: float or None (no clipping), V-trace rho-bar.
    clip_pg_rho_threshold: float or None (no clipping), rho-bar for the advantages.
    lambda_: float in [0, 1], V-trace lambda (1 in the paper).
    use_vtrace: bool. False: no off-policy correction, rho = 1 on every valid step
      (no clipping applies), i.e. n-step returns; masked steps still have rho = 0.
  """
  clip_rho_threshold: Optional[float] = 1.0
  clip_pg_rho_threshold: Optional[float] = 1.0
  lambda_: float = 1.0
  use_vtrace: bool = True


class LossOptions(NamedTuple):
  """The weights and scales of the loss terms.

  Attributes:
    baseline_cost: float or float32 `[]` tensor, the baseline term's weight.
    entropy_cost: float or float32 `[]` tensor (it may be scheduled), the weight of
      the negative-entropy term.
    value_scale: float or float32 `[]` > 0, `s` of the module docstring: the value
      errors and the advantages are divided by it (PopArt's sigma; 1 without).
    normalizer: float or float32 `[]` > 0; every term is divided by it (1: sums).
    ppo_clip: float >= 0. 0: the policy term is IMPALA's `-log pi(a_t) * A_t`;
      > 0: the clipped surrogate of `clipped_surrogate_loss` with this epsilon,
      over the same advantages.
  """
  baseline_cost: Scalar
  entropy_cost: Scalar
  value_scale: Scalar = 1.0
  normalizer: Scalar = 1.0
  ppo_clip: float = 0.0


class LossOutput(NamedTuple):
  """What `compute_loss` returns (unpacks as `loss, diagnostics`).

  Attributes:
    loss: float32 `[]`, the total described in the module docstring.
    diagnostics: dict with the keys of `DIAGNOSTIC_KEYS`, each a float32 `[]` sum
      or count over the valid steps. `policy_loss`, `baseline_loss` and
      `entropy_loss` are the terms as optimised (divided by `value_scale` and
      `normalizer`, before the costs; differentiable); `advantage_*` are in return
      units.
  """
  loss: tf.Tensor
  diagnostics: Dict[str, tf.Tensor]


def _check_rank(name: str, x: tf.Tensor, rank: int):
  if x.shape.rank is not None and x.shape.rank != rank:
    raise ValueError(f'{name} must have rank {rank}, got shape {x.shape}')


def policy_gradient_loss(logits, actions, advantages) -> tf.Tensor:
  """Per-step policy-gradient loss, `-log pi(a_t) * stop_gradient(A_t)`.

  Args:
    logits: float32 `[T, B, A]`, the target policy's logits.
    actions: int32 or int64 `[T, B]`, the actions taken.
    advantages: float32 `[T, B]`; no gradient flows into them.

  Returns:
    float32 `[T, B]`.
  """
  logits = tf.convert_to_tensor(logits, tf.float32)
  actions = tf.convert_to_tensor(actions)
  advantages = tf.convert_to_tensor(advantages, tf.float32)
  _check_rank('logits', logits, 3)
  _check_rank('actions', actions, 2)
  _check_rank('advantages', advantages, 2)
  neg_log_pi = tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=actions, logits=logits)
  return neg_log_pi * tf.stop_gradient(advantages)


def clipped_surrogate_loss(logits, behaviour_logits, actions, advantages,
                           epsilon: Scalar) -> Tuple[tf.Tensor, tf.Tensor]:
  """Per-step clipped-surrogate policy loss (PPO's, over V-trace's advantages).

  `-min(r_t * A_t, clip(r_t, 1 - epsilon, 1 + epsilon) * A_t)` with the ratio
  `r_t = pi(a_t | x_t) / mu(a_t | x_t)` of the learner's policy to the behaviour
  policy the actor sampled `a_t` from (the reference of Sample Factory's APPO).
  The gradient flows through `pi` only; where the clipped term is the smaller, the
  step gets no gradient, so a batch used several times cannot push the policy
  further than `1 +/- epsilon` from the one that collected it.

  Args:
    logits: float32 `[T, B, A]`, the learner policy's logits (differentiated).
    behaviour_logits: float32 `[T, B, A]`, the actors' logits (no gradient).
    actions: int32 or int64 `[T, B]`, the actions taken.
    advantages: float32 `[T, B]`; no gradient flows into them.
    epsilon: float or float32 `[]` in (0, 1), the clip range.

  Returns:
    `(loss, clipped)`: float32 `[T, B]` and bool `[T, B]`, True where the clip
    took the gradient away (`r_t` outside `1 +/- epsilon` on the side the
    advantage pushes it).
  """
  logits = tf.convert_to_tensor(logits, tf.float32)
  behaviour_logits = tf.convert_to_tensor(behaviour_logits, tf.float32)
  actions = tf.convert_to_tensor(actions)
  advantages = tf.stop_gradient(tf.convert_to_tensor(advantages, tf.float32))
  _check_rank('logits', logits, 3)
  _check_rank('behaviour_logits', behaviour_logits, 3)
  _check_rank('actions', actions, 2)
  _check_rank('advantages', advantages, 2)
  epsilon = tf.cast(epsilon, tf.float32)
  log_pi = vtrace.log_probs_from_logits_and_actions(logits, actions)
  log_mu = tf.stop_gradient(
      vtrace.log_probs_from_logits_and_actions(behaviour_logits, actions))
  ratio = tf.exp(log_pi - log_mu)
  unclipped = ratio * advantages
  clipped = tf.clip_by_value(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantages
  return -tf.minimum(unclipped, clipped), clipped < unclipped


def baseline_loss(vs, values) -> tf.Tensor:
  """Per-step baseline loss, `0.5 * (stop_gradient(vs_t) - V(x_t))**2`.

  Args:
    vs: float32 `[T, B]`, the value targets; no gradient flows into them.
    values: float32 `[T, B]`, the baseline's predictions.

  Returns:
    float32 `[T, B]`.
  """
  vs = tf.convert_to_tensor(vs, tf.float32)
  values = tf.convert_to_tensor(values, tf.float32)
  _check_rank('vs', vs, 2)
  _check_rank('values', values, 2)
  return 0.5 * tf.square(tf.stop_gradient(vs) - values)


def entropy_loss(logits) -> tf.Tensor:
  """Per-step negative entropy, `-H(pi) = sum_a pi(a) log pi(a)`.

  Adding `entropy_cost * entropy_loss` to the loss rewards entropy.

  Args:
    logits: float32 `[T, B, A]`.

  Returns:
    float32 `[T, B]`, <= 0.
  """
  logits = tf.convert_to_tensor(logits, tf.float32)
  _check_rank('logits', logits, 3)
  log_pi = tf.nn.log_softmax(logits)
  return tf.reduce_sum(tf.exp(log_pi) * log_pi, axis=-1)


def compute_targets(trajectory: Trajectory,
                    options: TargetOptions = TargetOptions()) -> VTraceTargets:
  """The V-trace targets of a batch.

  Args:
    trajectory: the batch (see `Trajectory`).
    options: the V-trace settings.

  Returns:
    VTraceTargets, each float32 `[T, B]`, stop-gradient.

  Raises:
    ValueError: on inputs of the wrong rank.
  """
  t = _checked(trajectory)
  target_logits, values, bootstrap_value, actions = (
      t.target_logits, t.values, t.bootstrap_value, t.actions)
  behaviour_logits, rewards, discounts, mask = (
      t.behaviour_logits, t.rewards, t.discounts, t.mask)
  target_log_pi = vtrace.log_probs_from_logits_and_actions(target_logits, actions)
  behaviour_log_pi = vtrace.log_probs_from_logits_and_actions(
      behaviour_logits, actions)
  log_ratio = tf.stop_gradient(target_log_pi - behaviour_log_pi)
  neg_inf = tf.fill(tf.shape(log_ratio), tf.constant(-float('inf'), tf.float32))
  if options.use_vtrace:
    log_rhos = tf.where(mask, log_ratio, neg_inf)
    rho_clip, pg_rho_clip = (options.clip_rho_threshold,
                             options.clip_pg_rho_threshold)
  else:
    log_rhos = tf.where(mask, tf.zeros_like(log_ratio), neg_inf)
    rho_clip, pg_rho_clip = None, None
  returns = vtrace.from_importance_weights(
      log_rhos=log_rhos, discounts=discounts, rewards=rewards,
      values=tf.stop_gradient(values),
      bootstrap_value=tf.stop_gradient(bootstrap_value),
      clip_rho_threshold=rho_clip, clip_pg_rho_threshold=pg_rho_clip,
      lambda_=options.lambda_)
  return VTraceTargets(vs=tf.stop_gradient(returns.vs),
                       pg_advantages=tf.stop_gradient(returns.pg_advantages),
                       log_ratio=log_ratio)


def _checked(trajectory: Trajectory) -> Trajectory:
  """The trajectory as tensors of its dtypes; ValueError on a wrong rank."""
  t = Trajectory(
      target_logits=tf.convert_to_tensor(trajectory.target_logits, tf.float32),
      values=tf.convert_to_tensor(trajectory.values, tf.float32),
      bootstrap_value=tf.convert_to_tensor(trajectory.bootstrap_value, tf.float32),
      actions=tf.convert_to_tensor(trajectory.actions),
      behaviour_logits=tf.convert_to_tensor(trajectory.behaviour_logits,
                                            tf.float32),
      rewards=tf.convert_to_tensor(trajectory.rewards, tf.float32),
      discounts=tf.convert_to_tensor(trajectory.discounts, tf.float32),
      mask=tf.convert_to_tensor(trajectory.mask, tf.bool))
  for name, rank in (('target_logits', 3), ('behaviour_logits', 3), ('values', 2),
                     ('bootstrap_value', 1), ('actions', 2), ('rewards', 2),
                     ('discounts', 2), ('mask', 2)):
    _check_rank(name, getattr(t, name), rank)
  return t


def compute_loss(trajectory: Trajectory,
                 options: LossOptions,
                 target_options: TargetOptions = TargetOptions(),
                 targets: Optional[VTraceTargets] = None,
                 policy_advantages=None) -> LossOutput:
  """The IMPALA loss of a batch (or of one replica's slice of it).

  Args:
    trajectory: the batch (see `Trajectory`).
    options: the terms' weights and scales (see `LossOptions`).
    target_options: the V-trace settings (see `TargetOptions`); also the rho-bar
      of the `rho_clipped_count` diagnostic.
    targets: the batch's `compute_targets(trajectory, target_options)`, if already
      computed.
    policy_advantages: float32 `[T, B]` or None: the advantages of the policy term
      as given (e.g. normalised, see `normalize_advantages`), used in place of
      `pg_advantages / value_scale`; the diagnostics still describe the V-trace
      advantages.

  Returns:
    LossOutput(loss, diagnostics).

  Raises:
    ValueError: on inputs of the wrong rank.
  """
  if targets is None:
    targets = compute_targets(trajectory, target_options)
  t = _checked(trajectory)
  target_logits, values, actions, mask = (t.target_logits, t.values, t.actions,
                                          t.mask)
  behaviour_logits = t.behaviour_logits
  vs, advantages, log_ratio = targets
  scale = tf.cast(options.value_scale, tf.float32)
  normalizer = tf.cast(options.normalizer, tf.float32)
  ppo_clip = options.ppo_clip
  clip_rho_threshold = target_options.clip_rho_threshold

  zeros = tf.zeros_like(values)
  if policy_advantages is None:
    policy_advantages = advantages / scale
  if ppo_clip:
    pg, ppo_clipped = clipped_surrogate_loss(target_logits, behaviour_logits,
                                             actions, policy_advantages, ppo_clip)
  else:
    pg = policy_gradient_loss(target_logits, actions, policy_advantages)
    ppo_clipped = tf.zeros_like(mask)
  pg = tf.where(mask, pg, zeros)
  bl = tf.where(mask, baseline_loss(vs / scale, values / scale), zeros)
  ent = tf.where(mask, entropy_loss(target_logits), zeros)
  pg_sum = tf.reduce_sum(pg) / normalizer
  bl_sum = tf.reduce_sum(bl) / normalizer
  ent_raw = tf.reduce_sum(ent)
  ent_sum = ent_raw / normalizer
  baseline_cost = tf.cast(options.baseline_cost, tf.float32)
  entropy_cost = tf.cast(options.entropy_cost, tf.float32)
  loss = pg_sum + baseline_cost * bl_sum + entropy_cost * ent_sum

  def masked_sum(x):
    return tf.reduce_sum(tf.where(mask, x, zeros))

  rhos = tf.exp(log_ratio)
  if clip_rho_threshold is None:
    clipped = tf.zeros_like(mask)
  else:
    clipped = tf.logical_and(mask, rhos > clip_rho_threshold)
  count = lambda m: tf.reduce_sum(tf.cast(m, tf.float32))
  diagnostics = {
      'loss': loss,
      'policy_loss': pg_sum,
      'baseline_loss': bl_sum,
      'entropy_loss': ent_sum,
      'num_valid': count(mask),
      'entropy_sum': -ent_raw,
      'rho_sum': masked_sum(rhos),
      'rho_clipped_count': count(clipped),
      'advantage_sum': masked_sum(advantages),
      'advantage_sq_sum': masked_sum(tf.square(advantages)),
      'value_sum': masked_sum(tf.stop_gradient(values)),
      'log_rho_abs_sum': masked_sum(tf.abs(log_ratio)),
      'rho_above_1p1_count': count(tf.logical_and(mask, rhos > 1.1)),
      'ppo_clipped_count': count(tf.logical_and(mask, ppo_clipped)),
  }
  return LossOutput(loss, diagnostics)


def normalize_advantages(advantages, mask, moments=None) -> tf.Tensor:
  """Advantages with zero mean and unit variance over the valid steps.

  Args:
    advantages: float32 `[T, B]`.
    mask: bool `[T, B]`, the valid steps.
    moments: optional `(sum, sum of squares, count)` float32 `[]` each, over the
      whole batch (the learner all-reduces them across replicas); None computes
      them from `advantages` and `mask`.

  Returns:
    float32 `[T, B]`, `(A - mean) / (std + 1e-6)` on valid steps, 0 elsewhere;
    no gradient.
  """
  advantages = tf.convert_to_tensor(advantages, tf.float32)
  mask = tf.convert_to_tensor(mask, tf.bool)
  if moments is None:
    moments = advantage_moments(advantages, mask)
  total, total_sq, n = moments
  n = tf.maximum(n, 1.0)
  mean = total / n
  std = tf.sqrt(tf.maximum(total_sq / n - tf.square(mean), 0.0))
  out = (advantages - mean) / (std + 1e-6)
  return tf.stop_gradient(tf.where(mask, out, tf.zeros_like(out)))


def advantage_moments(advantages, mask):
  """`(sum, sum of squares, count)` of the valid advantages, float32 `[]` each."""
  zeros = tf.zeros_like(advantages)
  return (tf.reduce_sum(tf.where(mask, advantages, zeros)),
          tf.reduce_sum(tf.where(mask, tf.square(advantages), zeros)),
          tf.reduce_sum(tf.cast(mask, tf.float32)))


def summarize_diagnostics(sums) -> Dict[str, float]:
  """Turns (possibly all-reduced) diagnostic sums into Python floats for logging.

  Args:
    sums: a dict with (at least) the keys of `DIAGNOSTIC_KEYS` (as `compute_loss`
      returns them, or their SUM over replicas): scalar tensors, numpy values or
      numbers. Other keys are ignored.

  Returns:
    A dict of Python floats: `loss`, `policy_loss`, `baseline_loss`, `entropy_loss`
    (the sums, i.e. the quantities optimized), `num_valid`, and the per-valid-step
    means `entropy`, `rho_mean`, `rho_clip_fraction`, `advantage_mean`,
    `advantage_std` (population std), `value_mean`, `log_rho_abs_mean` (mean
    |log pi(a)/mu(a)|, the policy lag as the learner sees it) and
    `rho_above_1p1_fraction` and `ppo_clip_fraction` (the share of steps whose
    clipped surrogate had no gradient; 0 without it) (0.0 when `num_valid` is 0).
  """
  value = lambda x: float(x.numpy() if hasattr(x, 'numpy') else x)
  # `ppo_clipped_count` may be absent (sums written before it existed).
  s = {k: value(sums[k]) for k in DIAGNOSTIC_KEYS
       if k in sums or k != 'ppo_clipped_count'}
  s.setdefault('ppo_clipped_count', 0.0)
  n = s['num_valid']

  def mean(key):
    return s[key] / n if n > 0 else 0.0

  adv_mean = mean('advantage_sum')
  adv_var = max(mean('advantage_sq_sum') - adv_mean**2, 0.0)
  return {
      'loss': s['loss'],
      'policy_loss': s['policy_loss'],
      'baseline_loss': s['baseline_loss'],
      'entropy_loss': s['entropy_loss'],
      'num_valid': n,
      'entropy': mean('entropy_sum'),
      'rho_mean': mean('rho_sum'),
      'rho_clip_fraction': mean('rho_clipped_count'),
      'advantage_mean': adv_mean,
      'advantage_std': adv_var**0.5,
      'value_mean': mean('value_sum'),
      'log_rho_abs_mean': mean('log_rho_abs_sum'),
      'rho_above_1p1_fraction': mean('rho_above_1p1_count'),
      'ppo_clip_fraction': mean('ppo_clipped_count'),
  }
