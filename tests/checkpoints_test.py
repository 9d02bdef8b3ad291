"""Tests of impala_tf.checkpoints: Checkpointer round trips, keep, run directories."""

import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import checkpoints
from impala_tf import config as config_lib
from impala_tf import rundir
from impala_tf import testing
from impala_tf import types


def _state(seed=0):
  return dict(
      weights=tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3) + seed),
      counter=tf.Variable(seed, dtype=tf.int64),
      rng=tf.random.Generator.from_seed(seed))


def test_round_trip_restores_variables_and_rng_state(tmp_path):
  saved = _state(0)
  saved['counter'].assign(41)
  saved['rng'].normal([5])  # Advance the generator past its seed state.
  ckpt = checkpoints.Checkpointer(str(tmp_path), 3, **saved)
  path = ckpt.save(7)
  assert path.endswith('ckpt-7')
  assert ckpt.latest == path
  expected_next = saved['rng'].normal([4]).numpy()  # What follows the saved state.

  fresh = _state(5)
  restored = checkpoints.Checkpointer(str(tmp_path), 3, **fresh).restore_latest()
  assert restored == path
  np.testing.assert_array_equal(fresh['weights'].numpy(), saved['weights'].numpy())
  assert int(fresh['counter'].numpy()) == 41
  np.testing.assert_array_equal(fresh['rng'].normal([4]).numpy(), expected_next)


def test_keep_two_keeps_the_two_newest(tmp_path):
  state = _state()
  ckpt = checkpoints.Checkpointer(str(tmp_path), 2, **state)
  for step in (1, 2, 3, 4):
    state['counter'].assign(step)
    ckpt.save(step)
  names = sorted(f for f in os.listdir(tmp_path / 'checkpoints') if f.endswith('.index'))
  assert names == ['ckpt-3.index', 'ckpt-4.index']
  assert [os.path.basename(p) for p in ckpt.checkpoints] == ['ckpt-3', 'ckpt-4']
  fresh = _state()
  checkpoints.Checkpointer(str(tmp_path), 2, **fresh).restore_latest()
  assert int(fresh['counter'].numpy()) == 4


def test_restore_latest_of_an_empty_dir_returns_none(tmp_path):
  state = _state(3)
  assert checkpoints.Checkpointer(str(tmp_path), 3, **state).restore_latest() is None
  assert int(state['counter'].numpy()) == 3  # Untouched.
  assert checkpoints.latest_checkpoint(str(tmp_path)) is None


def test_restore_of_a_mismatched_checkpoint_fails_loudly(tmp_path):
  checkpoints.Checkpointer(str(tmp_path), 1, **_state()).save(1)
  other = dict(weights=tf.Variable(np.zeros([4], np.float32)))
  with pytest.raises(rundir.CheckpointMismatchError, match='cannot resume from'):
    checkpoints.Checkpointer(str(tmp_path), 1, **other).restore_latest()
  missing = dict(weights=tf.Variable(np.zeros([2, 3], np.float32)),
                 not_saved=tf.Variable(1.0))
  with pytest.raises(rundir.CheckpointMismatchError, match='use a new --logdir'):
    checkpoints.Checkpointer(str(tmp_path), 1, **missing).restore_latest()


def test_optional_trackables_may_be_missing(tmp_path):
  rng0 = tf.random.Generator.from_seed(0)
  rng0.normal([3])
  checkpoints.Checkpointer(str(tmp_path), 1, optional=['rng_0'], rng_0=rng0,
                           counter=tf.Variable(4, dtype=tf.int64)).save(1)
  # One more actor RNG than in the checkpoint: restored where saved, fresh where not.
  new0, new1 = tf.random.Generator.from_seed(5), tf.random.Generator.from_seed(6)
  fresh1 = new1.state.numpy().copy()
  counter = tf.Variable(0, dtype=tf.int64)
  ckpt = checkpoints.Checkpointer(str(tmp_path), 1, optional=['rng_0', 'rng_1'],
                                  rng_0=new0, rng_1=new1, counter=counter)
  assert ckpt.restore_latest()
  assert ckpt.not_restored == ['rng_1']
  np.testing.assert_array_equal(new0.state.numpy(), rng0.state.numpy())
  np.testing.assert_array_equal(new1.state.numpy(), fresh1)
  assert int(counter.numpy()) == 4
  # A missing trackable that is not optional is still an error.
  with pytest.raises(rundir.CheckpointMismatchError):
    checkpoints.Checkpointer(str(tmp_path), 1, optional=['rng_1'], rng_0=new0,
                             rng_1=new1, counter=counter,
                             other=tf.Variable(1.0)).restore_latest()


def test_episode_window_round_trip_keeps_the_last_100(tmp_path):
  window = checkpoints.EpisodeWindow()
  assert window.episodes() == []
  episodes = [types.EpisodeStats(0.5 * i - 20, 100 + i) for i in range(130)]
  window.assign(episodes)
  checkpoints.Checkpointer(str(tmp_path), 1, episode_window=window).save(1)
  fresh = checkpoints.EpisodeWindow()
  checkpoints.Checkpointer(str(tmp_path), 1,
                           episode_window=fresh).restore_latest()
  restored = fresh.episodes()
  assert restored == episodes[30:]  # The last 100, oldest first.
  assert isinstance(restored[0].episode_return, float)
  assert isinstance(restored[0].length, int)
  few = [types.EpisodeStats(21.0, 800), types.EpisodeStats(-3.5, 2600)]
  window.assign(few)  # Fewer than 100: the rest is not returned.
  assert window.episodes() == few
  window.assign([])
  assert window.episodes() == []


def test_checkpoint_without_an_episode_window_restores(tmp_path):
  """A checkpoint written before the window existed resumes with an empty one."""
  counter = tf.Variable(7, dtype=tf.int64)
  checkpoints.Checkpointer(str(tmp_path), 1, counter=counter).save(1)
  window = checkpoints.EpisodeWindow()
  ckpt = checkpoints.Checkpointer(str(tmp_path), 1, optional=['episode_window'],
                                  counter=tf.Variable(0, dtype=tf.int64),
                                  episode_window=window)
  assert ckpt.restore_latest()
  assert ckpt.not_restored == ['episode_window']
  assert window.episodes() == []


def _three_checkpoints(tmp_path):
  state = _state()
  ckpt = checkpoints.Checkpointer(str(tmp_path), 3, **state)
  paths = []
  for step in (1, 2, 3):
    state['counter'].assign(step)
    paths.append(ckpt.save(step))
  return paths


def _damage(path, damage):
  """Truncates the data file of checkpoint `path` to half, or removes its index."""
  if damage == 'truncated_data':
    data = path + '.data-00000-of-00001'
    with open(data, 'r+b') as f:
      f.truncate(os.path.getsize(data) // 2)
  else:
    os.remove(path + '.index')


def _snapshot(directory):
  """{file name: bytes} of a directory, to show it was not touched."""
  return {name: (directory / name).read_bytes() for name in os.listdir(directory)}


@pytest.mark.parametrize('damage', ['truncated_data', 'missing_index'])
def test_unreadable_latest_checkpoint_falls_back_to_the_previous(
    tmp_path, capfd, damage):
  paths = _three_checkpoints(tmp_path)
  latest = paths[-1]
  _damage(latest, damage)
  capfd.readouterr()
  fresh = _state(9)
  ckpt = checkpoints.Checkpointer(str(tmp_path), 3, **fresh)
  assert ckpt.restore_latest() == paths[1]
  assert int(fresh['counter'].numpy()) == 2
  np.testing.assert_array_equal(fresh['weights'].numpy(),
                                np.arange(6, dtype=np.float32).reshape(2, 3))
  err = capfd.readouterr().err
  lines = [l for l in err.splitlines() if l.startswith('impala_tf:')]
  assert len(lines) == 2, err
  assert lines[0].startswith(f'impala_tf: warning: checkpoint {latest} cannot be '
                             'read ('), lines[0]
  assert lines[0].endswith('trying the previous one')
  aside = tmp_path / 'checkpoints' / 'skipped'
  assert lines[1] == (f'impala_tf: warning: moved the unreadable checkpoint '
                      f'{latest} to {aside}/ (not deleted: look at it, or delete it '
                      'yourself)')
  # The run continues: the next save is the newest checkpoint.
  fresh['counter'].assign(10)
  ckpt.save(4)
  again = _state(9)
  assert checkpoints.Checkpointer(str(tmp_path), 3, **again).restore_latest(
  ).endswith('ckpt-4')
  assert int(again['counter'].numpy()) == 10


def test_skipped_checkpoint_is_moved_aside_not_rotated_away(tmp_path):
  paths = _three_checkpoints(tmp_path)
  data = paths[-1] + '.data-00000-of-00001'
  damaged = open(data, 'rb').read()[:10]
  with open(data, 'wb') as f:
    f.write(damaged)
  fresh = _state(9)
  ckpt = checkpoints.Checkpointer(str(tmp_path), 3, **fresh)
  assert ckpt.restore_latest() == paths[1]
  aside = tmp_path / 'checkpoints' / 'skipped'
  assert sorted(os.listdir(aside)) == ['ckpt-3.data-00000-of-00001', 'ckpt-3.index']
  for step in (4, 5, 6, 7):  # The keep-3 rotation runs past it.
    fresh['counter'].assign(step)
    ckpt.save(step)
  assert (aside / 'ckpt-3.data-00000-of-00001').read_bytes() == damaged
  assert sorted(f for f in os.listdir(tmp_path / 'checkpoints')
                if f.endswith('.index')) == ['ckpt-5.index', 'ckpt-6.index',
                                             'ckpt-7.index']
  again = _state(9)
  assert checkpoints.Checkpointer(str(tmp_path), 3, **again).restore_latest(
  ).endswith('ckpt-7')


@pytest.mark.parametrize('error', [
    tf.errors.PermissionDeniedError(None, None, 'ckpt-3.index; Permission denied'),
    tf.errors.ResourceExhaustedError(None, None, 'OOM when allocating'),
    OSError(5, 'Input/output error'),
    MemoryError(),
], ids=['permission', 'resource_exhausted', 'io', 'memory'])
def test_read_error_that_is_not_damage_stops_and_touches_nothing(
    tmp_path, monkeypatch, error):
  paths = _three_checkpoints(tmp_path)
  directory = tmp_path / 'checkpoints'
  before = _snapshot(directory)
  real = checkpoints._check_files  # pylint: disable=protected-access

  def check_files(path):  # Where reading the newest checkpoint begins.
    if path == paths[-1]:
      raise error
    return real(path)

  monkeypatch.setattr(checkpoints, '_check_files', check_files)
  fresh = _state(9)
  with pytest.raises(rundir.RunDirError) as e:  # Not an older checkpoint.
    checkpoints.Checkpointer(str(tmp_path), 3, **fresh).restore_latest()
  assert type(e.value).__name__ == 'CheckpointReadError'
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(f'checkpoint {paths[-1]} cannot be read ('), message
  assert message.endswith('no older checkpoint is used and nothing was changed: '
                          'fix the cause (permissions, disk, memory) and rerun')
  assert int(fresh['counter'].numpy()) == 9  # Nothing older restored.
  assert _snapshot(directory) == before


@pytest.mark.parametrize('error', [
    tf.errors.PermissionDeniedError(None, None, 'Permission denied'),
    OSError(5, 'Input/output error'),
], ids=['permission', 'io'])
def test_restore_network_does_not_fall_back_on_other_read_errors(
    tmp_path, monkeypatch, error):
  _, paths = _network_checkpoints(tmp_path)
  real = checkpoints._check_files  # pylint: disable=protected-access
  monkeypatch.setattr(checkpoints, '_check_files', lambda p: (
      (_ for _ in ()).throw(error) if p == paths[-1] else real(p)))
  with pytest.raises(rundir.RunDirError,
                     match=f'^checkpoint {paths[-1]} cannot be read'):
    checkpoints.restore_network(str(tmp_path))


def test_no_readable_checkpoint_is_an_error_that_touches_nothing(tmp_path):
  paths = _three_checkpoints(tmp_path)
  for p in paths:
    data = p + '.data-00000-of-00001'
    with open(data, 'r+b') as f:
      f.truncate(3)
  os.remove(paths[0] + '.index')
  directory = tmp_path / 'checkpoints'
  before = _snapshot(directory)
  with pytest.raises(rundir.CheckpointUnreadableError) as e:
    checkpoints.Checkpointer(str(tmp_path), 3, **_state(9)).restore_latest()
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(f'no checkpoint in {directory} can be read (ckpt-3: ')
  assert 'ckpt-1: its .index file is missing' in message
  assert _snapshot(directory) == before


def test_checkpoint_with_more_module_variables_is_a_mismatch(tmp_path):
  big = tf.Module()
  big.w = [tf.Variable(np.zeros(3, np.float32)), tf.Variable(np.zeros(2, np.float32))]
  checkpoints.Checkpointer(str(tmp_path), 1, net=big).save(1)
  small = tf.Module()
  small.w = [tf.Variable(np.ones(3, np.float32))]
  # Every variable of `small` is in the checkpoint, but it holds one more.
  with pytest.raises(rundir.CheckpointMismatchError,
                     match='its net has 2 variables, this run.s has 1'):
    checkpoints.Checkpointer(str(tmp_path), 1, net=small).restore_latest()


def _spaces(cfg):
  from impala_tf import environments  # pylint: disable=g-import-not-at-top
  return environments.env_spaces(cfg.env, **environments.env_kwargs(cfg))


@pytest.mark.parametrize('change,expected', [
    (dict(mlp_hidden_sizes=(16, 16)), [('mlp_hidden_sizes', (16,), (16, 16))]),
    (dict(use_lstm=True), [('use_lstm', False, True)]),
    (dict(network='shallow', env=testing.FAKE_IMAGE_ID,
          saved_env=testing.FAKE_IMAGE_ID), [('network', 'auto', 'shallow')]),
    (dict(network='mlp', env=testing.FAKE_IMAGE_ID, saved_env=testing.FAKE_IMAGE_ID),
     [('network', 'auto', 'mlp')]),
    (dict(optimizer='rmsprop'), [('optimizer', 'adam', 'rmsprop')]),
    (dict(env=testing.FAKE_IMAGE_ID, network='mlp'),
     [('env', testing.CHAIN_ID, testing.FAKE_IMAGE_ID)]),
    # Same shapes: no difference.
    (dict(network='mlp'), []),  # 'auto' is mlp here.
    (dict(network='deep', env=testing.FAKE_IMAGE_ID,
          saved_env=testing.FAKE_IMAGE_ID), []),  # 'auto' is deep for images.
    (dict(lstm_size=32), []),  # No LSTM: its size does not matter.
    (dict(learning_rate=0.5, seed=7), []),  # Learning flags: a warning, elsewhere.
    # Another env with the same spaces: refused too.
    (dict(env=testing.faulty_id('nan_reward')),
     [('env', testing.CHAIN_ID, testing.faulty_id('nan_reward'))]),
])
def test_resume_differences(change, expected):
  change = dict(change)
  saved_env = change.pop('saved_env', testing.CHAIN_ID)
  saved = testing.tiny_config(env=saved_env).to_dict()
  cfg = testing.tiny_config(**change)
  assert rundir.resume_differences(saved, cfg, *_spaces(cfg)) == expected


def test_check_resume_names_flags_and_values(tmp_path):
  saved = testing.tiny_config(logdir=str(tmp_path))
  cfg = saved.replace(mlp_hidden_sizes=(16, 16), optimizer='rmsprop')
  rundir.check_resume(cfg, *_spaces(cfg))  # No checkpoint: nothing to check.
  (tmp_path / 'config.json').write_text(saved.to_json())
  checkpoints.Checkpointer(str(tmp_path), 1, **_state()).save(1)
  with pytest.raises(rundir.CheckpointMismatchError) as e:
    rundir.check_resume(cfg, *_spaces(cfg))
  assert str(e.value) == (
      f'cannot resume from the checkpoints in {tmp_path / "checkpoints"}: they were '
      'written with other env, network or optimizer flags (--optimizer=adam there, '
      'rmsprop now; --mlp_hidden_sizes=16 there, 16,16 now); rerun with the flags '
      f'in {tmp_path / "config.json"} or use a new --logdir')
  rundir.check_resume(saved.replace(learning_rate=0.1), *_spaces(cfg))


def test_check_logdir(tmp_path):
  rundir.check_logdir(str(tmp_path / 'new' / 'run'))  # Can be created.
  assert not (tmp_path / 'new').exists()
  assert os.listdir(tmp_path) == []  # The probe file is gone.
  (tmp_path / 'file').write_text('x')
  with pytest.raises(config_lib.ConfigError,
                     match=r'^logdir=.*/file: is a file, not a directory'):
    rundir.check_logdir(str(tmp_path / 'file'))
  with pytest.raises(config_lib.ConfigError, match=r'/file is a file, not a dir'):
    rundir.check_logdir(str(tmp_path / 'file' / 'run'))


def test_check_logdir_read_only(tmp_path):
  ro = tmp_path / 'ro'
  ro.mkdir()
  os.chmod(ro, 0o500)
  try:
    try:  # Root (or a capability) may still write here: then skip.
      (ro / 'probe').write_text('x')
      (ro / 'probe').unlink()
      pytest.skip('this user can write to a read-only directory (root?)')
    except OSError:
      pass
    with pytest.raises(config_lib.ConfigError, match=r'^logdir=.*/ro: cannot be '
                       'written .*Permission denied'):
      rundir.check_logdir(str(ro))
    with pytest.raises(config_lib.ConfigError, match='cannot be written'):
      rundir.check_logdir(str(ro / 'run'))
  finally:
    os.chmod(ro, 0o700)


def test_load_config_errors_name_the_problem(tmp_path):
  with pytest.raises(rundir.RunDirError, match='no such directory'):
    rundir.load_config(str(tmp_path / 'missing'))
  with pytest.raises(rundir.RunDirError, match='has no config.json'):
    rundir.load_config(str(tmp_path))
  (tmp_path / 'config.json').write_text('{"batch_size": 0}')
  with pytest.raises(rundir.RunDirError, match='batch_size=0'):
    rundir.load_config(str(tmp_path))


def test_restore_network_round_trip(tmp_path):
  cfg = testing.tiny_config(logdir=str(tmp_path), use_lstm=True)
  (tmp_path / 'config.json').write_text(cfg.to_json())
  with pytest.raises(rundir.RunDirError, match='has no checkpoint'):
    checkpoints.restore_network(str(tmp_path))
  net = checkpoints.build_network(cfg)
  for v in net.variables:
    v.assign(tf.random.normal(v.shape, seed=1, dtype=v.dtype))
  extra = tf.Variable(3, dtype=tf.int64)  # Like the learner's counters: ignored.
  checkpoints.Checkpointer(str(tmp_path), 1, network=net, learner_steps=extra).save(3)
  loaded_cfg, loaded, path = checkpoints.restore_network(str(tmp_path))
  assert loaded_cfg == cfg
  assert path.endswith('ckpt-3')
  for a, b in zip(loaded.variables, net.variables):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def _network_checkpoints(tmp_path, steps=(1, 2, 3)):
  """Writes config.json and one checkpoint per step, the network's weights all
  equal to the step; returns (config, checkpoint paths)."""
  cfg = testing.tiny_config(logdir=str(tmp_path))
  (tmp_path / 'config.json').write_text(cfg.to_json())
  net = checkpoints.build_network(cfg)
  ckpt = checkpoints.Checkpointer(str(tmp_path), len(steps), network=net)
  paths = []
  for step in steps:
    for v in net.variables:
      v.assign(tf.fill(v.shape, tf.cast(step, v.dtype)))
    paths.append(ckpt.save(step))
  return cfg, paths


@pytest.mark.parametrize('damage', ['truncated_data', 'missing_index'])
def test_restore_network_skips_an_unreadable_latest_checkpoint(
    tmp_path, capfd, damage):
  _, paths = _network_checkpoints(tmp_path)
  _damage(paths[-1], damage)
  capfd.readouterr()
  _, net, path = checkpoints.restore_network(str(tmp_path))
  assert path == paths[1]
  for v in net.variables:
    np.testing.assert_array_equal(v.numpy(), np.full(v.shape, 2.0, np.float32))
  lines = [l for l in capfd.readouterr().err.splitlines()
           if l.startswith('impala_tf:')]
  assert len(lines) == 1
  assert lines[0].startswith(
      f'impala_tf: warning: checkpoint {paths[-1]} cannot be read (')
  # A checkpoint asked for by name is not replaced by another.
  with pytest.raises(rundir.RunDirError) as e:
    checkpoints.restore_network(str(tmp_path), paths[-1])
  assert str(e.value).startswith(f'{paths[-1]}: cannot be read (')


def test_restore_network_with_no_readable_checkpoint_says_so(tmp_path):
  _, paths = _network_checkpoints(tmp_path, steps=(1, 2))
  for p in paths:
    _damage(p, 'truncated_data')
  with pytest.raises(rundir.CheckpointUnreadableError) as e:
    checkpoints.restore_network(str(tmp_path))
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(
      f'--logdir={tmp_path}: no checkpoint in checkpoints/ can be read (ckpt-2: ')
  assert '; ckpt-1: ' in message


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
