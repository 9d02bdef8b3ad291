"""Tests for impala_tf.metrics: metrics.jsonl, TensorBoard scalars, console line."""

import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import metrics
from impala_tf import types


def _read_events(logdir):
  """{tag: [(step, value)]} and {tag: plugin names} from logdir/tensorboard."""
  files = glob.glob(os.path.join(logdir, 'tensorboard', 'events.out.tfevents.*'))
  assert files, os.listdir(logdir)
  scalars, plugins = {}, {}
  for path in files:
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        if v.HasField('tensor'):
          value = float(tf.make_ndarray(v.tensor))
        else:
          value = v.simple_value
        scalars.setdefault(v.tag, []).append((event.step, value))
        if v.metadata.plugin_data.plugin_name:
          plugins.setdefault(v.tag, set()).add(v.metadata.plugin_data.plugin_name)
  return scalars, plugins


def _base(**kw):
  m = {'env_frames': 1200, 'learner_steps': 3, 'episodes': 7, 'fps': 250.5,
       'episode_return_mean': 4.25, 'policy_lag_mean': 1.5, 'policy_lag_max': 3.0,
       'learner_queue_size': 2, 'learner_queue_capacity': 8,
       'learner_wait_fraction': 0.125, 'wall_seconds': 9.0}
  m.update(kw)
  return m


def test_jsonl_one_line_per_write(tmp_path):
  w = metrics.MetricsWriter(str(tmp_path))
  w.write(_base())
  w.write(_base(env_frames=np.int64(2400), fps=np.float32(0.5),
                episode_return_mean=None, loss=float('nan'), final=True))
  lines = (tmp_path / 'metrics.jsonl').read_text().splitlines()
  assert len(lines) == 2  # Flushed on every write, before close.
  w.close()
  first, second = (json.loads(l) for l in lines)
  assert first == _base()
  assert second['env_frames'] == 2400 and isinstance(second['env_frames'], int)
  assert second['fps'] == 0.5
  assert second['episode_return_mean'] is None
  assert second['loss'] is None  # Non-finite -> null (valid JSON).
  assert second['final'] is True
  for key in ('env_frames', 'learner_steps', 'episodes', 'episode_return_mean',
              'fps', 'wall_seconds', 'policy_lag_mean'):
    assert key in first


def test_jsonl_appends_on_resume(tmp_path):
  for frames in (10, 20):
    w = metrics.MetricsWriter(str(tmp_path))
    w.write(_base(env_frames=frames))
    w.close()
  lines = (tmp_path / 'metrics.jsonl').read_text().splitlines()
  assert [json.loads(l)['env_frames'] for l in lines] == [10, 20]


def test_tensorboard_scalars_with_step_and_values(tmp_path):
  w = metrics.MetricsWriter(str(tmp_path))
  w.write(_base())
  w.write(_base(env_frames=2400, fps=np.float64(100.0), episode_return_mean=None,
                loss=float('inf'), final=True, note='text'))
  w.close()
  scalars, plugins = _read_events(str(tmp_path))
  assert scalars['env_frames'] == [(1200, 1200.0), (2400, 2400.0)]
  assert scalars['fps'] == [(1200, 250.5), (2400, 100.0)]
  assert scalars['learner_wait_fraction'] == [(1200, 0.125), (2400, 0.125)]
  assert scalars['learner_queue_size'] == [(1200, 2.0), (2400, 2.0)]
  # None / non-finite / bool / string values are not written as scalars.
  assert scalars['episode_return_mean'] == [(1200, 4.25)]
  assert 'loss' not in scalars and 'final' not in scalars and 'note' not in scalars
  assert set(scalars) == set(_base())
  for tag in scalars:
    assert plugins.get(tag) == {'scalars'}, tag


def test_episode_log_mean_over_last_window():
  log = metrics.EpisodeLog()
  assert log.window == 100
  assert log.summary() == {'episode_return_mean': None, 'episode_length_mean': None,
                           'episodes_in_mean': 0}
  log.add([types.EpisodeStats(float(i), i + 1) for i in range(150)])
  s = log.summary()
  assert log.count == 150
  assert s['episodes_in_mean'] == 100
  assert s['episode_return_mean'] == pytest.approx(np.mean(np.arange(50, 150)))
  assert s['episode_length_mean'] == pytest.approx(np.mean(np.arange(51, 151)))
  small = metrics.EpisodeLog(window=2)
  small.add([types.EpisodeStats(1.0, 1), types.EpisodeStats(2.0, 2)])
  small.add([types.EpisodeStats(6.0, 4)])
  assert small.summary()['episode_return_mean'] == 4.0
  assert small.count == 3


def test_console_line():
  line = metrics.console_line(_base(env_frames=1234567, loss=0.5))
  assert 'frames 1,234,567' in line
  assert 'return 4.2' in line  # 4.25 -> one decimal.
  assert '(7 eps)' in line
  assert 'steps 3' in line
  assert 'queue 2/8' in line
  assert 'loss 0.5' in line
  line = metrics.console_line(_base(episode_return_mean=None))
  assert 'return n/a' in line
  assert 'loss nan' in line


def test_mean_or_none():
  assert metrics.mean_or_none([]) is None
  assert metrics.mean_or_none([1.0, 2.0, 6.0]) == 3.0
