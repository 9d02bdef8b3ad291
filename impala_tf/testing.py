"""Test helpers: tiny configs and fake environments.

Importing this module registers two small gymnasium envs, usable anywhere an env id
is (the CLI included) as `impala_tf.testing:ImpalaChain-v0` and
`impala_tf.testing:ImpalaFakeImage-v0` (gymnasium imports the module before the ':'):

* `ImpalaChain-v0`: float32 `[3]` observations, Discrete(2); reward 1 per step;
  terminates after `length` steps (default 8); a 6-step time limit is NOT set, so
  episodes end by termination. `ImpalaChainTruncated-v0` is the same with a 5-step
  time limit and length 100 (every episode is truncated).
* `ImpalaFakeImage-v0`: uint8 `[36, 36, 2]` images, Discrete(3); reward 1 when the
  action equals the brightest channel-0 quadrant index mod 3; episodes of 10 steps.
"""

import gymnasium as gym
import numpy as np

from impala_tf import config as config_lib

CHAIN_ID = 'impala_tf.testing:ImpalaChain-v0'
CHAIN_TRUNCATED_ID = 'impala_tf.testing:ImpalaChainTruncated-v0'
FAKE_IMAGE_ID = 'impala_tf.testing:ImpalaFakeImage-v0'


class ChainEnv(gym.Env):
  """Deterministic episodes of `length` steps with reward 1 per step."""

  metadata = {'render_modes': []}

  def __init__(self, length: int = 8):
    self.length = length
    self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    self.action_space = gym.spaces.Discrete(2)
    self._t = 0

  def _obs(self):
    return np.array([self._t / self.length, 1.0, -1.0], np.float32)

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self._t = 0
    return self._obs(), {}

  def step(self, action):
    del action
    self._t += 1
    return self._obs(), 1.0, self._t >= self.length, False, {}


class FakeImageEnv(gym.Env):
  """Random uint8 images; the rewarded action is a function of the image."""

  metadata = {'render_modes': []}

  def __init__(self, length: int = 10):
    self.length = length
    self.observation_space = gym.spaces.Box(0, 255, (36, 36, 2), np.uint8)
    self.action_space = gym.spaces.Discrete(3)
    self._t = 0
    self._obs = None

  def _new_obs(self):
    self._obs = self.np_random.integers(0, 256, (36, 36, 2), dtype=np.uint8)
    quads = [self._obs[:18, :18, 0].mean(), self._obs[:18, 18:, 0].mean(),
             self._obs[18:, :18, 0].mean(), self._obs[18:, 18:, 0].mean()]
    self._target = int(np.argmax(quads)) % 3
    return self._obs

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self._t = 0
    return self._new_obs(), {}

  def step(self, action):
    reward = 1.0 if int(action) == self._target else 0.0
    self._t += 1
    return self._new_obs(), reward, self._t >= self.length, False, {}


def _register():
  if 'ImpalaChain-v0' not in gym.registry:
    gym.register('ImpalaChain-v0', entry_point=ChainEnv)
    gym.register('ImpalaChainTruncated-v0', entry_point=ChainEnv,
                 kwargs={'length': 100}, max_episode_steps=5)
    gym.register('ImpalaFakeImage-v0', entry_point=FakeImageEnv)


_register()


def tiny_config(**overrides) -> config_lib.Config:
  """A Config that trains in seconds on the chain env; override any field."""
  base = dict(
      env=CHAIN_ID, num_actors=1, num_envs_per_actor=4, unroll_length=5,
      batch_size=4, total_environment_frames=400, mlp_hidden_sizes=(16,),
      lstm_size=8, learner_queue_size=4, learner_queue_timeout=60.0,
      log_interval_secs=0.5, checkpoint_interval_secs=600.0, seed=1)
  base.update(overrides)
  return config_lib.Config(**base)
