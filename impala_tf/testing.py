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

Faulty chain envs (`FaultyChainEnv`), for the tests of env failures: the chain env
that, at step 3 of an episode, raises (`ImpalaRaise-v0`), hangs
(`ImpalaHang-v0`), returns a NaN reward (`ImpalaNaNReward-v0`), an observation
with an Inf (`ImpalaInfObservation-v0`) or a finite reward so large that the loss
overflows (`ImpalaHugeReward-v0`). A fault fires every time, unless the env var
`IMPALA_TF_TESTING_FAULTS` names a directory: then each fault consumes one file of
it and none fires once it is empty (`fault_tokens()` makes them), which works
across env subprocesses.

`FakeLivesEnv` is an ALE-like env with scripted lives (`info['lives']`), for
`environments.EpisodicLifeEnv`.

`process_alive` and `processes_mentioning` (Linux /proc) let the end-to-end tests
check that a run left no process behind.

`impala_tf.testing:CartPoleX1000-v1` is CartPole-v1 with every reward multiplied
by 1000 (returns up to 500,000; value targets near 1e5 at discount 0.99): the
scale-free check of PopArt (`bench/stability.py --target=475000 --drop=300000
-- --env=impala_tf.testing:CartPoleX1000-v1 --popart`).
"""

import os
import time
from typing import Sequence

import gymnasium as gym
import numpy as np

from impala_tf import config as config_lib

CHAIN_ID = 'impala_tf.testing:ImpalaChain-v0'
CHAIN_TRUNCATED_ID = 'impala_tf.testing:ImpalaChainTruncated-v0'
FAKE_IMAGE_ID = 'impala_tf.testing:ImpalaFakeImage-v0'
CARTPOLE_X1000_ID = 'impala_tf.testing:CartPoleX1000-v1'


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


FAULTS_ENV_VAR = 'IMPALA_TF_TESTING_FAULTS'
FAULTS = {'raise': 'ImpalaRaise-v0', 'hang': 'ImpalaHang-v0',
          'nan_reward': 'ImpalaNaNReward-v0',
          'inf_observation': 'ImpalaInfObservation-v0',
          'huge_reward': 'ImpalaHugeReward-v0'}
HUGE_REWARD = 3e38  # Finite in float32; its square is not.


def faulty_id(fault: str) -> str:
  """The `--env` id of the FaultyChainEnv with `fault` (a key of FAULTS)."""
  return f'impala_tf.testing:{FAULTS[fault]}'


def fault_tokens(directory: str, count: int) -> str:
  """Creates `count` fault tokens in `directory`; returns it (for the env var)."""
  os.makedirs(directory, exist_ok=True)
  for i in range(count):
    with open(os.path.join(directory, f'token{i}'), 'w', encoding='utf-8'):
      pass
  return directory


def _claim_fault() -> bool:
  directory = os.environ.get(FAULTS_ENV_VAR)
  if not directory:
    return True
  try:
    names = sorted(os.listdir(directory))
  except OSError:
    return False
  for name in names:
    try:
      os.remove(os.path.join(directory, name))
      return True
    except OSError:
      continue  # Another env took it.
  return False


class FaultyChainEnv(ChainEnv):
  """ChainEnv whose step `at_step` of an episode is faulty (see the docstring)."""

  def __init__(self, fault: str, at_step: int = 3, length: int = 8):
    super().__init__(length)
    if fault not in FAULTS:
      raise ValueError(f'fault={fault!r}: must be one of {", ".join(FAULTS)}')
    self.fault = fault
    self.at_step = at_step

  def step(self, action):
    obs, reward, terminated, truncated, info = super().step(action)
    if self.fault == 'huge_reward':
      return obs, HUGE_REWARD, terminated, truncated, info
    if self._t != self.at_step or not _claim_fault():
      return obs, reward, terminated, truncated, info
    if self.fault == 'raise':
      raise RuntimeError(f'FaultyChainEnv: injected error at step {self._t}')
    if self.fault == 'hang':
      while True:
        time.sleep(3600)
    if self.fault == 'nan_reward':
      reward = float('nan')
    else:
      obs = obs.copy()
      obs[1] = np.inf
    return obs, reward, terminated, truncated, info


class FakeLivesEnv(gym.Env):
  """ALE-like env with scripted lives: `info['lives']` after each step.

  The default script loses a life at step 2 and ends the game at step 3, i.e.
  during the no-op step that `EpisodicLifeEnv` takes after the lost life.

  Args:
    lives: `lives[k]` is the lives count after step k + 1 of a game; the game ends
      (terminated) at the step after which it is 0, or at the script's end.
    start_lives: lives at reset.

  Observations are float32 `[1]`, the step count within the game; reward 1 per
  step; Discrete(2) actions (0 is the no-op).
  """

  metadata = {'render_modes': []}

  def __init__(self, lives: Sequence[int] = (2, 1, 0), start_lives: int = 2):
    self.observation_space = gym.spaces.Box(0, np.inf, (1,), np.float32)
    self.action_space = gym.spaces.Discrete(2)
    self._script = list(lives)
    self._start = start_lives
    self._t = 0
    self.games = 0  # Games started (resets that restart the game).

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self._t = 0
    self.games += 1
    return np.zeros(1, np.float32), {'lives': self._start}

  def step(self, action):
    del action
    self._t += 1
    lives = self._script[min(self._t, len(self._script)) - 1]
    over = lives == 0 or self._t >= len(self._script)
    return (np.array([self._t], np.float32), 1.0, over, False, {'lives': lives})


def make_cartpole_x1000(**kwargs) -> gym.Env:
  """CartPole-v1 (its time limit included) with rewards multiplied by 1000."""
  return gym.wrappers.TransformReward(gym.make('CartPole-v1', **kwargs),
                                      lambda r: 1000.0 * r)


def _register():
  if 'CartPoleX1000-v1' not in gym.registry:
    gym.register('CartPoleX1000-v1', entry_point=make_cartpole_x1000)
  if 'ImpalaChain-v0' not in gym.registry:
    gym.register('ImpalaChain-v0', entry_point=ChainEnv)
    gym.register('ImpalaChainTruncated-v0', entry_point=ChainEnv,
                 kwargs={'length': 100}, max_episode_steps=5)
    gym.register('ImpalaFakeImage-v0', entry_point=FakeImageEnv)
  for fault, name in FAULTS.items():
    if name not in gym.registry:
      gym.register(name, entry_point=FaultyChainEnv, kwargs={'fault': fault})


_register()


def process_alive(pid: int) -> bool:
  """Whether process `pid` exists and is not a zombie (Linux /proc)."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8', errors='replace') as f:
      text = f.read()
  except OSError:
    return False
  return text[text.rindex(')') + 2:].split()[0] != 'Z'


def processes_mentioning(text: str) -> Sequence[int]:
  """PIDs of the live processes, other than this one, whose command line holds
  `text` (Linux /proc; e.g. a run's logdir)."""
  pids = []
  for name in os.listdir('/proc'):
    if not name.isdigit():
      continue
    try:
      with open(f'/proc/{name}/cmdline', 'rb') as f:
        if text.encode() in f.read():
          pids.append(int(name))
    except OSError:
      continue
  return [p for p in pids if p != os.getpid() and process_alive(p)]


def tiny_config(**overrides) -> config_lib.Config:
  """A Config that trains in seconds on the chain env; override any field."""
  base = dict(
      env=CHAIN_ID, num_actors=1, num_envs_per_actor=4, unroll_length=5,
      batch_size=4, total_environment_frames=400, mlp_hidden_sizes=(16,),
      lstm_size=8, learner_queue_size=4, learner_queue_timeout=60.0,
      log_interval_secs=0.5, checkpoint_interval_secs=600.0, seed=1)
  base.update(overrides)
  return config_lib.Config(**base)
