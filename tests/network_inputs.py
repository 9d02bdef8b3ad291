"""Test helpers for the network tests: random AgentInput batches, time slices,
parameter counts (`tests/networks_test.py`, `tests/user_torso_test.py`,
`tests/popart_test.py`).
"""

import numpy as np

from impala_tf import types

# The number of actions `random_inputs` draws `prev_action` from by default.
NUM_ACTIONS = 4


def random_inputs(lead, obs_shape, dtype, seed=0, first=None,
                  num_actions=NUM_ACTIONS):
  """Random AgentInput with leading dims `lead` (e.g. (T, B) or (B,)).

  `observation` `[*lead, *obs_shape]` of `dtype` (uint8: 0-255; else normal),
  `prev_action` int32 `[*lead]` in `[0, num_actions)`, `reward` float32
  `[*lead]`, `first` bool `[*lead]` (30% True unless given).
  """
  rng = np.random.default_rng(seed)
  if dtype == np.uint8:
    obs = rng.integers(0, 256, size=lead + obs_shape, dtype=np.uint8)
  else:
    obs = rng.normal(size=lead + obs_shape).astype(dtype)
  if first is None:
    first = rng.random(lead) < 0.3
  return types.AgentInput(
      observation=obs,
      prev_action=rng.integers(0, num_actions, size=lead).astype(np.int32),
      reward=rng.normal(scale=2.0, size=lead).astype(np.float32),
      first=np.asarray(first, bool))


def num_params(module):
  """The number of trainable parameters of a tf.Module."""
  return sum(int(np.prod(v.shape)) for v in module.trainable_variables)


def time_slice(inputs, t):
  """Step `t` of a time-major AgentInput `[T, B, ...]`: `[B, ...]`."""
  return types.AgentInput(*(x[t] for x in inputs))
