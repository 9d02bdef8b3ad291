"""Tests of impala_tf.policies: a network or a SavedModel as run_episodes' policy."""

import sys

import numpy as np
import pytest

from impala_tf import checkpoints
from impala_tf import policies
from impala_tf import saved_policy
from impala_tf import testing
from impala_tf import types

_B = 4


def _inputs(step, batch=_B):
  """Observations, previous actions, rewards and first flags of one step ([B, ...])."""
  rng = np.random.default_rng(step)
  return (rng.normal(size=(batch, 3)).astype(np.float32),
          rng.integers(0, 2, size=batch).astype(np.int32),
          rng.normal(size=batch).astype(np.float32),
          np.array([step == 0] * batch))


def _network_logits(net, steps):
  """The network's own logits over `steps` steps, its state carried along."""
  state, out = net.initial_state(_B), []
  for t in range(steps):
    step_out, state = net.step(types.AgentInput(*_inputs(t)), state)
    out.append(step_out.policy_logits.numpy())
  return out


def _policy_logits(policy, steps):
  state, out = policy.initial_state(_B), []
  for t in range(steps):
    logits, state = policy(*_inputs(t), state)
    assert isinstance(logits, np.ndarray) and logits.shape == (_B, 2)
    out.append(logits)
  return out


@pytest.mark.parametrize('use_lstm', [False, True])
def test_network_policy_gives_the_networks_logits_and_carries_its_state(use_lstm):
  net = checkpoints.build_network(testing.tiny_config(use_lstm=use_lstm))
  policy = policies.NetworkPolicy(net)
  assert policy.num_actions == 2
  want = _network_logits(net, 3)
  got = _policy_logits(policy, 3)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  if use_lstm:  # The state is carried: step 2's logits depend on steps 0 and 1.
    fresh_state = policy.initial_state(_B)
    logits_from_fresh, _ = policy(*_inputs(2), fresh_state)
    assert np.abs(logits_from_fresh - got[2]).max() > 1e-6


def test_network_policy_set_weights_gives_the_other_networks_logits():
  cfg = testing.tiny_config()
  net, other = checkpoints.build_network(cfg), checkpoints.build_network(
      cfg.replace(seed=cfg.seed + 1))
  for v in other.variables:  # Different weights for sure.
    v.assign(v + 0.5)
  policy = policies.NetworkPolicy(net)
  before = _policy_logits(policy, 1)[0]
  policy.set_weights([v.numpy() for v in other.variables])
  after = _policy_logits(policy, 1)[0]
  np.testing.assert_allclose(after, _network_logits(other, 1)[0], rtol=1e-5,
                             atol=1e-6)
  assert np.abs(after - before).max() > 1e-3


@pytest.mark.parametrize('use_lstm', [False, True])
def test_saved_model_policy_gives_the_network_policys_logits(tmp_path, use_lstm):
  net = checkpoints.build_network(testing.tiny_config(use_lstm=use_lstm))
  path = str(tmp_path / 'saved_policy')
  saved_policy.save_policy(net, path)
  loaded = policies.SavedModelPolicy(path)
  assert len(loaded.initial_state(_B)) == (2 if use_lstm else 0)
  np.testing.assert_allclose(_policy_logits(loaded, 3),
                             _policy_logits(policies.NetworkPolicy(net), 3),
                             rtol=1e-5, atol=1e-6)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
