"""Whole episodes of a policy on a run's env: the loop of evaluations.

`run_episodes(config, policy, K)` plays exactly K whole episodes of `config.env`
(with the run's preprocessing) in a vector env and returns their returns and
lengths; `python -m impala_tf.evaluate` and the evaluations during training
(`impala_tf.periodic_eval`) both use it. A policy is any callable
`(observation [B, ...], prev_action int32 [B], reward float32 [B], first bool [B],
state) -> (logits float32 [B, A] numpy, new state)` with `initial_state(B)`.
Returns are game scores: unclipped rewards summed over whole episodes. Each env
plays a fixed share of the K episodes, so short episodes are not over-represented.
"""

from typing import Dict

import gymnasium as gym
import numpy as np

from impala_tf import config as config_lib
from impala_tf import environments

# Envs stepped together when the caller does not say.
MAX_DEFAULT_ENVS = 8
VIDEO_INSTALL_HINT = "pip install 'impala_tf[video]'"
# Atari runs at 60 frames a second; an agent step is its action repeat of them.
_ATARI_FPS = 60
_DEFAULT_FPS = 30


class VideoError(ValueError):
  """A video cannot be written (format, missing encoder, an env without frames)."""


def video_fps(env_id: str, env_metadata: Dict[str, object]) -> float:
  """Frames per second that play `env_id` at its own speed (one frame a step)."""
  if environments.is_atari(env_id):
    return _ATARI_FPS / environments.action_repeat(env_id)
  fps = env_metadata.get('render_fps')
  return float(fps) if fps else float(_DEFAULT_FPS)


def render(env, env_id: str) -> np.ndarray:
  """The RGB frame of env 0 of a `render_first` vector env."""
  try:
    frame = env.envs[0].render()
  except gym.error.DependencyNotInstalled as e:
    raise VideoError(f'--video: {env_id} draws its frames with a package that is '
                     f'not installed ({e}): {VIDEO_INSTALL_HINT}') from None
  except NotImplementedError:
    frame = None
  if frame is None:
    raise VideoError(f'--video: {env_id} renders no RGB frames (render_modes: '
                     f'{env.envs[0].metadata.get("render_modes")})')
  return np.asarray(frame)


def sample_actions(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """One action per row of `logits` `[B, A]`, drawn from softmax(logits)."""
  z = logits - logits.max(axis=-1, keepdims=True)
  p = np.exp(z)
  p /= p.sum(axis=-1, keepdims=True)
  u = rng.random((logits.shape[0], 1))
  action = (np.cumsum(p, axis=-1) < u).sum(axis=-1)
  return np.minimum(action, logits.shape[-1] - 1).astype(np.int32)


def run_episodes(config: config_lib.Config, policy, num_episodes: int,
                 greedy: bool = False, seed: int = 0, num_envs: int = 0,
                 video=None) -> Dict[str, object]:
  """Plays `num_episodes` whole episodes of `config.env` with `policy`.

  Args:
    config: the run's Config (env id, preprocessing, vectorization).
    policy: callable `(obs, prev_action, reward, first, state) -> (logits [B, A]
      numpy, new_state)` with `initial_state(B)`.
    num_episodes: episodes to finish, >= 1.
    greedy: argmax actions instead of samples.
    seed: env `i` gets `seed + i`; also seeds action sampling.
    num_envs: envs in the vector env; 0 for min(num_episodes, 8).
    video: optional `evaluate.VideoWriter` (or any object with `add(frame)` and
      a settable `fps`); gets each RGB frame (uint8 `[H, W, 3]`) of env
      0's first episode: after the reset, then after each step up to the one
      that ends it (the caller closes it). Its `fps`, if None, becomes the env's
      (`video_fps`). The envs are then a gymnasium 'sync' vector env whose env 0
      renders (`environments.make_vector_env(render_first=True)`).

  Returns:
    dict with `episodes`, `episode_return_{mean,std,min,max}`,
    `episode_length_mean`, and the lists `episode_returns`, `episode_lengths`
    With `video` also `recorded_episode`: `episode_return` and
    `episode_length` of the episode it recorded.

  Raises:
    VideoError: with `video`, the env renders no RGB frames.
  """
  n = num_envs or min(num_episodes, MAX_DEFAULT_ENVS)
  n = min(n, num_episodes)
  quota = np.array([num_episodes // n + (i < num_episodes % n) for i in range(n)])
  try:
    env = environments.make_vector_env(
        config.env, n, seed, vectorization=config.env_vectorization,
        backend=config.env_backend, render_first=video is not None,
        **environments.env_kwargs(config))
  except TypeError as e:
    if video is None or 'render_mode' not in str(e):
      raise
    raise VideoError(f'--video: {config.env} renders no RGB frames (it takes no '
                     'render_mode)') from None
  rng = np.random.default_rng(seed)
  returns, lengths = [], []
  recorded = None
  recording = video is not None
  try:
    obs, _ = environments.reset(env, seed)
    if recording:
      if video.fps is None:
        video.fps = video_fps(config.env, env.envs[0].metadata)
      video.add(render(env, config.env))
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
                else sample_actions(logits, rng))
      obs, r, terminated, truncated, infos = env.step(action)
      stepped = ~last  # NEXT_STEP autoreset: after an end, a step is a reset.
      r = np.asarray(r, np.float64)
      ep_return += np.where(stepped, r, 0.0)
      ep_length += stepped
      ended = environments.game_over(np.asarray(terminated), np.asarray(truncated),
                                     infos)
      if recording:
        video.add(render(env, config.env))
        if ended[0]:
          recording = False
          recorded = {'episode_return': float(ep_return[0]),
                      'episode_length': int(ep_length[0])}
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
  result = {} if video is None else {'recorded_episode': recorded}
  return {
      **result,
      'episodes': len(returns),
      'episode_return_mean': float(rets.mean()),
      'episode_return_std': float(rets.std()),
      'episode_return_min': float(rets.min()),
      'episode_return_max': float(rets.max()),
      'episode_length_mean': float(np.mean(lengths)),
      'episode_returns': returns,
      'episode_lengths': lengths,
  }
