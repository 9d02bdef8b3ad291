"""PopArt: the value targets' running statistics, and the learner's update of them.

`PopArt` is the network's module of statistics (the value head predicts a
normalised value; `AgentNetwork` outputs `sigma * n(x) + mu`). `batch_statistics`
and `apply_update` are the learner's step with PopArt: the statistics moved
towards the moments of a batch's V-trace targets (float32 `[T, B]`, masked by a
bool `[T, B]`) over all replicas, then assigned with the value head rescaled so
its outputs in return units are preserved (docs/design.md, "Value scale").
"""

from typing import Callable, Optional

import tensorflow as tf


class PopArt(tf.Module):
  """PopArt's running statistics of the value targets, one set per task.

  The value head predicts a normalised value `n(x)`; in return units the value is
  `V(x) = sigma * n(x) + mu`, with `sigma` the spread `sqrt(nu - mu**2)` of the
  statistics, kept at least `sigma_floor` times the largest spread so far (`peak`)
  and within `[SIGMA_MIN, SIGMA_MAX]`. The learner moves `mu` and `nu` towards the
  moments of each batch's V-trace targets (`updated`) and rescales the head's last
  layer so that `V(x)` is unchanged (`preserve`); docs/design.md has the math. The
  moments are debiased like Adam's: the k-th update (k = 1, 2, ...) uses the step
  size `beta / (1 - (1 - beta)**k)`, so the first batch sets them outright and the
  initial `mu = 0, nu = 1` leaves no trace.

  The floor is for targets that come to be all alike, e.g. every episode reaching
  a time limit: their spread, and with it sigma, would shrink towards 0 and scale
  the value errors (and the value head's weights) up by 1/sigma until the value
  term swamps the step. Relative to the peak spread, it depends on neither the
  scale nor the shift of the returns: returns `k * G + c` give `k` times the
  sigma of `G` (a floor relative to `|mu|` moved with `c`). `mu` and `nu` are
  float64: in float32, `nu - mu**2` loses the spread of targets near 1e5.

  Variables (non-trainable, checkpointed with the network): `mu` float64
  `[num_tasks]`, `nu` float64 `[num_tasks]`, `peak` float64 `[num_tasks]` (the
  largest spread after any update; 0 before the first), `updates` float32 `[]`
  (the number of updates so far, for the debiasing). Training uses one task
  (index 0); the leading task axis keeps per-task statistics possible.
  """

  SIGMA_MIN = 1e-4
  SIGMA_MAX = 1e6

  def __init__(self, num_tasks: int = 1, sigma_floor: float = 0.0,
               name: Optional[str] = None):
    super().__init__(name=name)
    self.num_tasks = int(num_tasks)
    self.sigma_floor = float(sigma_floor)
    with self.name_scope:
      self.mu = tf.Variable(tf.zeros([self.num_tasks], tf.float64), trainable=False,
                            name='mu')
      self.nu = tf.Variable(tf.ones([self.num_tasks], tf.float64), trainable=False,
                            name='nu')
      self.updates = tf.Variable(0.0, trainable=False, name='updates')
      self.peak = tf.Variable(tf.zeros([self.num_tasks], tf.float64),
                              trainable=False, name='sigma_peak')

  @staticmethod
  def spread_of(mu: tf.Tensor, nu: tf.Tensor) -> tf.Tensor:
    """`sqrt(max(nu - mu**2, 0))`, float64 (the shape of `mu`)."""
    return tf.sqrt(tf.maximum(nu - tf.square(mu), 0.0))

  def sigma_of(self, mu: tf.Tensor, nu: tf.Tensor,
               peak: Optional[tf.Tensor] = None) -> tf.Tensor:
    """sigma (float64, the shape of `mu`) of the statistics `mu`, `nu` (float64).

    Args:
      mu, nu: float64 `[num_tasks]`.
      peak: float64 `[num_tasks]`, the largest spread so far; None reads `peak`.

    Returns:
      `clip(max(spread, sigma_floor * max(peak, spread)), SIGMA_MIN, SIGMA_MAX)`.
    """
    spread = self.spread_of(mu, nu)
    peak = self.peak if peak is None else peak
    sigma = tf.maximum(spread, self.sigma_floor * tf.maximum(
        tf.cast(peak, tf.float64), spread))
    return tf.clip_by_value(sigma, self.SIGMA_MIN, self.SIGMA_MAX)

  @property
  def sigma(self) -> tf.Tensor:
    """float32 `[num_tasks]`."""
    return tf.cast(self.sigma_of(self.mu, self.nu), tf.float32)

  @property
  def mean(self) -> tf.Tensor:
    """mu as float32 `[num_tasks]`."""
    return tf.cast(self.mu, tf.float32)

  def updated(self, mean: tf.Tensor, mean_sq: tf.Tensor, beta: float):
    """The statistics after one update with a batch's target moments.

    Args:
      mean: float64 `[num_tasks]`, the batch mean of the V-trace targets.
      mean_sq: float64 `[num_tasks]`, the batch mean of their squares.
      beta: the step size (`popart_beta`).

    Returns:
      `(mu, nu, updates, peak)`: the new values of the variables (float64,
      float64, float32, float64; nothing is assigned).
    """
    updates = self.updates + 1.0
    step = tf.cast(beta / (1.0 - tf.pow(1.0 - beta, updates)), tf.float64)
    mu = (1.0 - step) * self.mu + step * tf.cast(mean, tf.float64)
    nu = (1.0 - step) * self.nu + step * tf.cast(mean_sq, tf.float64)
    peak = tf.maximum(self.peak, self.spread_of(mu, nu))
    return mu, nu, updates, peak

  @staticmethod
  def preserve(w: tf.Tensor, b: tf.Tensor, mu: tf.Tensor, sigma: tf.Tensor,
               new_mu: tf.Tensor, new_sigma: tf.Tensor):
    """The value head's last layer rescaled so `sigma * n(x) + mu` is unchanged.

    Args:
      w: float32 `[F, num_tasks]`, b: float32 `[num_tasks]`: the layer.
      mu, sigma, new_mu, new_sigma: `[num_tasks]` (any float dtype), old and new
        statistics.

    Returns:
      `(w', b')` (float32) with `w' = sigma / sigma' * w`, `b' = (sigma * b + mu -
      mu') / sigma'`, computed in float64.
    """
    f64 = lambda x: tf.cast(x, tf.float64)
    mu, sigma, new_mu, new_sigma = map(f64, (mu, sigma, new_mu, new_sigma))
    w_new = f64(w) * (sigma / new_sigma)
    b_new = (sigma * f64(b) + mu - new_mu) / new_sigma
    return tf.cast(w_new, tf.float32), tf.cast(b_new, tf.float32)


# --- the learner's update (one train step with PopArt) ------------------------


def batch_statistics(reduce: Callable, popart: PopArt, vs: tf.Tensor,
                     mask: tf.Tensor, beta: float):
  """PopArt's statistics after this batch (nothing assigned yet).

  Args:
    reduce: sums a list of tensors over the replicas.
    popart: the network's `PopArt`.
    vs: float32 `[T, B]`, this replica's V-trace targets (return units).
    mask: bool `[T, B]`, the valid steps.
    beta: the step size (`popart_beta`).

  Returns:
    `(mu, nu, updates, peak)` as `PopArt.updated` gives them, from the moments of the
    targets of the whole batch (all-reduced: every replica gets the same); the
    old statistics when the batch has no valid step.
  """
  vs = tf.cast(vs, tf.float64)  # Sums of squares of targets near 1e5.
  zeros = tf.zeros_like(vs)
  moments = [tf.reduce_sum(tf.where(mask, vs, zeros)),
             tf.reduce_sum(tf.where(mask, tf.square(vs), zeros)),
             tf.reduce_sum(tf.cast(mask, tf.float64))]
  total, total_sq, n = reduce(moments)
  safe_n = tf.maximum(n, 1.0)
  new = popart.updated(tf.reshape(total / safe_n, [1]),
                       tf.reshape(total_sq / safe_n, [1]), beta)
  any_valid = n > 0
  return tuple(tf.where(any_valid, x, old) for x, old in zip(
      new, (popart.mu, popart.nu, popart.updates, popart.peak)))


def apply_update(ctx: tf.distribute.ReplicaContext, popart: PopArt, head,
                 new_stats, old_mu: tf.Tensor, old_sigma: tf.Tensor,
                 finite: tf.Tensor):
  """Assigns the new statistics and rescales the value head to preserve it.

  Nothing changes when `finite` is False (the update is skipped). Runs on every
  replica with identical values; the assignments go through a merge_call, so
  every mirror gets them before the optimizer applies the gradients.

  Args:
    ctx: the replica context of the train step.
    popart: the network's `PopArt`.
    head: the value head's last layer (`w` float32 `[F, num_tasks]`, `b` float32
      `[num_tasks]`), the network's `baseline_head`.
    new_stats: `(mu, nu, updates, peak)` from `batch_statistics`.
    old_mu, old_sigma: float64 `[num_tasks]`, the statistics the forward pass
      used.
    finite: bool `[]`, whether the update is applied.

  Returns:
    dict of float32 `[]`: `popart_mu`, `popart_sigma` (task 0, after the update)
    and `popart_replica_spread`, the largest difference between this worker's
    replicas in the statistics and the rescaled value head each computed (0 on
    one replica; the mirrors all get the first replica's).
  """
  mu, nu, updates, peak = [tf.where(finite, new, old) for new, old in zip(
      new_stats, (popart.mu, popart.nu, popart.updates, popart.peak))]
  sigma = popart.sigma_of(mu, nu, peak)
  w, b = popart.preserve(head.w, head.b, old_mu, old_sigma, mu, sigma)
  targets = (popart.mu, popart.nu, popart.updates, popart.peak, head.w, head.b)

  def assign_all(strategy, *values):
    spread = tf.constant(0.0, tf.float64)
    for var, value in zip(targets, values):
      # The first replica's value on every mirror: the values agree in exact
      # arithmetic, and taking one makes the mirrors equal by construction
      # (they are a few floats; the copy is free). What each replica computed
      # is kept as the spread, so a replica that computed apart shows.
      results = [tf.cast(r, tf.float64)
                 for r in strategy.experimental_local_results(value)]
      for other in results[1:]:
        spread = tf.maximum(spread, tf.reduce_max(tf.abs(other - results[0])))
      value = strategy.experimental_local_results(value)[0]
      strategy.extended.update(var, lambda v, x: v.assign(x), args=(value,),
                               group=False)
    return spread

  spread = ctx.merge_call(assign_all, args=(mu, nu, updates, peak, w, b))
  return {'popart_mu': tf.cast(mu[0], tf.float32),
          'popart_sigma': tf.cast(sigma[0], tf.float32),
          'popart_replica_spread': tf.cast(spread, tf.float32)}
