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
missing video encoder) end the program with exit status 2 and one line on stderr;
all but an unreadable checkpoint are found before TensorFlow is imported, in about a
second. TensorFlow's own start-up logs are off unless TF_CPP_MIN_LOG_LEVEL is set or
`--verbosity=1` is passed (`impala_tf.quiet`).
"""

import dataclasses
import json
import math
import os
import sys
from typing import Dict, Optional

from absl import flags
import numpy as np

from impala_tf import config as config_lib
from impala_tf import environments
from impala_tf import episodes
from impala_tf import flags as flags_lib
from impala_tf import quiet
from impala_tf import rundir

PROG = 'impala_tf.evaluate'
SOURCES = ('checkpoint', 'saved_model')
VIDEO_FORMATS = ('.mp4', '.gif')
VIDEO_INSTALL_HINT = episodes.VIDEO_INSTALL_HINT


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
         f'Envs stepped together; 0: min(num_episodes, {episodes.MAX_DEFAULT_ENVS}). '
         'Range: >= 0.', lower_bound=0)
  define(flags.DEFINE_enum, 'env_backend', None, list(config_lib.ENV_BACKENDS),
         "Atari emulator backend to evaluate on: 'gymnasium', 'envpool' or "
         "'auto'; default: the run's --env_backend. Both backends give the same "
         'observations, so a policy trained on one plays on the other.')
  define(flags.DEFINE_string, 'video', None,
         'Also record the first episode to this file (.mp4, or .gif): the env\'s '
         'own RGB frames at its frame rate, the return on the last frame. Plays '
         "on gymnasium's env. Needs the video extra: " + VIDEO_INSTALL_HINT + '.')


def check_video_path(path: str) -> str:
  """Checks that a video can be written to `path`; returns its format.

  Args:
    path: the file to write, ending in .mp4 or .gif.

  Returns:
    '.mp4' or '.gif'.

  Raises:
    episodes.VideoError: another extension, or the encoder is not installed (one line
      naming the extra).
  """
  ext = os.path.splitext(path)[1].lower()
  if ext not in VIDEO_FORMATS:
    raise episodes.VideoError(f'--video={path}: must end in .mp4 or .gif')
  try:
    import imageio  # pylint: disable=g-import-not-at-top,unused-import
    import PIL  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise episodes.VideoError(f'--video={path}: writing a video needs imageio (the video '
                     f'extra): {VIDEO_INSTALL_HINT}') from None
  if ext == '.mp4':
    try:
      import imageio_ffmpeg  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise episodes.VideoError(
          f'--video={path}: an .mp4 needs the ffmpeg encoder imageio-ffmpeg (the '
          f'video extra): {VIDEO_INSTALL_HINT}; or write a .gif, which needs only '
          'imageio') from None
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise episodes.VideoError(f'--video={path}: no such directory {parent}')
  return ext


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
      raise episodes.VideoError(f'--video={self.path}: the env rendered a frame of shape '
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


def check_run_dir(logdir: str, source: str = 'checkpoint') -> None:
  """Checks, without TensorFlow, that `logdir` has what `source` needs.

  Raises:
    rundir.RunDirError: no such directory, no config.json, no checkpoint files
      (source 'checkpoint') or no SavedModel (source 'saved_model').
    impala_tf.config.ConfigError: the run's env cannot be made here.
  """
  if source == 'checkpoint':
    rundir.check_checkpoint_run(logdir)
    return
  config = rundir.load_config(logdir)
  environments.check_env_id(config.env)
  path = os.path.join(logdir, rundir.SAVED_POLICY_SUBDIR)
  if not os.path.isfile(os.path.join(path, 'saved_model.pb')):
    raise rundir.RunDirError(
        f'--logdir={logdir}: has no SavedModel in {rundir.SAVED_POLICY_SUBDIR}/ '
        '(a run writes it when it ends; python -m impala_tf.export '
        f'--logdir={logdir} writes it from the latest checkpoint)')


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
    rundir.RunDirError: no config.json, checkpoint or SavedModel.
    impala_tf.config.ConfigError: the run's env cannot be made here.
    episodes.VideoError: the video cannot be written (checked before anything runs, but
      for an env that renders no frames).
  """
  if source not in SOURCES:
    raise ValueError(f'source={source}: must be one of {", ".join(SOURCES)}')
  writer = None
  if video is not None:
    writer = VideoWriter(video)  # Checks the format and the encoder first.
  check_run_dir(logdir, source)  # Before TensorFlow is imported (below).
  # pylint: disable=g-import-not-at-top
  from impala_tf import checkpoints
  from impala_tf import policies
  # pylint: enable=g-import-not-at-top
  if source == 'checkpoint':
    config, network, path = checkpoints.restore_network(logdir)
    policy = policies.NetworkPolicy(network)
  else:
    config = rundir.load_config(logdir)
    path = os.path.join(logdir, rundir.SAVED_POLICY_SUBDIR)
    policy = policies.SavedModelPolicy(path)
  if env_backend is not None:
    config = dataclasses.replace(config, env_backend=env_backend)
  caption = None
  try:
    result = episodes.run_episodes(config, policy, num_episodes, greedy=greedy, seed=seed,
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
    if fv.video:
      check_video_path(fv.video)
    check_run_dir(fv.logdir, fv.source)
    # The inputs are checked: now TensorFlow is imported, quietly.
    quiet.quiet_tensorflow(quiet.argv_verbosity(sys.argv))
    r = evaluate(fv.logdir, fv.num_episodes, greedy=fv.greedy, source=fv.source,
                 seed=fv.seed, num_envs=fv.num_envs, env_backend=fv.env_backend,
                 video=fv.video)
  except (rundir.RunDirError, episodes.VideoError) as e:
    flags_lib.exit_with_error(str(e), PROG)
  except config_lib.ConfigError as e:
    flags_lib.exit_with_error(f'{rundir.CONFIG_FILE} of --logdir: {e}', PROG)
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
  flags_lib.run_program(main, PROG, define_flags)


if __name__ == '__main__':
  run()
