"""Evaluates a trained policy: `python -m impala_tf.evaluate --logdir=DIR`.

    python -m impala_tf.evaluate --logdir=/tmp/impala_cartpole --num_episodes=10
        [--greedy] [--source=checkpoint|saved_model] [--seed=0] [--num_envs=N]

Runs the policy of a run directory on the run's environment (`logdir/config.json`:
the env id and its preprocessing) in a gymnasium vector env, for exactly
`--num_episodes` whole episodes, and prints the mean, standard deviation, minimum and
maximum episode return: first as a human line, then as one JSON object on the last
line of stdout, e.g.

    impala_tf.evaluate: 10 episodes, sampled actions, checkpoint .../ckpt-96: return mean 500.00 std 0.00 min 500.00 max 500.00
    {"episode_length_mean": 500.0, "episode_return_max": 500.0, "episode_return_mean": 500.0, ...}

* `--source=checkpoint` (default) restores the latest checkpoint into a network
  built from config.json (works during a run, or after it was killed);
  `--source=saved_model` loads `logdir/saved_policy` with `tf.saved_model.load`
  (written when a run ends, or by `python -m impala_tf.export`).
* Actions are sampled from the policy (as the actors do), or with `--greedy` the
  most likely action. Sampling uses a numpy generator seeded with `--seed`; env `i`
  is seeded with `seed + i`, so a run is reproducible.
* Returns are game scores: unclipped rewards summed over whole episodes (whole games
  with `--episodic_life`). Each of the `--num_envs` envs plays a fixed share of the
  episodes, so short episodes are not over-represented.

Errors (no logdir, no config.json, no checkpoint or SavedModel, a bad flag) end the
program with exit status 2 and one line on stderr. TensorFlow's own start-up logs are
off unless TF_CPP_MIN_LOG_LEVEL is set or
`--verbosity=1` is passed (`impala_tf.quiet`).
"""

import dataclasses
import json
import math
import os
import sys
from typing import Dict, Optional

from impala_tf import quiet

if __name__ == '__main__':  # As a program only: importing changes no logging.
  # Before TensorFlow is imported (below).
  quiet.quiet_tensorflow(quiet.argv_verbosity(sys.argv))

# pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order
from absl import app
from absl import flags
import numpy as np
import tensorflow as tf

from impala_tf import checkpoints
from impala_tf import config as config_lib
from impala_tf import environments
from impala_tf import flags as flags_lib
from impala_tf import types

PROG = 'impala_tf.evaluate'
SOURCES = ('checkpoint', 'saved_model')
_MAX_DEFAULT_ENVS = 8


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the evaluate flags (not at import: importing defines no flags)."""
  def define(fn, name, *args, **kwargs):
    if name not in flag_values:
      fn(name, *args, flag_values=flag_values, **kwargs)

  define(flags.DEFINE_string, 'logdir', None,
         'Run directory of an impala_tf.train run (config.json, checkpoints/, '
         'saved_policy/). Required.')
  define(flags.DEFINE_integer, 'num_episodes', 10,
         'Whole episodes to play. Range: >= 1.', lower_bound=1)
  define(flags.DEFINE_bool, 'greedy', False,
         'Take the most likely action instead of sampling from the policy.')
  define(flags.DEFINE_enum, 'source', 'checkpoint', list(SOURCES),
         "'checkpoint': the latest checkpoint in LOGDIR/checkpoints; "
         "'saved_model': the SavedModel LOGDIR/saved_policy.")
  define(flags.DEFINE_integer, 'seed', 0,
         'Seed of the envs (env i gets seed + i) and of action sampling. '
         'Range: [0, 2^31).', lower_bound=0, upper_bound=2**31 - 1)
  define(flags.DEFINE_integer, 'num_envs', 0,
         f'Envs stepped together; 0: min(num_episodes, {_MAX_DEFAULT_ENVS}). '
         'Range: >= 0.', lower_bound=0)
  define(flags.DEFINE_enum, 'env_backend', None, list(config_lib.ENV_BACKENDS),
         "Atari emulator backend to evaluate on: 'gymnasium', 'envpool' or "
         "'auto'; default: the run's --env_backend. Both backends give the same "
         'observations, so a policy trained on one plays on the other.')


class _CheckpointPolicy:
  """The network restored from a checkpoint; returns logits and the new state."""

  def __init__(self, network):
    self._network = network
    self._step = tf.function(self._step_fn)
    self.num_actions = network.num_actions

  def _step_fn(self, observation, prev_action, reward, first, state):
    out, new_state = self._network.step(
        types.AgentInput(observation, prev_action, reward, first), state)
    return out.policy_logits, new_state

  def initial_state(self, batch_size: int):
    return self._network.initial_state(batch_size)

  def __call__(self, observation, prev_action, reward, first, state):
    logits, new_state = self._step(observation, prev_action, reward, first, state)
    return logits.numpy(), new_state


class _SavedModelPolicy:
  """A SavedModel from `impala_tf.export.save_policy`, used through its signature."""

  def __init__(self, path: str):
    self._model = tf.saved_model.load(path)
    self._fn = self._model.signatures['serving_default']
    _, inputs = self._fn.structured_input_signature
    self._state_specs = [inputs[k] for k in sorted(inputs)
                         if k.startswith('core_state_')]
    self._obs_dtype = inputs['observation'].dtype

  def initial_state(self, batch_size: int):
    return tuple(tf.zeros([batch_size, s.shape[-1]], s.dtype)
                 for s in self._state_specs)

  def __call__(self, observation, prev_action, reward, first, state):
    kwargs = {'observation': tf.convert_to_tensor(observation, self._obs_dtype)}
    if self._state_specs:
      kwargs.update(prev_action=tf.constant(prev_action, tf.int32),
                    reward=tf.constant(reward, tf.float32),
                    first=tf.constant(first, tf.bool))
      for i, s in enumerate(state):
        kwargs[f'core_state_{i}'] = s
    out = self._fn(**kwargs)
    new_state = tuple(out[f'core_state_{i}'] for i in range(len(self._state_specs)))
    return out['policy_logits'].numpy(), new_state


def _sample(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """One action per row of `logits` `[B, A]`, drawn from softmax(logits)."""
  z = logits - logits.max(axis=-1, keepdims=True)
  p = np.exp(z)
  p /= p.sum(axis=-1, keepdims=True)
  u = rng.random((logits.shape[0], 1))
  action = (np.cumsum(p, axis=-1) < u).sum(axis=-1)
  return np.minimum(action, logits.shape[-1] - 1).astype(np.int32)


def run_episodes(config: config_lib.Config, policy, num_episodes: int,
                 greedy: bool = False, seed: int = 0, num_envs: int = 0
                 ) -> Dict[str, object]:
  """Plays `num_episodes` whole episodes of `config.env` with `policy`.

  Args:
    config: the run's Config (env id, preprocessing, vectorization).
    policy: callable `(obs, prev_action, reward, first, state) -> (logits [B, A]
      numpy, new_state)` with `initial_state(B)`.
    num_episodes: episodes to finish, >= 1.
    greedy: argmax actions instead of samples.
    seed: env `i` gets `seed + i`; also seeds action sampling.
    num_envs: envs in the vector env; 0 for min(num_episodes, 8).

  Returns:
    dict with `episodes`, `episode_return_{mean,std,min,max}`,
    `episode_length_mean`, and the lists `episode_returns`, `episode_lengths`.
  """
  n = num_envs or min(num_episodes, _MAX_DEFAULT_ENVS)
  n = min(n, num_episodes)
  quota = np.array([num_episodes // n + (i < num_episodes % n) for i in range(n)])
  env = environments.make_vector_env(
      config.env, n, seed, vectorization=config.env_vectorization,
      backend=config.env_backend,
      **checkpoints.env_kwargs(config))
  rng = np.random.default_rng(seed)
  returns, lengths = [], []
  try:
    obs, _ = environments.reset(env, seed)
    prev_action = np.zeros(n, np.int32)
    reward = np.zeros(n, np.float32)
    first = np.ones(n, bool)
    last = np.zeros(n, bool)  # The current observation ends its episode.
    ep_return = np.zeros(n, np.float64)
    ep_length = np.zeros(n, np.int64)
    done = np.zeros(n, np.int64)
    state = policy.initial_state(n)
    while (done < quota).any():
      logits, state = policy(np.asarray(obs), prev_action, reward, first, state)
      action = (np.argmax(logits, axis=-1).astype(np.int32) if greedy
                else _sample(logits, rng))
      obs, r, terminated, truncated, infos = env.step(action)
      stepped = ~last  # NEXT_STEP autoreset: after an end, a step is a reset.
      r = np.asarray(r, np.float64)
      ep_return += np.where(stepped, r, 0.0)
      ep_length += stepped
      ended = environments.game_over(np.asarray(terminated), np.asarray(truncated),
                                     infos)
      for i in np.flatnonzero(ended):
        if done[i] < quota[i]:
          returns.append(float(ep_return[i]))
          lengths.append(int(ep_length[i]))
          done[i] += 1
        ep_return[i] = 0.0
        ep_length[i] = 0
      first = last.copy()
      prev_action = np.where(stepped, action, 0).astype(np.int32)
      reward = np.asarray(r, np.float32)
      last = np.logical_or(terminated, truncated)
  finally:
    env.close()
  rets = np.asarray(returns, np.float64)
  return {
      'episodes': len(returns),
      'episode_return_mean': float(rets.mean()),
      'episode_return_std': float(rets.std()),
      'episode_return_min': float(rets.min()),
      'episode_return_max': float(rets.max()),
      'episode_length_mean': float(np.mean(lengths)),
      'episode_returns': returns,
      'episode_lengths': lengths,
  }


def evaluate(logdir: str, num_episodes: int = 10, greedy: bool = False,
             source: str = 'checkpoint', seed: int = 0, num_envs: int = 0,
             env_backend: Optional[str] = None) -> Dict[str, object]:
  """Evaluates the policy of a run directory; see the module docstring.

  `env_backend` ('gymnasium', 'envpool', 'auto') replaces the run's
  `--env_backend`; None keeps it.

  Returns:
    `run_episodes`'s dict plus `source`, `path` (checkpoint or SavedModel),
    `greedy`, `seed`, `env`, `logdir`.

  Raises:
    checkpoints.RunDirError: no config.json, checkpoint or SavedModel.
    impala_tf.config.ConfigError: the run's env cannot be made here.
  """
  if source not in SOURCES:
    raise ValueError(f'source={source}: must be one of {", ".join(SOURCES)}')
  if source == 'checkpoint':
    config, network, path = checkpoints.restore_network(logdir)
    policy = _CheckpointPolicy(network)
  else:
    config = checkpoints.load_config(logdir)
    environments.check_env_id(config.env)
    path = os.path.join(logdir, checkpoints.SAVED_POLICY_SUBDIR)
    if not os.path.isfile(os.path.join(path, 'saved_model.pb')):
      raise checkpoints.RunDirError(
          f'--logdir={logdir}: has no SavedModel in {checkpoints.SAVED_POLICY_SUBDIR}/ '
          '(a run writes it when it ends; python -m impala_tf.export '
          f'--logdir={logdir} writes it from the latest checkpoint)')
    policy = _SavedModelPolicy(path)
  if env_backend is not None:
    config = dataclasses.replace(config, env_backend=env_backend)
  result = run_episodes(config, policy, num_episodes, greedy=greedy, seed=seed,
                        num_envs=num_envs)
  result.update(source=source, path=path, greedy=bool(greedy), seed=seed,
                env=config.env, logdir=logdir)
  return result


def _fmt(x: float) -> str:
  return f'{x:.2f}' if math.isfinite(x) else str(x)


def main(argv):
  del argv  # parse_flags rejects positional arguments.
  fv = flags.FLAGS
  if not fv.logdir:
    flags_lib.exit_with_error('--logdir is required: the run directory to evaluate',
                              PROG)
  try:
    r = evaluate(fv.logdir, fv.num_episodes, greedy=fv.greedy, source=fv.source,
                 seed=fv.seed, num_envs=fv.num_envs, env_backend=fv.env_backend)
  except checkpoints.RunDirError as e:
    flags_lib.exit_with_error(str(e), PROG)
  except config_lib.ConfigError as e:
    flags_lib.exit_with_error(f'{checkpoints.CONFIG_FILE} of --logdir: {e}', PROG)
  actions = 'greedy' if r['greedy'] else 'sampled'
  print(f"{PROG}: {r['episodes']} episodes of {r['env']}, {actions} actions, "
        f"{r['source']} {r['path']}: return mean {_fmt(r['episode_return_mean'])} "
        f"std {_fmt(r['episode_return_std'])} min {_fmt(r['episode_return_min'])} "
        f"max {_fmt(r['episode_return_max'])} (mean length "
        f"{r['episode_length_mean']:.1f})")
  print(json.dumps(r, sort_keys=True), flush=True)


def run():
  define_flags()
  app.run(main, flags_parser=lambda argv: flags_lib.parse_flags(argv, prog=PROG))


if __name__ == '__main__':
  run()
