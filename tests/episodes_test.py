"""Tests for impala_tf.episodes: whole episodes, episode starts, sampling."""

import numpy as np

from impala_tf import episodes
from impala_tf import testing


class _FixedPolicy:
  """Logits that always prefer action 1; records the inputs it was given."""

  def __init__(self):
    self.firsts = []

  def initial_state(self, batch_size):
    return ()

  def __call__(self, observation, prev_action, reward, first, state):
    self.firsts.append(np.array(first))
    return np.tile(np.array([[-5.0, 5.0]], np.float32), (len(first), 1)), state


def test_run_episodes_counts_whole_episodes_and_episode_starts():
  cfg = testing.tiny_config(env=testing.CHAIN_TRUNCATED_ID)
  policy = _FixedPolicy()
  r = episodes.run_episodes(cfg, policy, num_episodes=5, num_envs=2, seed=1)
  # Truncated after 5 steps: 5 episodes of length 5 (3 in env 0, 2 in env 1).
  assert r['episode_lengths'] == [5] * 5 and r['episode_returns'] == [5.0] * 5
  firsts = np.stack(policy.firsts)
  # Step 0 starts episodes; after 5 steps the NEXT_STEP reset gives a first obs.
  assert firsts[0].all() and firsts[6].all() and not firsts[1:6].any()


def test_sample_follows_the_softmax():
  rng = np.random.default_rng(0)
  logits = np.log(np.array([[0.2, 0.8], [1.0, 1e-9]], np.float32))
  actions = np.stack([episodes.sample_actions(logits, rng) for _ in range(2000)])
  assert abs(actions[:, 0].mean() - 0.8) < 0.05
  assert (actions[:, 1] == 0).all()
