"""Your own gymnasium environment, trained by name with `--env=MODULE:ID`.

impala_tf makes environments by gymnasium id. For an id of the form `MODULE:ID` it
imports `MODULE` first, which registers the env (gymnasium's own convention), then
calls `gymnasium.make(ID)`. Importing this file registers `GuessTheSign-v0`: each
step shows a float32 observation `[2]`; action 1 pays 1 when its first entry is
positive, action 0 pays 1 otherwise; episodes last 20 steps (return 20 at best,
about 10 at random).

From the command line (run from the repository root, so `examples.custom_env` is
importable; the string is the same in `Config(env=...)`):

    python -m impala_tf.train --env=examples.custom_env:GuessTheSign-v0 \
        --total_environment_frames=20000 --logdir=/tmp/guess

Run this file: `python examples/custom_env.py` (a few seconds; the script's
directory is on sys.path, so the id is `custom_env:GuessTheSign-v0`).
"""

import os
import tempfile

import gymnasium as gym
import numpy as np

ENV_ID = 'GuessTheSign-v0'


class GuessTheSign(gym.Env):
  """Reward 1 for the action that matches the sign of the observation's x[0]."""

  metadata = {'render_modes': []}

  def __init__(self, length: int = 20):
    self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    self.action_space = gym.spaces.Discrete(2)
    self._length = length
    self._t = 0
    self._obs = None

  def _next(self):
    self._obs = self.np_random.normal(size=2).astype(np.float32)
    return self._obs

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self._t = 0
    return self._next(), {}

  def step(self, action):
    reward = float(int(action) == int(self._obs[0] > 0))
    self._t += 1
    return self._next(), reward, self._t >= self._length, False, {}


if ENV_ID not in gym.registry:
  gym.register(ENV_ID, entry_point=GuessTheSign)


def main():
  import impala_tf  # pylint: disable=g-import-not-at-top

  logdir = os.path.join(tempfile.mkdtemp(), 'guess_the_sign')
  config = impala_tf.Config(
      env=f'custom_env:{ENV_ID}', num_envs_per_actor=8, unroll_length=10,
      batch_size=8, learning_rate=0.005, total_environment_frames=4000,
      log_interval_secs=1.0, logdir=logdir)
  m = impala_tf.train(config).metrics
  print(f'{config.env}: env_frames={m["env_frames"]} episodes={m["episodes"]} '
        f'episode_return_mean={m.get("episode_return_mean")}')
  assert m['episodes'] > 0 and m['learner_steps'] > 0


if __name__ == '__main__':
  main()
