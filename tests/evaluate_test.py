"""Tests of impala_tf/evaluate.py: `python -m impala_tf.evaluate` on a finished run.

The chain env (impala_tf.testing) gives reward 1 per step and ends after 8 steps
whatever the actions, so every episode returns exactly 8: mean 8, std 0.
"""

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys

import gymnasium as gym
import imageio.v3 as iio
import numpy as np
import pytest

from impala_tf import checkpoints
from impala_tf import driver
from impala_tf import envpool_env
from impala_tf import episodes
from impala_tf import evaluate
from impala_tf import flags as flags_lib
from impala_tf import policies
from impala_tf import rundir
from impala_tf import testing

import helpers

REPO = helpers.REPO
PROG = 'impala_tf.evaluate'

# TensorFlow's C++ runtime logs a few lines to stderr at import time, before any of
# our code runs (TF_CPP_MIN_LOG_LEVEL does not silence them all); they are not ours.
_NATIVE_LOG_RE = helpers.NATIVE_LOG_RE


def _python(args, timeout=180):
  return helpers.run_python(args, timeout=timeout)


_own_stderr_lines = helpers.own_stderr_lines


def _json_line(stdout):
  lines = [l for l in stdout.splitlines() if l.startswith('{')]
  assert lines, stdout
  return json.loads(lines[-1])


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """A tiny finished LSTM run of the chain env (checkpoint and saved_policy)."""
  logdir = str(tmp_path_factory.mktemp('run'))
  driver.train(testing.tiny_config(logdir=logdir, use_lstm=True,
                                   total_environment_frames=120))
  return logdir


@pytest.fixture(scope='module')
def cli(run, tmp_path_factory):
  """The evaluate command lines, run at once (TF's import dominates). Other
  errors are tested on the library function, in this process."""
  tmp = tmp_path_factory.mktemp('cli')
  no_checkpoint = tmp / 'no_checkpoint'
  no_checkpoint.mkdir()
  shutil.copy(os.path.join(run, 'config.json'), no_checkpoint)
  # A copy of the run whose newest checkpoint is garbage (as a disk-full save or a
  # copy cut short leaves it): evaluation warns and uses the one before.
  damaged = tmp / 'damaged'
  shutil.copytree(run, damaged)
  for suffix in ('index', 'data-00000-of-00001'):
    (damaged / 'checkpoints' / f'ckpt-999999.{suffix}').write_bytes(b'\0garbage')
  commands = {
      'damaged_latest': [f'--logdir={damaged}', '--num_episodes=2'],
      'default': [f'--logdir={run}', '--num_episodes=5'],
      'greedy_saved_model': [f'--logdir={run}', '--num_episodes=7', '--greedy',
                             '--source=saved_model', '--seed=3', '--num_envs=3'],
      'missing': [f'--logdir={tmp / "missing"}', '--num_episodes=2'],
      'no_checkpoint': [f'--logdir={no_checkpoint}'],
      'bad_flag': [f'--logdir={run}', '--num_episodes=0'],
  }
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    futures = {k: pool.submit(_python, ['-m', 'impala_tf.evaluate', *args])
               for k, args in commands.items()}
    return {k: f.result() for k, f in futures.items()}


@pytest.mark.e2e
def test_cli_prints_mean_std_min_max_of_the_checkpoint_policy(cli, run):
  result = cli['default']
  assert result.returncode == 0, result.stderr[-3000:]
  human = [l for l in result.stdout.splitlines() if l.startswith(f'{PROG}: ')]
  assert len(human) == 1, result.stdout
  assert re.search(r'return mean 8\.00 std 0\.00 min 8\.00 max 8\.00', human[0])
  r = _json_line(result.stdout)
  assert r['episodes'] == 5
  assert r['episode_return_mean'] == 8.0
  assert r['episode_return_std'] == 0.0
  assert r['episode_return_min'] == 8.0 and r['episode_return_max'] == 8.0
  assert r['episode_returns'] == [8.0] * 5
  assert r['source'] == 'checkpoint'
  assert r['path'] == checkpoints.latest_checkpoint(run)
  assert r['greedy'] is False


@pytest.mark.e2e
def test_cli_skips_an_unreadable_newest_checkpoint_with_one_warning(cli, run):
  result = cli['damaged_latest']
  assert result.returncode == 0, result.stderr[-3000:]
  r = _json_line(result.stdout)
  damaged_dir = os.path.dirname(os.path.dirname(r['path']))  # .../checkpoints/ckpt-N
  lines = _own_stderr_lines(result.stderr)
  assert len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith(
      f'impala_tf: warning: checkpoint {damaged_dir}/checkpoints/ckpt-999999 '
      'cannot be read ('), lines[0]
  assert os.path.basename(r['path']) == os.path.basename(
      checkpoints.latest_checkpoint(run))
  assert r['episode_return_mean'] == 8.0


@pytest.mark.e2e
def test_cli_greedy_from_the_saved_model(cli, run):
  result = cli['greedy_saved_model']
  assert result.returncode == 0, result.stderr[-3000:]
  r = _json_line(result.stdout)
  assert r['episodes'] == 7  # 3 envs play 3 + 2 + 2 episodes.
  assert (r['episode_return_mean'], r['episode_return_std']) == (8.0, 0.0)
  assert r['episode_lengths'] == [8] * 7
  assert r['source'] == 'saved_model'
  assert r['path'] == os.path.join(run, 'saved_policy')
  assert r['greedy'] is True and r['seed'] == 3


@pytest.mark.parametrize('case,message', [
    ('missing', 'no such directory'),
    ('no_checkpoint', 'has no checkpoint'),
    ('bad_flag', '--num_episodes=0'),
])
def test_cli_errors_are_one_line_exit_2(cli, case, message):
  result = cli[case]
  assert result.returncode == 2, (result.stdout, result.stderr[-3000:])
  lines = _own_stderr_lines(result.stderr)
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith(f'{PROG}: error: '), lines[0]
  assert message in lines[0], lines[0]
  assert 'Traceback' not in result.stderr
  assert result.stdout == ''


@pytest.mark.e2e
def test_cli_input_errors_come_before_tensorflow_is_imported(run, tmp_path):
  no_checkpoint = tmp_path / 'no_checkpoint'
  no_checkpoint.mkdir()
  shutil.copy(os.path.join(run, 'config.json'), no_checkpoint)
  cases = [
      ([f'--logdir={tmp_path / "missing"}'], 'no such directory'),
      ([f'--logdir={no_checkpoint}'], 'has no checkpoint'),
      ([f'--logdir={run}', '--source=saved_model', '--video=x.avi'],
       'must end in .mp4 or .gif'),
      ([f'--logdir={run}', '--num_episodes=0'], '--num_episodes=0'),
  ]
  for args, message in cases:
    code, tensorflow_imported, stderr = helpers.exit_without_tensorflow(
        'impala_tf.evaluate', args)
    assert code == 2 and message in stderr, (args, stderr[-2000:])
    # TensorFlow < 2.15 is imported before the flags are parsed (flags.py).
    assert tensorflow_imported == flags_lib.imports_tensorflow_before_app(), args


@pytest.mark.e2e
def test_library_errors_say_what_is_missing(run, tmp_path):
  with pytest.raises(rundir.RunDirError, match='no such directory'):
    evaluate.evaluate(str(tmp_path / 'missing'))
  shutil.copy(os.path.join(run, 'config.json'), tmp_path)
  with pytest.raises(rundir.RunDirError, match='has no checkpoint'):
    evaluate.evaluate(str(tmp_path))
  with pytest.raises(rundir.RunDirError, match='has no SavedModel'):
    evaluate.evaluate(str(tmp_path), source='saved_model')


def _fixed_logits(policy, steps=3, batch=5):
  """`policy`'s logits on fixed inputs over `steps` steps, state fed back."""
  rng = np.random.default_rng(0)
  state = policy.initial_state(batch)
  logits = []
  for t in range(steps):
    out, state = policy(rng.normal(size=(batch, 3)).astype(np.float32),
                        rng.integers(0, 2, batch).astype(np.int32),
                        rng.normal(size=batch).astype(np.float32),
                        np.full(batch, t == 0), state)
    logits.append(np.asarray(out))
  return np.stack(logits)


@pytest.mark.e2e
def test_library_evaluate_sources_agree(run, monkeypatch):
  # The chain env pays every policy the same, so equal returns prove nothing: the
  # policies evaluate() loads from each source are compared on fixed inputs.
  logits = {}
  real_run_episodes = episodes.run_episodes

  def run_episodes(config, policy, *args, **kwargs):
    logits[len(logits)] = _fixed_logits(policy)
    return real_run_episodes(config, policy, *args, **kwargs)

  monkeypatch.setattr(episodes, 'run_episodes', run_episodes)
  by_ckpt = evaluate.evaluate(run, num_episodes=4, greedy=True)
  by_model = evaluate.evaluate(run, num_episodes=4, greedy=True,
                               source='saved_model')
  for r in (by_ckpt, by_model):
    assert r['episode_returns'] == [8.0] * 4
  np.testing.assert_allclose(logits[1], logits[0], atol=1e-5)
  # The comparison can fail: an untrained network of the run's shape differs.
  fresh = checkpoints.build_network(rundir.load_config(run))
  untrained = _fixed_logits(policies.NetworkPolicy(fresh))
  assert np.abs(untrained - logits[0]).max() > 1e-4
  with pytest.raises(ValueError, match='source=x'):
    evaluate.evaluate(run, source='x')


def _decode(path):
  """All frames of a video file: uint8 [N, H, W, 3]."""
  if path.endswith('.gif'):
    return np.asarray(iio.imread(path, index=None, plugin='pillow'))[..., :3]
  return np.stack(list(iio.imiter(path, plugin='FFMPEG')))


@pytest.fixture(scope='module')
def cartpole_run(tmp_path_factory):
  """A short CartPole run: a few hundred frames (the policy barely learned)."""
  logdir = str(tmp_path_factory.mktemp('cartpole'))
  driver.train(testing.tiny_config(env='CartPole-v1', logdir=logdir,
                                   total_environment_frames=400))
  return logdir


def _render_size(env_id):
  env = gym.make(env_id, render_mode='rgb_array')
  try:
    env.reset(seed=0)
    return env.render().shape
  finally:
    env.close()


@pytest.mark.e2e
def test_video_mp4_of_cartpole_decodes_one_frame_per_step(cartpole_run, tmp_path):
  path = str(tmp_path / 'episode.mp4')
  r = evaluate.evaluate(cartpole_run, num_episodes=3, greedy=True, video=path)
  frames = _decode(path)
  length = r['recorded_episode']['episode_length']
  assert r['recorded_episode']['episode_return'] == float(length)  # 1 a step.
  assert length in r['episode_lengths']
  # One frame after the reset and one after each step of the episode.
  assert frames.shape == (length + 1, *_render_size('CartPole-v1')), frames.shape
  assert r['video_frames'] == length + 1
  assert r['video'] == path and r['video_fps'] == 50.0  # CartPole's render_fps.
  assert iio.immeta(path, plugin='FFMPEG')['fps'] == 50.0
  # The env's own frames: the first is what CartPole (seed 0) draws after reset
  # (H.264 is lossy: close, not equal); the cart moves, so frames differ.
  env = gym.make('CartPole-v1', render_mode='rgb_array')
  env.reset(seed=0)
  first = env.render()
  env.close()
  assert np.abs(frames[0].astype(int) - first).mean() < 3
  assert np.abs(frames[1].astype(int) - frames[-2]).mean() > 0.1
  # The last frame carries the return as a caption at its top left: dark pixels
  # where CartPole's sky is white.
  assert frames[-1][:10, :10].mean() < 128 < frames[-2][:10, :10].mean()


@pytest.mark.e2e
def test_video_gif_from_the_saved_model_by_the_cli(cartpole_run, tmp_path):
  path = str(tmp_path / 'episode.gif')
  result = _python(['-m', 'impala_tf.evaluate', f'--logdir={cartpole_run}',
                    '--num_episodes=2', '--source=saved_model', f'--video={path}'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert _own_stderr_lines(result.stderr) == [], result.stderr[-3000:]
  r = _json_line(result.stdout)
  assert r['source'] == 'saved_model' and r['video'] == path
  length = r['recorded_episode']['episode_length']
  assert r['video_frames'] == length + 1
  assert re.search(rf'^{PROG}: video {re.escape(path)}: {length + 1} frames at 50 fps',
                   result.stdout, re.M), result.stdout
  frames = _decode(path)
  assert frames.shape[1:] == _render_size('CartPole-v1')
  # A GIF shows a repeated frame once, for longer: the duration is that of
  # length + 1 frames at 50 fps (20 ms each).
  assert 1 < len(frames) <= length + 1
  durations = [iio.immeta(path, index=i, plugin='pillow')['duration']
               for i in range(len(frames))]
  assert sum(durations) == pytest.approx(20 * (length + 1))


@pytest.mark.e2e
def test_video_needs_the_encoder_one_line_naming_the_extra(cartpole_run, tmp_path):
  # imageio-ffmpeg made unimportable: a module of its name that raises.
  blocker = tmp_path / 'blocker'
  blocker.mkdir()
  (blocker / 'imageio_ffmpeg.py').write_text(
      "raise ImportError('No module named imageio_ffmpeg')\n")
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join([str(blocker), str(REPO),
                                       env.get('PYTHONPATH', '')])
  path = tmp_path / 'episode.mp4'
  result = subprocess.run(
      [sys.executable, '-m', 'impala_tf.evaluate', f'--logdir={cartpole_run}',
       f'--video={path}'], cwd=REPO, env=env, capture_output=True, text=True,
      timeout=180)
  assert result.returncode == 2, (result.stdout, result.stderr[-3000:])
  lines = _own_stderr_lines(result.stderr)
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith(f'{PROG}: error: --video={path}: '), lines[0]
  assert 'imageio-ffmpeg' in lines[0] and "pip install 'impala_tf[video]'" in lines[0]
  assert result.stdout == '' and not path.exists()


@pytest.mark.e2e
def test_video_errors(run, tmp_path):
  with pytest.raises(episodes.VideoError, match=r'--video=x\.avi: must end in '
                     r'\.mp4 or \.gif'):
    evaluate.check_video_path('x.avi')
  with pytest.raises(episodes.VideoError, match='no such directory'):
    evaluate.check_video_path(str(tmp_path / 'missing' / 'x.mp4'))
  # The chain env draws nothing.
  with pytest.raises(episodes.VideoError, match='renders no RGB frames'):
    evaluate.evaluate(run, num_episodes=1, video=str(tmp_path / 'chain.gif'))


@pytest.fixture(scope='module')
def atari_run(tmp_path_factory):
  """A Pong run of a few thousand frames, episodes cut at 400 frames."""
  pytest.importorskip('ale_py')
  logdir = str(tmp_path_factory.mktemp('pong'))
  driver.train(testing.tiny_config(
      env='PongNoFrameskip-v4', logdir=logdir, total_environment_frames=2000,
      max_episode_frames=400, num_envs_per_actor=2, batch_size=2))
  return logdir


@pytest.mark.e2e
@pytest.mark.parametrize('backend', ['gymnasium', 'envpool'])
def test_video_of_an_atari_run_is_the_full_color_screen(atari_run, backend,
                                                       tmp_path):
  if backend == 'envpool' and not envpool_env.available():
    pytest.skip('EnvPool is not installed')
  # On an EnvPool run the frames come from gymnasium's ALE env.
  path = str(tmp_path / 'pong.mp4')
  r = evaluate.evaluate(atari_run, num_episodes=1, video=path,
                        env_backend=backend)
  frames = _decode(path)
  # Truncated at 400 frames, the reset's random no-ops included: <= 100 steps.
  length = r['recorded_episode']['episode_length']
  assert 90 <= length <= 100
  assert frames.shape == (length + 1, 210, 160, 3), frames.shape
  assert r['video_fps'] == 15.0  # 60 Atari frames a second, 4 per step.
  # Color: Pong's orange-brown field is not gray.
  assert np.abs(frames[50].astype(int)[..., 0] - frames[50][..., 2]).mean() > 10


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
