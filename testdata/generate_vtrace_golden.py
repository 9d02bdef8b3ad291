"""Writes testdata/vtrace_golden.npz: V-trace inputs and reference outputs.

Run from the repository root:

    python testdata/generate_vtrace_golden.py

The reference (`vtrace_reference`) is written directly from the paper's equations
(Espeholt et al. 2018, eq. 1, with SEED RL's lambda): a plain float64 numpy loop over
the n-step sum, independent of `impala_tf/vtrace.py` (which solves the backward
recursion with a parallel scan). `tests/vtrace_test.py` loads this file with
importlib to reuse the reference and the case list.

File layout: `case_names` (str array) and, for each case NAME,
`NAME__<field>` arrays. Inputs: log_rhos, discounts, rewards, values (float32
`[T, B, ...]`), bootstrap_value (float32 `[B, ...]`), clip_rho_threshold,
clip_pg_rho_threshold, lambda_ (float64 scalars; NaN means None), and for logits
cases behaviour_policy_logits, target_policy_logits (float32 `[T, B, ..., A]`) and
actions (int32 `[T, B, ...]`). Outputs: vs, pg_advantages (float64 `[T, B, ...]`).
"""

import os
import sys

import numpy as np

# name, T, B, trailing dims, clip_rho, clip_pg_rho, lambda, masked fraction, logits
CASES = (
    ('b1_t5', 5, 1, (), 1.0, 1.0, 1.0, 0.0, False),
    ('b5_t5', 5, 5, (), 1.0, 1.0, 1.0, 0.0, False),
    ('b5_t5_clip_3.7_2.2', 5, 5, (), 3.7, 2.2, 1.0, 0.0, False),
    ('b5_t5_noclip', 5, 5, (), None, None, 1.0, 0.0, False),
    ('b5_t5_lambda_0.9', 5, 5, (), 1.0, 1.0, 0.9, 0.0, False),
    ('b1_t100', 100, 1, (), 1.0, 1.0, 1.0, 0.0, False),
    ('b5_t100_clip_3.7_2.2_lambda_0.9', 100, 5, (), 3.7, 2.2, 0.9, 0.0, False),
    ('b5_t100_noclip', 100, 5, (), None, None, 1.0, 0.0, False),
    ('b5x3_t5_trailing', 5, 5, (3,), 1.0, 1.0, 1.0, 0.0, False),
    ('b2x3x2_t7_trailing_lambda_0.9', 7, 2, (3, 2), 3.7, 2.2, 0.9, 0.0, False),
    ('b5_t100_masked', 100, 5, (), 1.0, 1.0, 1.0, 0.2, False),
    ('b5_t5_masked_noclip', 5, 5, (), None, None, 0.9, 0.3, False),
    ('b5_t20_logits', 20, 5, (), 1.0, 1.0, 1.0, 0.0, True),
)
NUM_ACTIONS = 4


def log_softmax(logits):
  """float64 log-softmax over the last axis of `[..., A]` logits."""
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def action_log_probs(logits, actions):
  """log softmax(logits)[..., actions] for `[T, B, ..., A]` logits, `[T, B, ...]`."""
  return np.take_along_axis(log_softmax(logits), actions[..., None], -1)[..., 0]


def vtrace_reference(log_rhos, discounts, rewards, values, bootstrap_value,
                     clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0,
                     lambda_=1.0):
  """V-trace from the paper's n-step definition, in float64 numpy.

  v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t, with
  delta_t = min(rho_bar, rho_t) (r_t + gamma_t V(x_{t+1}) - V(x_t)),
  c_i = lambda_ min(1, rho_i), V(x_T) = bootstrap_value; and
  A_s = min(rho_bar_pg, rho_s) (r_s + gamma_s v_{s+1} - V(x_s)), v_T = V(x_T).

  Args:
    log_rhos, discounts, rewards, values: `[T, B, ...]` arrays.
    bootstrap_value: `[B, ...]` array.
    clip_rho_threshold, clip_pg_rho_threshold: floats or None (no clipping).
    lambda_: float.

  Returns:
    (vs, pg_advantages), float64 `[T, B, ...]` arrays.
  """
  log_rhos, discounts, rewards, values = (
      np.asarray(x, np.float64)
      for x in (log_rhos, discounts, rewards, values))
  bootstrap_value = np.asarray(bootstrap_value, np.float64)
  num_steps = log_rhos.shape[0]
  with np.errstate(over='ignore'):
    rhos = np.exp(log_rhos)
  rho_bar = rhos if clip_rho_threshold is None else np.minimum(
      clip_rho_threshold, rhos)
  rho_bar_pg = rhos if clip_pg_rho_threshold is None else np.minimum(
      clip_pg_rho_threshold, rhos)
  cs = lambda_ * np.minimum(1.0, rhos)

  def value(t):
    return bootstrap_value if t == num_steps else values[t]

  deltas = [rho_bar[t] * (rewards[t] + discounts[t] * value(t + 1) - values[t])
            for t in range(num_steps)]
  vs = np.zeros_like(values)
  for s in range(num_steps):
    total = values[s].copy()
    trace = np.ones_like(values[s])  # prod_{i=s}^{t-1} gamma_i c_i
    for t in range(s, num_steps):
      total += trace * deltas[t]
      trace = trace * discounts[t] * cs[t]
    vs[s] = total

  pg_advantages = np.zeros_like(values)
  for s in range(num_steps):
    v_next = bootstrap_value if s + 1 == num_steps else vs[s + 1]
    pg_advantages[s] = rho_bar_pg[s] * (
        rewards[s] + discounts[s] * v_next - values[s])
  return vs, pg_advantages


def make_case(seed, num_steps, batch_size, trailing, mask_fraction, logits):
  """Seeded random float32 inputs (and logits/actions when `logits`)."""
  rng = np.random.RandomState(seed)
  shape = (num_steps, batch_size) + tuple(trailing)
  case = {}
  if logits:
    behaviour = rng.normal(size=shape + (NUM_ACTIONS,)).astype(np.float32)
    target = rng.normal(size=shape + (NUM_ACTIONS,)).astype(np.float32)
    actions = rng.randint(0, NUM_ACTIONS, size=shape).astype(np.int32)
    case.update(behaviour_policy_logits=behaviour, target_policy_logits=target,
                actions=actions)
    log_rhos = (action_log_probs(target, actions) -
                action_log_probs(behaviour, actions))
  else:
    # Spread around 0 so that rhos fall on both sides of every threshold.
    log_rhos = rng.uniform(-2.5, 2.5, size=shape)
  if mask_fraction:
    log_rhos = np.where(rng.uniform(size=shape) < mask_fraction, -np.inf, log_rhos)
  discounts = 0.99 * (rng.uniform(size=shape) > 0.1)  # some episode ends
  case.update(
      log_rhos=log_rhos.astype(np.float32),
      discounts=discounts.astype(np.float32),
      rewards=rng.normal(size=shape).astype(np.float32),
      values=rng.normal(size=shape).astype(np.float32),
      bootstrap_value=rng.normal(size=shape[1:]).astype(np.float32))
  return case


def threshold(value):
  """Encodes None as NaN for the npz file."""
  return np.float64(np.nan if value is None else value)


def decode_threshold(value):
  """The inverse of `threshold`."""
  value = float(value)
  return None if np.isnan(value) else value


def build_cases():
  """Returns {name: dict of input and output arrays} for every case in CASES."""
  cases = {}
  for seed, (name, num_steps, batch_size, trailing, clip_rho, clip_pg_rho,
             lambda_, mask_fraction, logits) in enumerate(CASES):
    case = make_case(seed, num_steps, batch_size, trailing, mask_fraction, logits)
    vs, pg_advantages = vtrace_reference(
        case['log_rhos'], case['discounts'], case['rewards'], case['values'],
        case['bootstrap_value'], clip_rho, clip_pg_rho, lambda_)
    case.update(clip_rho_threshold=threshold(clip_rho),
                clip_pg_rho_threshold=threshold(clip_pg_rho),
                lambda_=np.float64(lambda_), vs=vs, pg_advantages=pg_advantages)
    cases[name] = case
  return cases


def main(argv):
  path = argv[1] if len(argv) > 1 else os.path.join(
      os.path.dirname(os.path.abspath(__file__)), 'vtrace_golden.npz')
  cases = build_cases()
  arrays = {'case_names': np.array(list(cases))}
  for name, case in cases.items():
    for field, array in case.items():
      arrays[f'{name}__{field}'] = array
  np.savez_compressed(path, **arrays)
  print(f'wrote {path}: {len(cases)} cases')


if __name__ == '__main__':
  main(sys.argv)
