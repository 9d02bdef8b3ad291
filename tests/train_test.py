"""End-to-end tests of `python -m impala_tf.train`, each run in a subprocess.

* Bad command lines: exit status 1 or 2, one stderr line naming the flag, nothing
  written to the logdir.
* `--helpfull` lists every flag.
* Resume after SIGKILL: the counters, the optimizer and the schedules continue.
* SIGINT / SIGTERM: exit 0 within seconds, a final checkpoint, no process left.
"""

import concurrent.futures
import glob
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from flags_test import BAD_INPUTS
from impala_tf import checkpoints
from impala_tf import distribute
from impala_tf import flags as flags_lib
from impala_tf import rundir
from impala_tf import testing

import helpers

REPO = helpers.REPO
PROG = 'impala_tf.train'

# TensorFlow's C++ runtime logs a few lines to stderr when it is imported (the GPU
# check imports it), before any of our code runs; TF_CPP_MIN_LOG_LEVEL does not
# silence them all. They are TF's, not ours, and are ignored when counting lines.
_NATIVE_LOG_RE = helpers.NATIVE_LOG_RE

# A run that trains in seconds on the chain env (reward 1 per step, 8 steps).
TINY = [f'--env={testing.CHAIN_ID}', '--num_actors=1', '--num_envs_per_actor=4',
        '--unroll_length=5', '--batch_size=4', '--mlp_hidden_sizes=16',
        '--learner_queue_size=4', '--log_interval_secs=0.5']

_HAS_GPU = bool(glob.glob('/dev/nvidia[0-9]*'))

# Picked from flags_test.BAD_INPUTS: flag parsing, single fields, cross-field rules.
_PICKED = [
    ['--batchsize=32'],
    ['--batch_size=abc'],
    ['--optimizer=sgd'],
    ['--use_lstm', 'false'],
    ['--mlp_hidden_sizes=64,x'],
    ['--flagfile=/nonexistent/impala.cfg'],
    ['--env='],
    ['--num_actors=0'],
    ['--discounting=1.5'],
    ['--lr_schedule=1000:0.1,500:0.01'],
    ['--clip_rho_threshold=0'],
    ['--keep_checkpoints=0'],
    ['--num_gpus=4', '--batch_size=30'],
    ['--num_virtual_cpu_devices=3'],
    ['--num_gpus=1', '--num_virtual_cpu_devices=2'],
    ['--replay_proportion=0.5'],
    ['--total_environment_frames=100'],
]
CLI_BAD_INPUTS = [case for case in BAD_INPUTS if case[0] in _PICKED] + [
    # Checks that need the outside world: the env registry and the GPUs.
    (['--env=CartPol-v1'], 'did you mean CartPole-v1?'),
    (['--env=impala_tf.no_such_module:Foo-v0'], 'env'),
    (['--num_gpus=64', '--batch_size=64'] if _HAS_GPU else ['--num_gpus=1'],
     'num_gpus'),
]


def _env():
  env = dict(os.environ)
  env['PYTHONPATH'] = str(REPO) + os.pathsep + env.get('PYTHONPATH', '')
  return env


def _train_cmd(*args):
  return [sys.executable, '-m', 'impala_tf.train', *args]


def _run(args, timeout=180):
  return subprocess.run(_train_cmd(*args), cwd=REPO, env=_env(),
                        capture_output=True, text=True, timeout=timeout)


def _start(args, log_path):
  log = open(log_path, 'w', encoding='utf-8')
  proc = subprocess.Popen(_train_cmd(*args), cwd=REPO, env=_env(), stdout=log,
                          stderr=subprocess.STDOUT)
  log.close()
  return proc


_own_stderr_lines = helpers.own_stderr_lines


def _wait_for(predicate, proc, timeout, what):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    if proc.poll() is not None:
      raise AssertionError(f'the run exited ({proc.returncode}) before {what}')
    time.sleep(0.1)
  proc.kill()
  raise AssertionError(f'timed out after {timeout} s waiting for {what}')


_metrics = helpers.read_metrics


_descendants = helpers.descendants


def _checkpoint_values(path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(path)
  get = lambda k: reader.get_tensor(f'{k}/.ATTRIBUTES/VARIABLE_VALUE')
  return {
      'env_frames': int(get('run_state/env_frames')),
      'episodes': int(get('run_state/episodes')),
      'learner_steps': int(get('learner_steps')),
      'consumed_frames': int(get('consumed_frames')),
      'iterations': int(get('optimizer/iterations')),
      'reader': reader,
  }


def _newest_readable_checkpoint(directory):
  """`(prefix, _checkpoint_values(prefix))` of the newest checkpoint that reads."""
  for path in checkpoints.checkpoint_candidates(directory):
    try:
      return path, _checkpoint_values(path)
    except Exception:  # pylint: disable=broad-except
      continue  # Half-written by the killed run: the restore skips it too.
  raise AssertionError(f'no readable checkpoint in {os.listdir(directory)}')


# --- bad command lines ------------------------------------------------------------


@pytest.fixture(scope='module')
def bad_results(tmp_path_factory):
  """Runs every bad command line (and --helpfull), 4 at a time."""
  tmp = tmp_path_factory.mktemp('bad')
  jobs = {}
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    for i, (argv, _) in enumerate(CLI_BAD_INPUTS):
      logdir = str(tmp / f'case{i}')
      jobs[i] = (logdir, pool.submit(_run, [*argv, f'--logdir={logdir}']))
    jobs['helpfull'] = (None, pool.submit(_run, ['--helpfull']))
    return {k: (logdir, f.result()) for k, (logdir, f) in jobs.items()}


def test_enough_bad_inputs_are_tried():
  assert len(CLI_BAD_INPUTS) >= 15


@pytest.mark.parametrize('index', range(len(CLI_BAD_INPUTS)),
                         ids=[' '.join(a) for a, _ in CLI_BAD_INPUTS])
def test_bad_input_exits_with_one_line(bad_results, index):
  argv, name = CLI_BAD_INPUTS[index]
  logdir, result = bad_results[index]
  assert result.returncode in (1, 2), (argv, result.stdout, result.stderr)
  assert 'Traceback' not in result.stderr + result.stdout
  lines = _own_stderr_lines(result.stderr)
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith(f'{PROG}: error: '), lines[0]
  assert name in lines[0], lines[0]
  assert not os.path.exists(logdir) or not os.listdir(logdir)


def test_helpfull_lists_every_flag(bad_results):
  _, result = bad_results['helpfull']
  assert result.returncode in (0, 1), result.stderr
  assert 'Traceback' not in result.stderr
  names = [spec.name for _, _, specs in flags_lib.SECTIONS for spec in specs]
  assert len(names) >= 40
  missing = [n for n in names if f'--{n}:' not in result.stdout and
             f'--[no]{n}:' not in result.stdout]
  assert not missing, missing


# --- resume after SIGKILL ---------------------------------------------------------


@pytest.mark.e2e
def test_resume_after_sigkill_continues_counters_and_optimizer(tmp_path):
  logdir = str(tmp_path / 'run')
  args = TINY + [f'--logdir={logdir}', '--checkpoint_interval_secs=1',
                 '--total_environment_frames=100000000']
  proc = _start(args, tmp_path / 'run1.log')
  index = os.path.join(logdir, 'checkpoints', 'checkpoint')
  try:
    _wait_for(lambda: os.path.exists(index), proc, 150, 'the first checkpoint')
    time.sleep(1.5)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  assert proc.returncode == -signal.SIGKILL

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # What the design promises: the resume takes the newest readable checkpoint on
  # disk, also a complete ckpt-N that the `checkpoint` index did not name yet when
  # the kill came (one timing under load); a half-written one is skipped.
  ckpt, saved = _newest_readable_checkpoint(os.path.join(logdir, 'checkpoints'))
  listed = tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
  number = lambda prefix: int(re.search(r'-(\d+)$', prefix).group(1))
  assert listed and number(ckpt) >= number(listed), (ckpt, listed)
  assert saved['learner_steps'] >= 1 and saved['env_frames'] > 0
  assert saved['iterations'] == saved['learner_steps']
  _assert_learner_restores_optimizer_slots(logdir, ckpt, saved['reader'])
  lines_of_run1 = len(_metrics(logdir))

  # The same command, with a budget a little above the checkpointed frames.
  total = saved['env_frames'] + 100
  rerun = [a for a in args if not a.startswith('--total_environment_frames')]
  result = _run(rerun + [f'--total_environment_frames={total}'])
  out = result.stdout + result.stderr
  assert result.returncode == 0, out[-3000:]
  assert f'resuming from {ckpt}' in out
  assert (f'env_frames={saved["env_frames"]}, learner_steps='
          f'{saved["learner_steps"]}') in out
  run2 = _metrics(logdir)[lines_of_run1:]
  assert run2, 'the resumed run wrote no metrics line'
  assert run2[0]['env_frames'] >= saved['env_frames']
  assert run2[0]['learner_steps'] >= saved['learner_steps']
  assert run2[0]['consumed_frames'] >= saved['consumed_frames']
  assert run2[-1]['env_frames'] >= total
  assert run2[-1]['episodes'] >= saved['episodes']

  final = _checkpoint_values(tf.train.latest_checkpoint(
      os.path.join(logdir, 'checkpoints')))
  assert final['learner_steps'] > saved['learner_steps']
  # One optimizer update per learner step, counted on from the checkpoint: the
  # optimizer's state was restored, not rebuilt.
  assert final['iterations'] == final['learner_steps']
  assert final['consumed_frames'] > saved['consumed_frames']

  # Resuming with another network is a clear error that leaves the run as it was.
  with open(os.path.join(logdir, 'config.json'), encoding='utf-8') as f:
    config_json = f.read()
  result = _run([a for a in rerun if not a.startswith('--mlp_hidden_sizes')] +
                ['--mlp_hidden_sizes=32', f'--total_environment_frames={total}'])
  assert result.returncode == 1, result.stderr[-3000:]
  assert 'Traceback' not in result.stderr
  lines = [l for l in _own_stderr_lines(result.stderr) if f'{PROG}: error:' in l]
  assert len(lines) == 1 and 'cannot resume from' in lines[0], result.stderr[-3000:]
  with open(os.path.join(logdir, 'config.json'), encoding='utf-8') as f:
    assert f.read() == config_json


def _assert_learner_restores_optimizer_slots(logdir, ckpt, reader):
  """A Learner built from config.json, restored as the driver does, holds the
  checkpoint's optimizer slots (not fresh zeros)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from impala_tf import checkpoints  # pylint: disable=g-import-not-at-top
  from impala_tf import distribute  # pylint: disable=g-import-not-at-top
  from impala_tf import learner as learner_lib  # pylint: disable=g-import-not-at-top
  config = rundir.load_config(logdir)
  strategy = distribute.get_strategy(0, 0)
  learner = learner_lib.Learner(config, lambda: checkpoints.build_network(config),
                                strategy)
  fresh = [v.numpy().copy() for v in learner.optimizer.variables]
  status = tf.train.Checkpoint(optimizer=learner.optimizer,
                               network=learner.network).read(ckpt)
  status.assert_existing_objects_matched()
  status.expect_partial()
  slot_keys = [k for k, _ in tf.train.list_variables(ckpt)
               if k.startswith('optimizer/') and 'iterations' not in k]
  assert slot_keys
  restored = [v.numpy() for v in learner.optimizer.variables]
  changed = 0
  for key in slot_keys:
    value = reader.get_tensor(key)
    matches = [i for i, r in enumerate(restored)
               if r.shape == value.shape and np.array_equal(r, value)]
    assert matches, f'no optimizer variable holds the value of {key}'
    changed += any(not np.array_equal(fresh[i], value) for i in matches)
  assert changed, 'every restored slot equals a fresh one'


# --- quiet start, logdir, hung env ------------------------------------------------


def _quiet_env(**extra):
  """The test env without TF_CPP_MIN_LOG_LEVEL: the defaults a user gets."""
  env = _env()
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  env.pop('IMPALA_TF_QUIET', None)
  env.update(extra)
  return env


# Our own stderr lines: the absl log lines of impala_tf's modules, and lines
# that start with the program's name.
_OUR_LINE_RE = re.compile(
    r'^([IWE]\d{4} [\d:.]+\s+\d+ (driver|actor|checkpoints|metrics|data|learner)'
    r'\.py:\d+\] |impala_tf[.:])')


@pytest.mark.e2e
def test_quiet_start_prints_only_our_lines(tmp_path):
  # Pong's network (leaky ReLUs): with oneDNN, grappler logs at ERROR level that
  # it skipped a fusion in the learner's step; benign, so dropped too.
  logdir = str(tmp_path / 'run')
  proc = subprocess.run(
      _train_cmd(f'--env={testing.FAKE_IMAGE_ID}', '--network=shallow',
                 '--shared_torso', '--torso_activation=leaky_relu',
                 '--num_actors=1', '--num_envs_per_actor=2', '--unroll_length=5',
                 '--batch_size=2', '--log_interval_secs=0.5', f'--logdir={logdir}',
                 '--total_environment_frames=200'),
      cwd=REPO, env=_quiet_env(), capture_output=True, text=True, timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines, 'no metrics lines'
  assert all(_OUR_LINE_RE.match(l) for l in lines), proc.stderr[-3000:]
  assert 'cuInit' not in proc.stderr and 'cuda' not in proc.stderr.lower()
  assert f'{PROG}: done:' in proc.stdout


@pytest.mark.e2e
def test_tf_log_level_two_set_by_the_user_is_as_quiet_as_unset(tmp_path):
  # TF_CPP_MIN_LOG_LEVEL=2 is the usual way to quiet TensorFlow: it must not show
  # TensorFlow's start-up lines (the cuInit "error" among them) that the quiet
  # start drops when the variable is unset.
  logdir = str(tmp_path / 'run')
  proc = subprocess.run(
      _train_cmd(*TINY, f'--logdir={logdir}', '--total_environment_frames=200'),
      cwd=REPO, env=_quiet_env(TF_CPP_MIN_LOG_LEVEL='2'), capture_output=True,
      text=True, timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines and all(_OUR_LINE_RE.match(l) for l in lines), proc.stderr[-3000:]
  assert 'cuInit' not in proc.stderr and 'absl::InitializeLog' not in proc.stderr


@pytest.mark.e2e
@pytest.mark.skipif(_HAS_GPU, reason='needs a machine without a GPU')
def test_missing_gpus_show_tensorflows_captured_lines(tmp_path):
  proc = subprocess.run(
      _train_cmd(*TINY, f'--logdir={tmp_path / "run"}', '--num_gpus=1'),
      cwd=REPO, env=_quiet_env(), capture_output=True, text=True, timeout=240)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.splitlines()
  assert lines[-1].startswith(f'{PROG}: error: --num_gpus=1: only 0 GPU(s) are '
                              'visible'), proc.stderr[-3000:]
  # What TensorFlow said about CUDA at start-up (dropped on a normal start). The
  # TF 2.12 wheel says nothing about CUDA on a machine without it.
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  tf_version = tuple(int(x) for x in
                     importlib.metadata.version('tensorflow').split('.')[:2])
  if tf_version >= (2, 14):
    assert any('cuInit' in l or 'cuda' in l.lower() for l in lines[:-1]), lines


@pytest.mark.e2e
def test_tf_log_level_set_by_the_user_brings_tensorflow_logs_back(tmp_path):
  # A run directory whose only checkpoint is garbage: export gets past the checks
  # that need no TensorFlow, imports it, then fails reading the checkpoint.
  logdir = str(tmp_path / 'damaged')
  os.makedirs(os.path.join(logdir, rundir.CHECKPOINT_SUBDIR))
  rundir.write_config(testing.tiny_config(logdir=logdir))
  for suffix in ('index', 'data-00000-of-00001'):
    with open(os.path.join(logdir, rundir.CHECKPOINT_SUBDIR, f'ckpt-1.{suffix}'),
              'wb') as f:
      f.write(b'\0garbage')
  cmd = [sys.executable, '-m', 'impala_tf.export', f'--logdir={logdir}']
  quiet = subprocess.run(cmd, cwd=REPO, env=_quiet_env(), capture_output=True,
                         text=True, timeout=120)
  assert quiet.returncode == 2
  # Our lines only: the skipped checkpoint's warning, then the error.
  assert [l.split(':')[0] for l in quiet.stderr.splitlines()] == [
      'impala_tf', 'impala_tf.export'], quiet.stderr
  assert quiet.stderr.splitlines()[-1].startswith(
      f'impala_tf.export: error: --logdir={logdir}: no checkpoint in '), quiet.stderr
  loud = subprocess.run(cmd, cwd=REPO, env=_quiet_env(TF_CPP_MIN_LOG_LEVEL='0'),
                        capture_output=True, text=True, timeout=120)
  assert loud.returncode == 2
  assert loud.stderr.splitlines()[-1] == quiet.stderr.splitlines()[-1]
  if len(loud.stderr.splitlines()) == 2:
    pytest.skip('TensorFlow logs nothing at import on this machine')
  assert any(_NATIVE_LOG_RE.match(l) for l in loud.stderr.splitlines())


@pytest.mark.e2e
def test_verbosity_one_brings_tensorflow_logs_back(tmp_path):
  logdir = str(tmp_path / 'run')
  proc = subprocess.run(
      _train_cmd(*TINY, f'--logdir={logdir}', '--total_environment_frames=200',
                 '--verbosity=1'),
      cwd=REPO, env=_quiet_env(), capture_output=True, text=True, timeout=240)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f'{PROG}: done:' in proc.stdout
  # TensorFlow's own Python INFO line, dropped at the default verbosity.
  assert 'Using MirroredStrategy with devices' in proc.stderr, proc.stderr[-3000:]


@pytest.mark.e2e
def test_logdir_that_is_a_file_is_refused_with_one_line(tmp_path):
  path = tmp_path / 'run'
  path.write_text('not a directory')
  result = _run(TINY + [f'--logdir={path}'])
  assert result.returncode == 2, result.stderr[-3000:]
  lines = _own_stderr_lines(result.stderr)
  assert lines == [f'{PROG}: error: --logdir={path}: is a file, not a directory; '
                   'use another --logdir'], result.stderr
  assert path.read_text() == 'not a directory'


@pytest.mark.e2e
def test_an_envs_recorded_settings_are_said_in_one_line_under_the_flags_given(
    tmp_path):
  # A logdir that is a file stops the run right after the Config is built (no
  # TensorFlow import): the settings line comes before the error.
  path = tmp_path / 'run'
  path.write_text('not a directory')
  result = _run(['--env=Acrobot-v1', '--num_sgd_iter=2', f'--logdir={path}'])
  assert result.returncode == 2, result.stderr[-3000:]
  lines = _own_stderr_lines(result.stderr)
  assert lines[0] == (
      f'{PROG}: Acrobot-v1: its recorded settings --ppo_clip=0.2 '
      '(docs/flags.md, "Settings per environment"; a flag you give wins)'), lines
  assert lines[1].startswith(f'{PROG}: error: --logdir={path}: is a file'), lines
  assert len(lines) == 2, lines


@pytest.mark.e2e
def test_hung_async_env_is_restarted(tmp_path):
  from impala_tf import testing as testing_lib  # pylint: disable=g-import-not-at-top
  tokens = testing_lib.fault_tokens(str(tmp_path / 'tokens'), 1)
  logdir = str(tmp_path / 'run')
  args = [a.replace('--num_envs_per_actor=4', '--num_envs_per_actor=2')
          for a in TINY if not a.startswith('--env=')] + [
              f'--env={testing_lib.faulty_id("hang")}', '--env_vectorization=async',
              '--env_step_timeout_secs=2', '--total_environment_frames=300',
              f'--logdir={logdir}']
  start = time.time()
  proc = subprocess.run(_train_cmd(*args), cwd=REPO, capture_output=True, text=True,
                        timeout=300,
                        env=dict(_env(), **{testing_lib.FAULTS_ENV_VAR: tokens}))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not os.listdir(tokens)  # One env hung once.
  assert ('(actor 0) did not finish step 3 within 2 s (--env_step_timeout_secs)'
          in proc.stderr), proc.stderr[-3000:]
  final = _metrics(logdir)[-1]
  assert final['actor_restarts'] == 1 and final['env_frames'] >= 300, final
  assert time.time() - start < 300


@pytest.mark.e2e
def test_second_run_on_a_busy_logdir_is_refused_while_the_first_runs(tmp_path):
  logdir = str(tmp_path / 'run')
  args = TINY + [f'--logdir={logdir}', '--total_environment_frames=100000000']
  first = _start(args, tmp_path / 'first.log')
  try:
    _wait_for(lambda: _metrics(logdir), first, 150, 'a metrics line')
    start = time.time()
    second = _run(args, timeout=60)
    took = time.time() - start
    running = first.poll() is None
    first.send_signal(signal.SIGINT)  # The first stops cleanly, as it would anyway.
    first.wait(timeout=60)
  finally:
    if first.poll() is None:
      first.kill()
  assert running, 'the first run ended before the second was refused'
  assert second.returncode == 2, second.stderr[-3000:]
  assert took < 30, took
  assert _own_stderr_lines(second.stderr) == [
      f'{PROG}: error: --logdir={logdir}: is in use by another run (pid '
      f'{first.pid}); wait for it to finish, stop it, or use another --logdir'
  ], second.stderr
  log = (tmp_path / 'first.log').read_text(encoding='utf-8')
  assert first.returncode == 0, log[-3000:]
  assert _metrics(logdir)[-1]['final'] is True
  # The first run is over: the logdir is free again (the rerun resumes it).
  again = _run(TINY + [f'--logdir={logdir}', '--total_environment_frames=1000'])
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'impala_tf: resuming from ' in again.stdout, again.stdout[-3000:]


# --- errors in the user's own torso (--network=MODULE:FUNCTION) ---------------------

_TORSO_RAISES = '''import tensorflow as tf


def helper(x):
  return undefined_name + x  # Line 5.


def torso(observation_space, action_space):
  del observation_space, action_space
  return helper(1)
'''

_IMPORT_RAISES = '''import os

VALUE = os.path.join('a', missing_at_import)  # Line 3.


def torso(observation_space, action_space):
  return None
'''


def _run_user_torso(tmp_path, name, source, *flags):
  (tmp_path / f'{name}.py').write_text(source)
  env = dict(_env())
  env['PYTHONPATH'] = str(tmp_path) + os.pathsep + env['PYTHONPATH']
  return subprocess.run(
      _train_cmd(*TINY, f'--network={name}:torso', f'--logdir={tmp_path / "run"}',
                 *flags), cwd=REPO, env=env, capture_output=True, text=True,
      timeout=180)


@pytest.mark.e2e
@pytest.mark.parametrize('source,expected', [
    (_TORSO_RAISES, "user_torso_a.torso(observation_space, action_space) raised "
     "NameError: name 'undefined_name' is not defined (at {file}:5)"),
    (_IMPORT_RAISES, "importing module 'user_torso_b' failed: NameError: name "
     "'missing_at_import' is not defined (at {file}:3)"),
], ids=['in_torso', 'at_import'])
def test_user_torso_error_names_its_file_and_line(tmp_path, source, expected):
  name = 'user_torso_a' if source is _TORSO_RAISES else 'user_torso_b'
  result = _run_user_torso(tmp_path, name, source)
  assert result.returncode == 2, result.stderr[-3000:]
  expected = expected.format(file=tmp_path / f'{name}.py')
  # The run's last line is the one-line error (TF 2.12's own Python logging may
  # come before it: "INFO:tensorflow:Using MirroredStrategy ...").
  lines = _own_stderr_lines(result.stderr)
  assert lines[-1:] == [f'{PROG}: error: --network={name}:torso: {expected}'], (
      result.stderr[-3000:])
  assert not any(l.startswith(PROG) for l in lines[:-1]), lines


@pytest.mark.e2e
def test_user_torso_error_with_verbosity_one_prints_the_traceback(tmp_path):
  result = _run_user_torso(tmp_path, 'user_torso_c', _TORSO_RAISES, '--verbosity=1')
  assert result.returncode == 2, result.stderr[-3000:]
  err = result.stderr
  assert 'Traceback (most recent call last):' in err, err[-3000:]
  assert f'File "{tmp_path / "user_torso_c.py"}", line 5, in helper' in err
  assert err.rstrip().splitlines()[-1].endswith(
      f'(at {tmp_path / "user_torso_c.py"}:5)'), err[-3000:]


# --- SIGINT / SIGTERM ---------------------------------------------------------------


class _NoTouch(threading.Event):
  """An Event a signal handler must not touch (Event.set takes a lock)."""

  def __init__(self):
    super().__init__()
    self.touched_in_main = False

  def is_set(self):
    self.touched_in_main |= threading.current_thread() is threading.main_thread()
    return super().is_set()

  def set(self):
    self.touched_in_main |= threading.current_thread() is threading.main_thread()
    super().set()


def test_signals_set_stop_from_a_thread_and_the_handler_takes_no_lock():
  # A handler runs again inside itself when a second signal comes while it runs;
  # a lock it took (Event.set takes one) would then never be released.
  train_lib = importlib.import_module('impala_tf.train')  # Not the function.
  old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  old_fd = signal.set_wakeup_fd(-1)
  stop = _NoTouch()
  try:
    train_lib._stop_on_signals(stop)  # pylint: disable=protected-access
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    deadline = time.monotonic() + 5
    while not threading.Event.is_set(stop) and time.monotonic() < deadline:
      time.sleep(0.01)
    assert threading.Event.is_set(stop), 'no stop within 5 s of the signals'
    assert not stop.touched_in_main, 'the handler touched the Event'
  finally:
    for s, handler in old.items():
      signal.signal(s, handler)
    ours = signal.set_wakeup_fd(old_fd)
    if ours >= 0:
      os.close(ours)


@pytest.mark.e2e
@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM],
                         ids=['SIGINT', 'SIGTERM'])
def test_signal_stops_cleanly(tmp_path, signum):
  logdir = str(tmp_path / f'run_{signum}')
  args = [a.replace('--num_envs_per_actor=4', '--num_envs_per_actor=2')
          for a in TINY] + [
              f'--logdir={logdir}', '--env_vectorization=async',
              '--checkpoint_interval_secs=600', '--total_environment_frames=100000000']
  log_path = tmp_path / 'run.log'
  proc = _start(args, log_path)
  try:
    _wait_for(lambda: _metrics(logdir), proc, 150, 'a metrics line')
    children = _descendants(proc.pid)
    assert len(children) >= 2, children  # The async envs' processes at least.
    sent = time.time()
    proc.send_signal(signum)
    proc.wait(timeout=30)
    took = time.time() - sent
  finally:
    if proc.poll() is None:
      proc.kill()
  log = log_path.read_text(encoding='utf-8')
  assert proc.returncode == 0, log[-3000:]
  assert took < 30
  assert 'Traceback' not in log
  assert f'{PROG}: done:' in log

  # A final checkpoint, written after the signal.
  indexes = glob.glob(os.path.join(logdir, 'checkpoints', 'ckpt-*.index'))
  assert indexes
  assert max(os.path.getmtime(p) for p in indexes) >= sent - 0.01
  last = _metrics(logdir)[-1]
  assert last['final'] is True and last['interrupted'] is True

  # Nothing left behind: no descendant of the run, nothing naming its logdir.
  deadline = time.time() + 10
  while time.time() < deadline and any(testing.process_alive(p) for p in children):
    time.sleep(0.2)
  assert not [p for p in children if testing.process_alive(p)]
  assert not testing.processes_mentioning(logdir)


@pytest.mark.e2e
def test_sigterm_while_the_actors_are_stalled_stops_within_seconds(tmp_path):
  # Every env hangs at its step 3 (a sync vector env: no step timeout can end
  # it), so the learner waits in TensorFlow for data that never comes; the Python
  # signal handler alone would run only after --learner_queue_timeout.
  logdir = str(tmp_path / 'run')
  args = [a.replace('--num_envs_per_actor=4', '--num_envs_per_actor=2')
          for a in TINY if not a.startswith('--env=')] + [
              f'--env={testing.faulty_id("hang")}', '--env_vectorization=sync',
              '--learner_queue_timeout=120', '--total_environment_frames=10000',
              f'--logdir={logdir}']
  log_path = tmp_path / 'run.log'
  proc = _start(args, log_path)
  try:
    _wait_for(lambda: os.path.exists(os.path.join(logdir, 'config.json')), proc,
              150, 'config.json')
    time.sleep(3)  # The actor is hung; the learner waits for data.
    sent = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    took = time.time() - sent
  finally:
    if proc.poll() is None:
      proc.kill()
  log = log_path.read_text(encoding='utf-8')
  assert proc.returncode == 0, log[-3000:]
  assert took < 15, (took, log[-3000:])
  assert f'{PROG}: done:' in log and 'Traceback' not in log
  indexes = glob.glob(os.path.join(logdir, 'checkpoints', 'ckpt-*.index'))
  assert indexes and max(os.path.getmtime(p) for p in indexes) >= sent - 0.01
  last = _metrics(logdir)[-1]
  assert last['final'] is True and last['interrupted'] is True
  assert last['learner_steps'] == 0, last


@pytest.mark.e2e
def test_bad_tf_config_exits_with_one_line_before_any_work(tmp_path):
  logdir = tmp_path / 'run'
  env = dict(_env(), TF_CONFIG=json.dumps(
      {'cluster': {'worker': ['127.0.0.1:1', '127.0.0.1:2']},
       'task': {'type': 'worker', 'index': 2}}))
  proc = subprocess.run(_train_cmd(*TINY, f'--logdir={logdir}'), cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert _own_stderr_lines(proc.stderr) == [
      f'{PROG}: error: TF_CONFIG task index 2 is out of range: the cluster has 2 '
      'worker(s), indices 0..1'], proc.stderr[-2000:]
  assert not logdir.exists()


def _run_workers(args_of, env_of=lambda i: {}, timeout=150):
  """Runs 2 learner workers started by hand (TF_CONFIG on loopback) to their end.

  Returns:
    (procs, [(stdout, stderr)] per worker); none is left running.
  """
  workers = [f'127.0.0.1:{p}' for p in distribute.free_local_ports(2)]
  procs = []
  try:
    for i in range(2):
      env = dict(_env(), **env_of(i), TF_CONFIG=json.dumps(
          {'cluster': {'worker': workers}, 'task': {'type': 'worker', 'index': i}}))
      procs.append(subprocess.Popen(
          _train_cmd(*args_of(i)), cwd=REPO, env=env, stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, text=True))
    return procs, [p.communicate(timeout=timeout) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()


@pytest.mark.e2e
def test_a_worker_whose_env_hangs_stops_every_worker_naming_it(tmp_path):
  # Both workers run the hanging env; only worker 1's envs take a fault token.
  none = testing.fault_tokens(str(tmp_path / 'none'), 0)
  tokens = testing.fault_tokens(str(tmp_path / 'tokens'), 8)
  logdir = str(tmp_path / 'run')
  args = [a for a in TINY if not a.startswith('--env=')] + [
      f'--env={testing.faulty_id("hang")}', '--env_vectorization=sync',
      '--learner_queue_timeout=10', '--total_environment_frames=10000000',
      f'--logdir={logdir}']
  start = time.time()
  procs, outputs = _run_workers(lambda i: args, lambda i: {
      testing.FAULTS_ENV_VAR: tokens if i == 1 else none})
  took = time.time() - start
  errors = [_own_stderr_lines(err)[-1] for _, err in outputs]
  assert [p.returncode for p in procs] == [1, 1], outputs
  assert errors[1].startswith(
      f'{PROG}: error: learner worker 1: no unroll reached the learner for 10 s '
      '(--learner_queue_timeout)'), errors
  assert errors[0].startswith(
      f'{PROG}: error: learner worker 0: learner worker(s) 1 stopped the run'), errors
  assert took < 10 + 30 + 30, took  # Timeout + 30 s, + both start-ups.



@pytest.mark.e2e
def test_a_learner_worker_that_never_starts_is_named_within_the_stall_timeout(
    tmp_path):
  """Worker 1 of 2 is never started: worker 0 would wait in TensorFlow's
  connection to it, holding the GIL, forever (the test's timeout kills it)."""
  logdir = tmp_path / 'run'
  workers = [f'127.0.0.1:{p}' for p in distribute.free_local_ports(2)]
  env = dict(_env(), TF_CONFIG=json.dumps(
      {'cluster': {'worker': workers}, 'task': {'type': 'worker', 'index': 0}}))
  start = time.time()
  proc = subprocess.run(
      _train_cmd(*TINY, '--stall_timeout_secs=5', '--learner_queue_timeout=2',
                 f'--logdir={logdir}'),
      cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  took = time.time() - start
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert _own_stderr_lines(proc.stderr)[-1] == (
      f'{PROG}: error: learner worker 0: no progress for 5 s before this run\'s '
      'first learner step (--stall_timeout_secs=5); it is now in: starting: '
      'waiting for every learner worker\'s heartbeat; no heartbeat from learner '
      'worker(s) 1 since this one started (still starting, hung before its first '
      f'step, or {logdir / "heartbeats"} is not one directory every worker '
      'shares); the run stops; the newest checkpoint in --logdir is intact: '
      'rerun the same command to resume'), proc.stderr[-3000:]
  assert took < 60, took  # The start-up (about 10 s here) and the 5 s.
  assert not (logdir / 'metrics.jsonl').exists()
  assert not (logdir / 'checkpoints').exists()


@pytest.mark.e2e
def test_hand_started_workers_with_different_flags_stop_in_one_line(tmp_path):
  logdir = str(tmp_path / 'run')
  start = time.time()
  procs, outputs = _run_workers(lambda i: TINY + [
      f'--learning_rate={0.001 * (i + 1)}', f'--logdir={logdir}',
      '--total_environment_frames=100000'])
  took = time.time() - start
  for i, (p, (_, err)) in enumerate(zip(procs, outputs)):
    assert p.returncode == 1, err[-3000:]
    assert _own_stderr_lines(err)[-1] == (
        f'{PROG}: error: learner worker {i}: the 2 learner workers differ in '
        'flag(s) --learning_rate: start every worker with the same flags; nothing '
        'was trained'), err[-3000:]
  assert took < 90, took  # Both start-ups (about 10-20 s each here) and the check.
  metrics = os.path.join(logdir, 'metrics.jsonl')
  assert not os.path.exists(metrics) or all(
      m['learner_steps'] == 0 for m in _metrics(logdir))


@pytest.mark.e2e
def test_two_learner_workers_train_resume_and_leave_nothing_behind(tmp_path):
  logdir = str(tmp_path / 'run')
  args = TINY + ['--num_learner_workers=2', '--total_environment_frames=3000',
                 '--checkpoint_interval_secs=1', f'--logdir={logdir}']
  proc = _run(args, timeout=150)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out[-4000:]
  ports = re.findall(r'\[::\]:(\d+)', proc.stdout.splitlines()[0])
  assert len(ports) == 2 and 'ALL network interfaces' in proc.stdout, out[-3000:]
  assert proc.stdout.count(f'{PROG}: done:') == 1  # The chief reports the run.
  for name in ('config.json', 'metrics.jsonl', 'saved_policy/saved_model.pb',
               'checkpoints/checkpoint'):
    assert os.path.exists(os.path.join(logdir, name)), name
  assert json.load(open(os.path.join(logdir, 'config.json')))[
      'num_learner_workers'] == 2
  last = _metrics(logdir)[-1]
  assert last['final'] and last['num_learner_workers'] == 2, last
  assert last['num_replicas'] == 2
  # Frames over both workers: each step trains the global batch of 4 unrolls.
  assert last['trained_frames'] == last['learner_steps'] * 4 * 5
  assert last['consumed_frames'] + last['replayed_frames'] == last['trained_frames']
  assert 3000 <= last['env_frames'] and last['consumed_frames'] <= last['env_frames']
  assert last['episodes'] >= 1
  assert not testing.processes_mentioning(logdir)
  assert not os.path.exists(os.path.join(logdir, 'workertemp_1'))  # Deleted.
  # Again with a larger budget: resumes, counters continue; SIGTERM stops all.
  log_path = tmp_path / 'resume.log'
  resumed = _start([a.replace('--total_environment_frames=3000',
                              '--total_environment_frames=10000000') for a in args],
                   log_path)
  try:
    _wait_for(lambda: len(_metrics(logdir)) > 1 and _metrics(logdir)[-1].get(
        'learner_steps', 0) > last['learner_steps'] + 5, resumed, 120,
              'learner steps after the resume')
    resumed.send_signal(signal.SIGTERM)
    resumed.wait(timeout=60)
  finally:
    if resumed.poll() is None:
      resumed.kill()
  log = log_path.read_text(encoding='utf-8')
  assert resumed.returncode == 0, log[-4000:]
  assert f'resuming from {logdir}/checkpoints/ckpt-{last["learner_steps"]}' in log
  final = _metrics(logdir)[-1]
  assert final['final'] and final['interrupted'], final
  assert final['env_frames'] > last['env_frames']
  assert final['episodes'] > last['episodes']
  assert not testing.processes_mentioning(logdir)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
