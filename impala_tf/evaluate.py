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

With `--video=PATH` (`.mp4`, or `.gif`) the first evaluated episode (env 0's) is
also recorded as a person sees it: the env's own RGB frames (`render_mode=
'rgb_array'`; Atari: the full 210x160 color screen, not the 84x84 grayscale input of
the network), one frame after the reset and one after each step (CartPole: episode
length + 1 frames), at the env's speed (its `render_fps`, e.g. 50 for CartPole;
Atari: 60 emulator frames a second, 4 per agent step: 15), the episode's return
written on the last frame. With episodic life the video plays the whole game, the
no-op step after each lost life included. It plays on gymnasium's env ('sync'),
also for a run on EnvPool, which renders no frames: the observations are the same.
`.mp4` needs imageio and imageio-ffmpeg (which ships an ffmpeg), `.gif` only imageio:
`pip install 'impala_tf[video]'` (with pygame, which draws the classic-control envs).
The JSON line then has `video`, `video_frames` and `video_fps`.

Errors (no logdir, no config.json, no checkpoint or SavedModel, a bad flag, a
missing video encoder) end the program with exit status 2 and one line on stderr. TensorFlow's own start-up logs are
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
import gymnasium as gym
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
VIDEO_FORMATS = ('.mp4', '.gif')
VIDEO_INSTALL_HINT = "pip install 'impala_tf[video]'"
# Atari runs at 60 frames a second; an agent step is ATARI_FRAME_SKIP of them.
_ATARI_FPS = 60
_DEFAULT_FPS = 30


class VideoError(ValueError):
  """A video cannot be written (format, missing encoder, an env without frames)."""


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
  define(flags.DEFINE_string, 'video', None,
         'Also record the first episode to this file (.mp4, or .gif): the env\'s '
         'own RGB frames at its frame rate, the return on the last frame. Plays '
         "on gymnasium's env. Needs the video extra: " + VIDEO_INSTALL_HINT + '.')


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


def check_video_path(path: str) -> str:
  """Checks that a video can be written to `path`; returns its format.

  Args:
    path: the file to write, ending in .mp4 or .gif.

  Returns:
    '.mp4' or '.gif'.

  Raises:
    VideoError: another extension, or the encoder is not installed (one line
      naming the extra).
  """
  ext = os.path.splitext(path)[1].lower()
  if ext not in VIDEO_FORMATS:
    raise VideoError(f'--video={path}: must end in .mp4 or .gif')
  try:
    import imageio  # pylint: disable=g-import-not-at-top,unused-import
    import PIL  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise VideoError(f'--video={path}: writing a video needs imageio (the video '
                     f'extra): {VIDEO_INSTALL_HINT}') from None
  if ext == '.mp4':
    try:
      import imageio_ffmpeg  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise VideoError(
          f'--video={path}: an .mp4 needs the ffmpeg encoder imageio-ffmpeg (the '
          f'video extra): {VIDEO_INSTALL_HINT}; or write a .gif, which needs only '
          'imageio') from None
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise VideoError(f'--video={path}: no such directory {parent}')
  return ext


def video_fps(env_id: str, env_metadata: Dict[str, object]) -> float:
  """Frames per second that play `env_id` at its own speed (one frame a step)."""
  if environments.is_atari(env_id):
    return _ATARI_FPS / environments.action_repeat(env_id)
  fps = env_metadata.get('render_fps')
  return float(fps) if fps else float(_DEFAULT_FPS)


def _caption(frame: np.ndarray, text: str) -> np.ndarray:
  """`frame` (uint8 `[H, W, 3]`) with `text` in white on black at its top left."""
  from PIL import Image, ImageDraw, ImageFont  # pylint: disable=g-import-not-at-top,g-multiple-import
  image = Image.fromarray(frame)
  size = max(10, frame.shape[0] // 20)
  try:
    font = ImageFont.load_default(size=size)
  except TypeError:  # Pillow < 10.1: a fixed bitmap font.
    font = ImageFont.load_default()
  draw = ImageDraw.Draw(image)
  _, _, right, bottom = draw.textbbox((2, 2), text, font=font)
  draw.rectangle((0, 0, right + 2, bottom + 2), fill=(0, 0, 0))
  draw.text((2, 2), text, fill=(255, 255, 255), font=font)
  return np.asarray(image)


class VideoWriter:
  """Writes RGB frames to an .mp4 (imageio-ffmpeg, H.264) or a .gif (imageio).

  Frames are streamed to the encoder as they come (an .mp4 never holds the
  episode in memory), one behind, so that `close` can caption the last one.

  Args:
    path: ends in .mp4 or .gif (`check_video_path`).
    fps: frames per second; None until set (before the second frame), e.g. by
      `run_episodes` from the env.
  """

  def __init__(self, path: str, fps: Optional[float] = None):
    self.path = path
    self.fps = fps
    self.frames = 0
    self._format = check_video_path(path)
    self._pending = None
    self._gif_frames = []
    self._writer = None

  def add(self, frame: np.ndarray):
    """Appends one frame: uint8 `[H, W, 3]`, the size of the first frame."""
    frame = np.asarray(frame)
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
      raise VideoError(f'--video={self.path}: the env rendered a frame of shape '
                       f'{frame.shape} and dtype {frame.dtype}, not uint8 [H, W, 3]')
    if self._pending is not None:
      self._write(self._pending)
    self._pending = frame
    self.frames += 1

  def _write(self, frame: np.ndarray):
    if self._format == '.gif':
      self._gif_frames.append(frame)
      return
    if self._writer is None:
      import imageio.v2 as imageio  # pylint: disable=g-import-not-at-top
      # macro_block_size=2: H.264 (yuv420p) needs even sizes; an odd one is
      # resized up by a pixel, an even one (CartPole, Atari) kept as it is.
      self._writer = imageio.get_writer(
          self.path, format='FFMPEG', mode='I', fps=self.fps, codec='libx264',
          quality=8, macro_block_size=2, ffmpeg_log_level='error')
    self._writer.append_data(frame)

  def close(self, caption: Optional[str] = None):
    """Writes the last frame (with `caption` on it) and finishes the file."""
    if self._pending is not None:
      frame = self._pending
      if caption:
        frame = _caption(frame, caption)
      self._write(frame)
      self._pending = None
    if self._format == '.gif':
      if self._gif_frames:
        import imageio.v3 as iio  # pylint: disable=g-import-not-at-top
        # GIF delays are in hundredths of a second; loop forever.
        iio.imwrite(self.path, np.stack(self._gif_frames),
                    duration=1000.0 / self.fps, loop=0, plugin='pillow')
      self._gif_frames = []
    elif self._writer is not None:
      self._writer.close()
      self._writer = None


def _render(env, env_id: str) -> np.ndarray:
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


def _sample(logits: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """One action per row of `logits` `[B, A]`, drawn from softmax(logits)."""
  z = logits - logits.max(axis=-1, keepdims=True)
  p = np.exp(z)
  p /= p.sum(axis=-1, keepdims=True)
  u = rng.random((logits.shape[0], 1))
  action = (np.cumsum(p, axis=-1) < u).sum(axis=-1)
  return np.minimum(action, logits.shape[-1] - 1).astype(np.int32)


def run_episodes(config: config_lib.Config, policy, num_episodes: int,
                 greedy: bool = False, seed: int = 0, num_envs: int = 0,
                 video: Optional['VideoWriter'] = None) -> Dict[str, object]:
  """Plays `num_episodes` whole episodes of `config.env` with `policy`.

  Args:
    config: the run's Config (env id, preprocessing, vectorization).
    policy: callable `(obs, prev_action, reward, first, state) -> (logits [B, A]
      numpy, new_state)` with `initial_state(B)`.
    num_episodes: episodes to finish, >= 1.
    greedy: argmax actions instead of samples.
    seed: env `i` gets `seed + i`; also seeds action sampling.
    num_envs: envs in the vector env; 0 for min(num_episodes, 8).
    video: optional `VideoWriter`; gets each RGB frame (uint8 `[H, W, 3]`) of env
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
  n = num_envs or min(num_episodes, _MAX_DEFAULT_ENVS)
  n = min(n, num_episodes)
  quota = np.array([num_episodes // n + (i < num_episodes % n) for i in range(n)])
  try:
    env = environments.make_vector_env(
        config.env, n, seed, vectorization=config.env_vectorization,
        backend=config.env_backend, render_first=video is not None,
        **checkpoints.env_kwargs(config))
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
      video.add(_render(env, config.env))
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
      if recording:
        video.add(_render(env, config.env))
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


def evaluate(logdir: str, num_episodes: int = 10, greedy: bool = False,
             source: str = 'checkpoint', seed: int = 0, num_envs: int = 0,
             env_backend: Optional[str] = None,
             video: Optional[str] = None) -> Dict[str, object]:
  """Evaluates the policy of a run directory; see the module docstring.

  `env_backend` ('gymnasium', 'envpool', 'auto') replaces the run's
  `--env_backend`; None keeps it. `video`: a path ending in .mp4 or .gif to
  record env 0's first episode to (the module docstring says how).

  Returns:
    `run_episodes`'s dict plus `source`, `path` (checkpoint or SavedModel),
    `greedy`, `seed`, `env`, `logdir`; with `video` also `video` (the path),
    `video_frames`, `video_fps` and `recorded_episode`.

  Raises:
    checkpoints.RunDirError: no config.json, checkpoint or SavedModel.
    impala_tf.config.ConfigError: the run's env cannot be made here.
    VideoError: the video cannot be written (checked before anything runs, but
      for an env that renders no frames).
  """
  if source not in SOURCES:
    raise ValueError(f'source={source}: must be one of {", ".join(SOURCES)}')
  writer = None
  if video is not None:
    writer = VideoWriter(video)  # Checks the format and the encoder first.
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
  caption = None
  try:
    result = run_episodes(config, policy, num_episodes, greedy=greedy, seed=seed,
                          num_envs=num_envs, video=writer)
    if writer is not None:
      caption = f"return {result['recorded_episode']['episode_return']:g}"
  finally:
    if writer is not None:
      writer.close(caption)
  if writer is not None:
    result.update(video=video, video_frames=writer.frames, video_fps=writer.fps)
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
  if fv.video:
    # Frames are drawn off screen: no window, no sound device (SDL, as pygame
    # uses it for the classic-control envs, otherwise complains without a display).
    os.environ.setdefault('SDL_VIDEODRIVER', 'dummy')
    os.environ.setdefault('SDL_AUDIODRIVER', 'dummy')
    os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
  try:
    r = evaluate(fv.logdir, fv.num_episodes, greedy=fv.greedy, source=fv.source,
                 seed=fv.seed, num_envs=fv.num_envs, env_backend=fv.env_backend,
                 video=fv.video)
  except (checkpoints.RunDirError, VideoError) as e:
    flags_lib.exit_with_error(str(e), PROG)
  except config_lib.ConfigError as e:
    flags_lib.exit_with_error(f'{checkpoints.CONFIG_FILE} of --logdir: {e}', PROG)
  actions = 'greedy' if r['greedy'] else 'sampled'
  print(f"{PROG}: {r['episodes']} episodes of {r['env']}, {actions} actions, "
        f"{r['source']} {r['path']}: return mean {_fmt(r['episode_return_mean'])} "
        f"std {_fmt(r['episode_return_std'])} min {_fmt(r['episode_return_min'])} "
        f"max {_fmt(r['episode_return_max'])} (mean length "
        f"{r['episode_length_mean']:.1f})")
  if 'video' in r:
    rec = r['recorded_episode']
    print(f"{PROG}: video {r['video']}: {r['video_frames']} frames at "
          f"{r['video_fps']:g} fps, an episode of {rec['episode_length']} steps, "
          f"return {_fmt(rec['episode_return'])}")
  print(json.dumps(r, sort_keys=True), flush=True)


def run():
  define_flags()
  app.run(main, flags_parser=lambda argv: flags_lib.parse_flags(argv, prog=PROG))


if __name__ == '__main__':
  run()
