"""Tests of impala_tf.rundir: the logdir lock, atomic writes, resume checks."""

import dataclasses
import os
import signal
import subprocess
import sys

import pytest

from impala_tf import config as config_lib
from impala_tf import environments
from impala_tf import rundir
from impala_tf import testing


def _spaces(cfg):
  return environments.env_spaces(cfg.env, **environments.env_kwargs(cfg))


# --- the lock ---------------------------------------------------------------------


def test_second_lock_on_a_logdir_is_refused_naming_the_holder(tmp_path):
  logdir = str(tmp_path / 'run')
  rundir.check_not_locked(logdir)  # Nothing there yet; creates nothing.
  assert not os.path.exists(logdir)
  with rundir.LogdirLock(logdir):
    with pytest.raises(config_lib.ConfigError) as e:
      rundir.LogdirLock(logdir).acquire()
    assert str(e.value) == (
        f'logdir={logdir}: is in use by another run (pid {os.getpid()}); wait for '
        'it to finish, stop it, or use another --logdir')
    with pytest.raises(config_lib.ConfigError, match='is in use by another run'):
      rundir.check_not_locked(logdir)
  rundir.check_not_locked(logdir)  # Released.
  with rundir.LogdirLock(logdir):
    pass


@pytest.mark.e2e
def test_lock_of_a_killed_run_does_not_stay(tmp_path):
  logdir = str(tmp_path / 'run')
  code = ('import sys, time; from impala_tf import rundir; '
          f'rundir.LogdirLock({logdir!r}).acquire(); print("locked", flush=True); '
          'time.sleep(600)')
  proc = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE,
                          text=True)
  try:
    assert proc.stdout.readline().strip() == 'locked'
    with pytest.raises(config_lib.ConfigError, match=f'pid {proc.pid}'):
      rundir.check_not_locked(logdir)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  rundir.check_not_locked(logdir)
  with rundir.LogdirLock(logdir):
    pass


# --- atomic writes ------------------------------------------------------------------


def test_write_text_atomic_replaces_and_leaves_no_temp(tmp_path):
  path = str(tmp_path / 'config.json')
  rundir.write_text_atomic(path, 'one\n')
  rundir.write_text_atomic(path, 'two\n')
  assert open(path, encoding='utf-8').read() == 'two\n'
  assert os.listdir(tmp_path) == ['config.json']
  umask = os.umask(0o022)
  os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask  # Not mkstemp's 0o600.


def test_replace_dir_atomic_keeps_the_old_dir_when_writing_fails(tmp_path):
  path = str(tmp_path / 'saved_policy')

  def write(text):
    def fill(directory):
      with open(os.path.join(directory, 'model'), 'w', encoding='utf-8') as f:
        f.write(text)
    return fill

  rundir.replace_dir_atomic(path, write('v1'))
  def fail(directory):
    write('half')(directory)
    raise RuntimeError('disk full')
  with pytest.raises(RuntimeError):
    rundir.replace_dir_atomic(path, fail)
  assert open(os.path.join(path, 'model'), encoding='utf-8').read() == 'v1'
  rundir.replace_dir_atomic(path, write('v2'))
  assert open(os.path.join(path, 'model'), encoding='utf-8').read() == 'v2'
  assert os.listdir(tmp_path) == ['saved_policy']  # No temp or old dir left.


def test_write_config_is_what_load_config_reads(tmp_path):
  cfg = testing.tiny_config(logdir=str(tmp_path / 'run'))
  rundir.write_config(cfg)
  assert rundir.load_config(cfg.logdir) == cfg
  assert sorted(os.listdir(cfg.logdir)) == ['config.json']


# --- resume -------------------------------------------------------------------------


def _saved_run(tmp_path, **overrides):
  """A logdir with config.json of tiny_config(**overrides) and a checkpoint file."""
  cfg = testing.tiny_config(logdir=str(tmp_path), **overrides)
  rundir.write_config(cfg)
  os.makedirs(tmp_path / 'checkpoints')
  (tmp_path / 'checkpoints' / 'ckpt-1.index').write_bytes(b'')
  return cfg


def test_resume_with_another_env_of_the_same_spaces_is_refused(tmp_path):
  saved = _saved_run(tmp_path)
  other = saved.replace(env=testing.faulty_id('nan_reward'))  # Same spaces.
  assert _spaces(other)[0] == _spaces(saved)[0]
  with pytest.raises(rundir.CheckpointMismatchError) as e:
    rundir.check_resume(other, *_spaces(other))
  assert str(e.value) == (
      f'cannot resume from the checkpoints in {tmp_path / "checkpoints"}: they were '
      'written with other env, network or optimizer flags '
      f'(--env={testing.CHAIN_ID} there, {testing.faulty_id("nan_reward")} now); '
      f'rerun with the flags in {tmp_path / "config.json"} or use a new --logdir')


@pytest.mark.parametrize('content', [b'{"env": ', b'[1, 2]', b'\xff\xfe'],
                         ids=['truncated', 'not_an_object', 'not_utf8'])
def test_resume_with_an_unreadable_config_json_is_refused(tmp_path, content):
  saved = _saved_run(tmp_path)
  (tmp_path / 'config.json').write_bytes(content)
  with pytest.raises(rundir.RunDirError) as e:
    rundir.check_resume(saved, *_spaces(saved))
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(
      f'cannot resume from the checkpoints in {tmp_path / "checkpoints"}: '
      f'{tmp_path / "config.json"} cannot be read ('), message
  assert (tmp_path / 'config.json').read_bytes() == content


def test_resume_without_config_json_or_checkpoints_is_not_refused(tmp_path):
  cfg = testing.tiny_config(logdir=str(tmp_path))
  assert rundir.check_resume(cfg, *_spaces(cfg)) == []  # Nothing to resume.
  _saved_run(tmp_path)
  os.remove(tmp_path / 'config.json')
  assert rundir.check_resume(cfg, *_spaces(cfg)) == []


def test_changed_learning_flags_are_returned_for_a_warning(tmp_path):
  saved = _saved_run(tmp_path, lr_schedule='linear')
  cfg = saved.replace(discounting=0.9, entropy_cost=0.05, seed=9,
                      total_environment_frames=800, log_interval_secs=2.0)
  diffs = rundir.check_resume(cfg, *_spaces(cfg))
  assert diffs == [('discounting', 0.99, 0.9), ('entropy_cost', 0.01, 0.05),
                   ('total_environment_frames', 400, 800)]
  assert rundir.learning_warning(diffs) == (
      'resuming with other learning flags than the run that wrote the checkpoints '
      '(--discounting=0.99 there, 0.9 now; --entropy_cost=0.01 there, 0.05 now; '
      '--total_environment_frames=400 there, 800 now); the rest of the run learns '
      'with the new values')


@pytest.mark.parametrize('lr,entropy,moves', [
    ('constant', 'constant', False),
    ('0:0.001,1000:0.0005', 'constant', False),  # Points at absolute frames.
    ('linear', 'constant', True),
    ('constant', 'linear', True),
    ('0%:1x,50%:0x', 'constant', True),  # Points at P% of the run.
    ('constant', '0%:1x,20%:0x', True),
])
def test_frame_budget_is_a_learning_flag_only_under_a_relative_schedule(
    lr, entropy, moves):
  saved = testing.tiny_config(lr_schedule=lr, entropy_cost_schedule=entropy)
  more = saved.replace(total_environment_frames=800)
  expected = [('total_environment_frames', 400, 800)] if moves else []
  assert rundir.learning_differences(saved.to_dict(), more) == expected
  assert rundir.learning_differences(
      saved.to_dict(), more.replace(reward_clipping='abs_one',
                                    baseline_cost=1.0)) == [
          ('baseline_cost', 0.5, 1.0), ('reward_clipping', 'none', 'abs_one')
      ] + expected


def test_check_checkpoint_run_needs_config_and_checkpoint_files(tmp_path):
  with pytest.raises(rundir.RunDirError, match='no such directory'):
    rundir.check_checkpoint_run(str(tmp_path / 'missing'))
  config = testing.tiny_config(logdir=str(tmp_path))
  rundir.write_config(config)
  with pytest.raises(rundir.RunDirError, match='has no checkpoint in checkpoints/'):
    rundir.check_checkpoint_run(str(tmp_path))
  (tmp_path / 'checkpoints').mkdir()
  (tmp_path / 'checkpoints' / 'ckpt-1.index').write_bytes(b'')
  assert rundir.check_checkpoint_run(str(tmp_path)) == config


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))


# --- each field's resume policy (config.option) is what the checks do -------------


_OTHER_VALUES = {
    'target_return': 100.0,
    'ray_address': 'auto', 'ray_actor_resources': '{"CPU": 2}',
    'ray_learner_resources': '{"CPU": 2}', 'ray_runtime_env': '{"env_vars": {}}',
    'logdir': '/elsewhere', 'lr_schedule': 'linear',
    'entropy_cost_schedule': 'linear'}


def _another_value(field: dataclasses.Field, value):
  """A different valid value of the field's type."""
  if field.name in _OTHER_VALUES:
    return _OTHER_VALUES[field.name]
  if field.metadata['choices']:
    return next(c for c in field.metadata['choices'] if c != value)
  if isinstance(value, bool):
    return not value
  if isinstance(value, int):
    return value + 1
  if isinstance(value, float):
    return value / 2 if 0 < value <= 1 else value + 1.0 if value else 0.1
  raise AssertionError(f'no other value for {field.name}: add it to _OTHER_VALUES')


def _fields_with(policy):
  return [f for f in dataclasses.fields(config_lib.Config)
          if f.metadata['resume'] == policy]


@pytest.mark.parametrize('field', _fields_with(config_lib.RESUME_FREE) +
                         _fields_with(config_lib.RESUME_WARNED),
                         ids=lambda f: f.name)
def test_a_field_resume_does_not_refuse_is_never_refused(field):
  # Constant schedules: total_environment_frames is warned only under a relative one.
  saved = testing.tiny_config(lr_schedule='constant',
                              entropy_cost_schedule='constant',
                              replay_buffer_num_slots=1)
  now = saved.replace(**{field.name: _another_value(field,
                                                    getattr(saved, field.name))})
  obs, act = _spaces(now)
  assert rundir.resume_differences(saved.to_dict(), now, obs, act) == []
  learning = [d[0] for d in rundir.learning_differences(saved.to_dict(), now)]
  warned = field.metadata['resume'] == config_lib.RESUME_WARNED
  assert (field.name in learning) == warned, (field.name, learning)


# A change of each refused field that its check must report (tiny_config: the chain
# env, an mlp torso without LSTM, Adam).
_REFUSED_CHANGES = {
    'env': dict(env='CartPole-v1'),
    'frame_stack': None,  # Atari only: covered by the Atari resume tests.
    'use_lstm': dict(use_lstm=True),
    'network': dict(network='shallow'),
    'mlp_hidden_sizes': dict(mlp_hidden_sizes=(8, 8)),
    'shared_torso': dict(shared_torso=True),
    'lstm_size': dict(use_lstm=True, lstm_size=4),
    'weight_init': dict(weight_init='orthogonal'),
    'torso_activation': dict(torso_activation='leaky_relu'),
    'optimizer': dict(optimizer='rmsprop'),
    'rmsprop_momentum': dict(optimizer='rmsprop', rmsprop_momentum=0.5),
}


def test_refused_fields_are_the_checked_ones():
  assert sorted(_REFUSED_CHANGES) == sorted(
      f.name for f in _fields_with(config_lib.RESUME_REFUSED))


@pytest.mark.parametrize('field', sorted(k for k, v in _REFUSED_CHANGES.items() if v))
def test_a_refused_field_is_reported(field):
  changes = _REFUSED_CHANGES[field]
  saved = testing.tiny_config(**{k: v for k, v in changes.items() if k != field})
  if field == 'lstm_size':
    saved = saved.replace(use_lstm=True)
  now = saved.replace(**changes)
  if field == 'network':
    saved = saved.replace(env='CartPole-v1')
    now = now.replace(env='CartPole-v1')
  obs, act = _spaces(now)
  names = [d[0] for d in rundir.resume_differences(saved.to_dict(), now, obs, act)]
  assert field in names, (field, names)
