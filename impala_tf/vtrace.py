"""V-trace off-policy targets (Espeholt et al. 2018, arXiv:1802.01561, eq. 1).

The signatures follow DeepMind's scalable_agent `vtrace.py`, with SEED RL's `lambda_`:

* `from_importance_weights(log_rhos, discounts, rewards, values, bootstrap_value, ...)`
  -> `VTraceReturns(vs, pg_advantages)`.
* `from_logits(behaviour_policy_logits, target_policy_logits, actions, discounts,
  rewards, values, bootstrap_value, ...)` -> `VTraceFromLogitsReturns(vs,
  pg_advantages, log_rhos, behaviour_action_log_probs, target_action_log_probs)`.
* `log_probs_from_logits_and_actions(policy_logits, actions)`.

Conventions (see `impala_tf/types.py`): time-major. The per-step inputs are
`[T, B, ...]` (rank r >= 2: time, batch, then any number of trailing batch dims),
`bootstrap_value` is `[B, ...]` (rank r - 1), policy logits are `[T, B, ..., A]`
(rank r + 1) and actions `[T, B, ...]` (rank r). Ranks are checked up front from the
static shapes; a wrong rank raises `ValueError` naming the argument. Float inputs
are converted to float32, actions must be integers.

The math, with rho_t = exp(log_rhos_t):

    clipped_rho_t = min(clip_rho_threshold, rho_t)
    c_t           = lambda_ * min(1, rho_t)
    delta_t       = clipped_rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    vs_t - V(x_t) = delta_t + gamma_t * c_t * (vs_{t+1} - V(x_{t+1})),
                    with vs_T = V(x_T) = bootstrap_value
    pg_adv_t      = min(clip_pg_rho_threshold, rho_t) * (r_t + gamma_t * vs_{t+1}
                    - V(x_t))

A threshold of None disables that clipping. Both outputs are targets: they are
wrapped in `tf.stop_gradient` (and computed from gradient-stopped inputs, so no
backward graph is recorded for them). `from_logits` returns its log-probabilities
and `log_rhos` *with* gradients, so a loss can use them.

Masked steps: a step with `log_rhos_t = -inf` (rho_t = 0, e.g. the learner's
non-transitions out of a last observation) is well defined: clipped_rho_t = c_t = 0,
so `vs_t = values_t` and `pg_advantages_t = 0` exactly, no NaN or Inf appears, and
the step cuts the trace (earlier steps see `vs_t - V(x_t) = 0` there), provided the
other inputs at that step are finite.

Cost of the backward recursion. It is the linear recurrence x_t = d_t + a_t x_{t+1}
(x_t = vs_t - V(x_t), a_t = gamma_t c_t, d_t = delta_t), solved with a parallel
(Hillis-Steele) scan over time: ceil(log2 T) rounds, each combining every step t
with step t + k (k = 1, 2, 4, ...) as d_t += a_t d_{t+k}, a_t *= a_{t+k}. Work is
O(B T log T) multiply-adds (about T log2 T, less the non-overlapping tails), the
sequential depth O(log T) rounds of a few whole-tensor ops, versus depth T (one loop
iteration per step, each a few ops) for a step-by-step loop such as `tf.scan`. Only
products and sums appear -- no logarithms, and no division by cumulative products of
discounts and traces, which underflow to 0 over long unrolls -- so a product that
underflows is harmless: its true contribution is below float32 resolution too.

`bench/vtrace_bench.py` times the op against `tf.scan` and a numpy loop
(docs/benchmarks.md, "V-trace op"): on a CPU the scan's advantage grows with T; it
should be larger on accelerators, where every sequential step costs kernel launches
and a loop-condition round trip. Under XLA (`jit_compile=True`) on a CPU a
sequential loop can be cheaper, as XLA's loop steps are cheap and the scan does
log2 T times the work. With a
static T the rounds are unrolled into the graph; with an unknown T (e.g. a `[None,
None]` placeholder) they run in a `tf.while_loop` of ceil(log2 T) iterations.
"""

import collections

import tensorflow as tf

VTraceReturns = collections.namedtuple('VTraceReturns', ['vs', 'pg_advantages'])

VTraceFromLogitsReturns = collections.namedtuple('VTraceFromLogitsReturns', [
    'vs', 'pg_advantages', 'log_rhos', 'behaviour_action_log_probs',
    'target_action_log_probs'
])

# What each argument's rank is relative to r, the rank of the [T, B, ...] inputs.
_SEQ = ('[T, B, ...]', 0)
_BOOTSTRAP = ('[B, ...]', -1)
_LOGITS = ('[T, B, ..., num_actions]', 1)


def _to_float(x, name):
  """Converts `x` to a float32 tensor (casting other real dtypes)."""
  x = tf.convert_to_tensor(x, name=name)
  if x.dtype != tf.float32:
    if not (x.dtype.is_floating or x.dtype.is_integer or x.dtype == tf.bool):
      raise TypeError(f'{name} must be a real tensor, got dtype {x.dtype.name}')
    x = tf.cast(x, tf.float32)
  return x


def _to_int(x, name):
  """Converts `x` to an integer tensor; raises TypeError for other dtypes."""
  x = tf.convert_to_tensor(x, name=name)
  if not x.dtype.is_integer:
    raise TypeError(f'{name} must be an integer tensor, got dtype {x.dtype.name}')
  return x


def _to_scalar(x, name):
  """Converts an optional threshold to a float32 scalar tensor (None stays None)."""
  if x is None:
    return None
  x = _to_float(x, name)
  if x.shape.rank is not None and x.shape.rank != 0:
    raise ValueError(f'{name} must be a scalar (rank 0), got rank {x.shape.rank} '
                     f'(shape {x.shape})')
  return x


def _check_ranks(args):
  """Checks static ranks against each other; names the odd argument out.

  Args:
    args: list of (name, tensor, (layout, offset)): the tensor must have rank
      r + offset, where r >= 2 is the rank of the `[T, B, ...]` inputs. r is taken
      as the value most arguments agree on, so the error names the argument that
      differs. Tensors of unknown rank are not checked.

  Raises:
    ValueError: naming the first argument whose rank is wrong.
  """
  votes = collections.Counter()
  for _, tensor, (_, offset) in args:
    if tensor.shape.rank is not None:
      votes[tensor.shape.rank - offset] += 1
  if not votes:
    return
  top = max(votes.values())
  # Ties go to the candidate implied by the earliest argument.
  r = next(t.shape.rank - off for _, t, (_, off) in args
           if t.shape.rank is not None and votes[t.shape.rank - off] == top)
  for name, tensor, (layout, offset) in args:
    rank = tensor.shape.rank
    if rank is not None and rank != r + offset:
      raise ValueError(
          f'{name} must have rank {r + offset} ({layout}, where the [T, B, ...] '
          f'inputs have rank {r}), got rank {rank} (shape {tensor.shape})')
  if r < 2:
    name, tensor, (layout, offset) = args[0]
    raise ValueError(
        f'{name} must have rank >= {2 + offset} ({layout}: time, batch, ...), got '
        f'rank {tensor.shape.rank} (shape {tensor.shape})')


def _check_shapes(args):
  """Checks that static shapes of same-layout arguments are compatible."""
  first_name, first = args[0]
  merged = first.shape
  for name, tensor in args[1:]:
    if not merged.is_compatible_with(tensor.shape):
      raise ValueError(f'{name} has shape {tensor.shape}, incompatible with '
                       f'{first_name} and the other inputs (shape {merged})')
    merged = merged.merge_with(tensor.shape)
  return merged


def _scan_round(a, d, k, num_steps):
  """One round of the parallel scan: combines every step t with step t + k.

  Before the round, for t < T - k + 1, `d[t]` holds the recurrence unrolled over the
  window [t, t + k) (truncated at T) and `a[t]` the product of the multipliers over
  it. The round doubles the windows: d[t] += a[t] * d[t + k] for t < T - k, and
  a[t] *= a[t + k] for the t < T - 2k that later rounds still read, so `a` shrinks
  (to length T - 2k) and the work is only where windows overlap.

  Args:
    a: float32 `[L, B, ...]`, L >= T - k, the window products.
    d: float32 `[T, B, ...]`, the window sums.
    k: int or int32 scalar tensor, the window length, 0 < k < T.
    num_steps: int or int32 scalar tensor, T.

  Returns:
    (a, d): float32 `[max(T - 2k, 0), B, ...]` and `[T, B, ...]`.
  """
  n = num_steps - k
  d = tf.concat([d[:n] + a[:n] * d[k:], d[n:]], axis=0)
  m = tf.maximum(num_steps - 2 * k, 0) if tf.is_tensor(k) else max(n - k, 0)
  return a[:m] * a[k:k + m], d


def _reverse_linear_recurrence(a, d):
  """Solves x_t = d_t + a_t * x_{t+1} backwards in time, with x_T = 0.

  Parallel (Hillis-Steele) scan: ceil(log2 T) rounds of whole-tensor ops, O(T log T)
  work; only products and sums (no division), so underflowing products are safe.

  Args:
    a: float32 `[T, B, ...]` multipliers (gamma_t * c_t).
    d: float32 `[T, B, ...]` increments (delta_t), same shape as `a`.

  Returns:
    float32 `[T, B, ...]` tensor x.
  """
  num_steps = d.shape[0] if d.shape.rank is not None else None
  if num_steps is not None:
    # Static T: unroll the rounds into the graph.
    k = 1
    while k < num_steps:
      a, d = _scan_round(a, d, k, num_steps)
      k *= 2
    return d

  # Unknown T (graph mode): the same rounds in a while loop; `a` shrinks.
  dynamic_steps = tf.shape(d)[0]

  def body(k, a_k, d_k):
    new_a, new_d = _scan_round(a_k, d_k, k, dynamic_steps)
    new_d.set_shape(d_k.shape)
    return 2 * k, new_a, new_d

  a_shape = (tf.TensorShape([None]).concatenate(a.shape[1:])
             if a.shape.rank is not None else tf.TensorShape(None))
  _, _, d = tf.while_loop(
      lambda k, a_k, d_k: k < dynamic_steps,
      body, (tf.constant(1, tf.int32), a, d),
      shape_invariants=(tf.TensorShape([]), a_shape, d.shape),
      name='parallel_scan')
  return d


def from_importance_weights(log_rhos,
                            discounts,
                            rewards,
                            values,
                            bootstrap_value,
                            clip_rho_threshold=1.0,
                            clip_pg_rho_threshold=1.0,
                            lambda_=1.0,
                            name='vtrace_from_importance_weights'):
  r"""V-trace targets and policy-gradient advantages from log importance weights.

  Shapes: r >= 2 is the rank of `log_rhos`; `[T, B, ...]` means time, batch and any
  trailing batch dims.

  Args:
    log_rhos: float32 `[T, B, ...]`, log(pi(a_t|x_t) / mu(a_t|x_t)) of the target
      policy pi and the behaviour policy mu. -inf (rho = 0) masks a step: see the
      module docstring.
    discounts: float32 `[T, B, ...]`, gamma_t: the discount applied to the value
      of step t + 1 (0 where the episode terminated at step t + 1).
    rewards: float32 `[T, B, ...]`, r_t, the reward for the action at step t.
    values: float32 `[T, B, ...]`, V(x_t) under the target policy's baseline.
    bootstrap_value: float32 `[B, ...]`, V(x_T).
    clip_rho_threshold: float32 scalar or None (no clipping): rho-bar, the clip on
      the importance weights in delta_t.
    clip_pg_rho_threshold: float32 scalar or None (no clipping): the clip on the
      importance weights of the policy-gradient advantage.
    lambda_: float32 scalar, the trace coefficient: c_t = lambda_ * min(1, rho_t)
      (SEED RL; 1.0 is the paper's V-trace).
    name: name scope of the ops.

  Returns:
    `VTraceReturns` of float32 `[T, B, ...]` tensors, both stop-gradient:
      vs: the V-trace value targets v_t.
      pg_advantages: min(clip_pg_rho_threshold, rho_t) * (r_t + gamma_t v_{t+1} -
        V(x_t)), with v_T = bootstrap_value.

  Raises:
    ValueError: an argument has the wrong static rank (the message names it), the
      static shapes disagree, or a threshold is not a scalar.
    TypeError: an argument is not a real-valued tensor.
  """
  with tf.name_scope(name):
    log_rhos = _to_float(log_rhos, 'log_rhos')
    discounts = _to_float(discounts, 'discounts')
    rewards = _to_float(rewards, 'rewards')
    values = _to_float(values, 'values')
    bootstrap_value = _to_float(bootstrap_value, 'bootstrap_value')
    clip_rho_threshold = _to_scalar(clip_rho_threshold, 'clip_rho_threshold')
    clip_pg_rho_threshold = _to_scalar(clip_pg_rho_threshold,
                                       'clip_pg_rho_threshold')
    lambda_ = _to_scalar(1.0 if lambda_ is None else lambda_, 'lambda_')

    _check_ranks([
        ('log_rhos', log_rhos, _SEQ),
        ('discounts', discounts, _SEQ),
        ('rewards', rewards, _SEQ),
        ('values', values, _SEQ),
        ('bootstrap_value', bootstrap_value, _BOOTSTRAP),
    ])
    merged = _check_shapes([('log_rhos', log_rhos), ('discounts', discounts),
                            ('rewards', rewards), ('values', values)])
    if merged.rank is not None and not merged[1:].is_compatible_with(
        bootstrap_value.shape):
      raise ValueError(f'bootstrap_value has shape {bootstrap_value.shape}, '
                       f'incompatible with values[0] (shape {merged[1:]})')

    return _vtrace(log_rhos, discounts, rewards, values, bootstrap_value,
                   clip_rho_threshold, clip_pg_rho_threshold, lambda_)


def _vtrace(log_rhos, discounts, rewards, values, bootstrap_value,
            clip_rho_threshold, clip_pg_rho_threshold, lambda_):
  """The V-trace computation on validated float32 inputs (see the caller)."""
  log_rhos, discounts, rewards, values, bootstrap_value = (
      tf.stop_gradient(t)
      for t in (log_rhos, discounts, rewards, values, bootstrap_value))
  rhos = tf.exp(log_rhos)
  clipped_rhos = (rhos if clip_rho_threshold is None else
                  tf.minimum(clip_rho_threshold, rhos, name='clipped_rhos'))
  cs = lambda_ * tf.minimum(1.0, rhos, name='cs')
  values_t_plus_1 = tf.concat([values[1:], bootstrap_value[None]], axis=0)
  deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)

  vs_minus_values = _reverse_linear_recurrence(discounts * cs, deltas)
  vs = tf.add(vs_minus_values, values, name='vs')

  vs_t_plus_1 = tf.concat([vs[1:], bootstrap_value[None]], axis=0)
  clipped_pg_rhos = (rhos if clip_pg_rho_threshold is None else
                     tf.minimum(clip_pg_rho_threshold, rhos,
                                name='clipped_pg_rhos'))
  pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_t_plus_1 - values)
  return VTraceReturns(
      vs=tf.stop_gradient(vs),
      pg_advantages=tf.stop_gradient(pg_advantages, name='pg_advantages'))


def log_probs_from_logits_and_actions(policy_logits, actions):
  """Log-probabilities of the taken actions under a softmax policy.

  Args:
    policy_logits: float32 `[T, B, ..., num_actions]` unnormalised logits.
    actions: int32 or int64 `[T, B, ...]`, values in [0, num_actions).

  Returns:
    float32 `[T, B, ...]`: log softmax(policy_logits)[..., actions]. Differentiable
    with respect to `policy_logits`.

  Raises:
    ValueError: a wrong static rank (the message names the argument).
    TypeError: `actions` is not an integer tensor.
  """
  policy_logits = _to_float(policy_logits, 'policy_logits')
  actions = _to_int(actions, 'actions')
  logits_rank, actions_rank = policy_logits.shape.rank, actions.shape.rank
  if actions_rank is not None and actions_rank < 2:
    raise ValueError(f'actions must have rank >= 2 ([T, B, ...]), got rank '
                     f'{actions_rank} (shape {actions.shape})')
  if (logits_rank is not None and actions_rank is not None and
      logits_rank != actions_rank + 1):
    raise ValueError(
        f'policy_logits must have rank {actions_rank + 1} ([T, B, ..., '
        f'num_actions], one more than actions), got rank {logits_rank} (shape '
        f'{policy_logits.shape}); actions has shape {actions.shape}')
  return -tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=actions, logits=policy_logits)


def from_logits(behaviour_policy_logits,
                target_policy_logits,
                actions,
                discounts,
                rewards,
                values,
                bootstrap_value,
                clip_rho_threshold=1.0,
                clip_pg_rho_threshold=1.0,
                lambda_=1.0,
                name='vtrace_from_logits'):
  r"""V-trace for softmax policies, from the two policies' logits.

  Shapes: `[T, B, ...]` means time, batch and any trailing batch dims (rank r >= 2).

  Args:
    behaviour_policy_logits: float32 `[T, B, ..., num_actions]`, the logits of the
      policy mu that acted.
    target_policy_logits: float32 `[T, B, ..., num_actions]`, the logits of the
      learner's policy pi.
    actions: int32 or int64 `[T, B, ...]`, the actions taken, in [0, num_actions).
    discounts: float32 `[T, B, ...]`, as in `from_importance_weights`.
    rewards: float32 `[T, B, ...]`, as in `from_importance_weights`.
    values: float32 `[T, B, ...]`, as in `from_importance_weights`.
    bootstrap_value: float32 `[B, ...]`, as in `from_importance_weights`.
    clip_rho_threshold: float32 scalar or None, as in `from_importance_weights`.
    clip_pg_rho_threshold: float32 scalar or None, as in `from_importance_weights`.
    lambda_: float32 scalar, as in `from_importance_weights`.
    name: name scope of the ops.

  Returns:
    `VTraceFromLogitsReturns` of float32 `[T, B, ...]` tensors:
      vs, pg_advantages: as in `from_importance_weights` (stop-gradient).
      log_rhos: target_action_log_probs - behaviour_action_log_probs.
      behaviour_action_log_probs: log mu(a_t|x_t).
      target_action_log_probs: log pi(a_t|x_t).
    The last three keep their gradients with respect to the logits.

  Raises:
    ValueError: an argument has the wrong static rank (the message names it), the
      static shapes disagree, or a threshold is not a scalar.
    TypeError: `actions` is not an integer tensor, or another argument is not
      real-valued.
  """
  with tf.name_scope(name):
    behaviour_policy_logits = _to_float(behaviour_policy_logits,
                                        'behaviour_policy_logits')
    target_policy_logits = _to_float(target_policy_logits, 'target_policy_logits')
    actions = _to_int(actions, 'actions')
    discounts = _to_float(discounts, 'discounts')
    rewards = _to_float(rewards, 'rewards')
    values = _to_float(values, 'values')
    bootstrap_value = _to_float(bootstrap_value, 'bootstrap_value')
    _check_ranks([
        ('behaviour_policy_logits', behaviour_policy_logits, _LOGITS),
        ('target_policy_logits', target_policy_logits, _LOGITS),
        ('actions', actions, _SEQ),
        ('discounts', discounts, _SEQ),
        ('rewards', rewards, _SEQ),
        ('values', values, _SEQ),
        ('bootstrap_value', bootstrap_value, _BOOTSTRAP),
    ])
    _check_shapes([('behaviour_policy_logits', behaviour_policy_logits),
                   ('target_policy_logits', target_policy_logits)])

    target_action_log_probs = log_probs_from_logits_and_actions(
        target_policy_logits, actions)
    behaviour_action_log_probs = log_probs_from_logits_and_actions(
        behaviour_policy_logits, actions)
    log_rhos = target_action_log_probs - behaviour_action_log_probs
    vtrace_returns = from_importance_weights(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_)
    return VTraceFromLogitsReturns(
        vs=vtrace_returns.vs,
        pg_advantages=vtrace_returns.pg_advantages,
        log_rhos=log_rhos,
        behaviour_action_log_probs=behaviour_action_log_probs,
        target_action_log_probs=target_action_log_probs)
