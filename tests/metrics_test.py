"""Tests for impala_tf.metrics: metrics.jsonl, TensorBoard scalars, console line."""

import glob
import json
import os
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import driver
from impala_tf import metrics
from impala_tf import testing
from impala_tf import types

# The metrics.jsonl names scripts read (a stable interface: none may be renamed or
# dropped; new ones may be added).
JSONL_NAMES = frozenset("""
    env_frames trained_frames consumed_frames replayed_frames learner_steps episodes
    wall_seconds learner_queue_size learner_queue_capacity learning_rate grad_norm
    actor_restarts nonfinite_updates num_replicas startup_seconds
    first_learner_step_unix fps policy_lag_mean policy_lag_max learner_wait_fraction
    episode_return_mean episode_length_mean episodes_in_mean loss policy_loss
    baseline_loss entropy_loss entropy rho_mean rho_clip_fraction advantage_mean
    advantage_std value_mean
""".split())


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
  assert scalars['throughput/env_frames'] == [(1200, 1200.0), (2400, 2400.0)]
  assert scalars['throughput/fps'] == [(1200, 250.5), (2400, 100.0)]
  assert scalars['throughput/learner_wait_fraction'] == [(1200, 0.125),
                                                         (2400, 0.125)]
  assert scalars['lag/learner_queue_size'] == [(1200, 2.0), (2400, 2.0)]
  # None / non-finite / bool / string values are not written as scalars.
  assert scalars['episode/episode_return_mean'] == [(1200, 4.25)]
  # The return against learner steps too (step = learner_steps).
  assert scalars[metrics.RETURN_BY_LEARNER_STEPS_TAG] == [(3, 4.25)]
  assert not any(t.endswith(('/loss', '/final', '/note')) for t in scalars)
  assert set(scalars) == {metrics.tensorboard_tag(k) for k in _base()} | {
      metrics.RETURN_BY_LEARNER_STEPS_TAG}
  for tag in scalars:
    assert plugins.get(tag) == {'scalars'}, tag
  assert metrics.FLAGS_TAG not in scalars  # Only with flag_values.


def test_sections_of_known_and_unknown_names():
  assert metrics.tensorboard_tag('episode_return_mean') == (
      'episode/episode_return_mean')
  assert metrics.tensorboard_tag('loss') == 'loss/loss'
  assert metrics.tensorboard_tag('grad_norm') == 'optimizer/grad_norm'
  assert metrics.tensorboard_tag('fps') == 'throughput/fps'
  assert metrics.tensorboard_tag('policy_lag_max') == 'lag/policy_lag_max'
  assert metrics.tensorboard_tag('actor_restarts') == 'actors/actor_restarts'
  assert set(metrics.SECTIONS.values()) == set(metrics.SECTION_NAMES)
  # Names the table does not list land in a sensible section, never an error.
  for name, sec in [('grad_norm_policy', 'optimizer'),
                    ('grad_clipped_fraction', 'optimizer'),
                    ('popart_mu', 'loss'), ('popart_sigma', 'loss'),
                    ('log_rho_abs_mean', 'loss'),
                    ('rho_above_1p1_fraction', 'loss'),
                    ('actor_env_seconds', 'actors'), ('episode_return_max', 'episode'),
                    ('queue_wait', 'lag'), ('sampled_frames', 'throughput'),
                    ('', 'loss'), ('something_new', 'loss')]:
    assert metrics.section(name) == sec, name
    assert sec in metrics.SECTION_NAMES


def test_docs_list_every_name_with_its_tag():
  """docs/metrics.md has a row `| `NAME` | `SECTION/NAME` |` per SECTIONS entry."""
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      'docs', 'metrics.md')
  with open(path, encoding='utf-8') as f:
    text = f.read()
  missing = [f'| `{name}` | `{metrics.tensorboard_tag(name)}` |'
             for name in metrics.SECTIONS
             if f'| `{name}` | `{metrics.tensorboard_tag(name)}` |' not in text]
  assert not missing, 'add these rows to docs/metrics.md:\n' + '\n'.join(missing)
  assert metrics.RETURN_BY_LEARNER_STEPS_TAG in text and metrics.FLAGS_TAG in text


def test_flags_text_summary_at_step_0(tmp_path):
  w = metrics.MetricsWriter(str(tmp_path), {'env': 'CartPole-v1', 'batch_size': 32,
                                            'target_return': None,
                                            'mlp_hidden_sizes': (64, 64),
                                            'use_lstm': False})
  w.write(_base())
  w.close()
  files = glob.glob(os.path.join(str(tmp_path), 'tensorboard', 'events.*'))
  texts = []
  for path in files:
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        if v.tag == metrics.FLAGS_TAG:
          assert v.metadata.plugin_data.plugin_name == 'text'
          texts.append((event.step, tf.make_ndarray(v.tensor).item().decode()))
  assert len(texts) == 1 and texts[0][0] == 0
  text = texts[0][1]
  for row in ('| `--env` | `CartPole-v1` |', '| `--batch_size` | `32` |',
              '| `--target_return` | `none` |', '| `--mlp_hidden_sizes` | `64,64` |',
              '| `--use_lstm` | `false` |'):
    assert row in text, text


def test_episode_log_mean_over_last_window():
  log = metrics.EpisodeLog()
  assert log.window == 100
  assert log.summary() == {'episode_return_mean': None, 'episode_length_mean': None,
                           'episodes_in_mean': 0, 'episodes': 0}
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


def test_episode_log_restore_puts_a_resumed_runs_episodes_first():
  log = metrics.EpisodeLog(window=4)
  log.count = 10  # As the run counters restore it.
  log.add([types.EpisodeStats(7.0, 70)])  # An episode that ended before the restore.
  log.restore([types.EpisodeStats(float(i), i) for i in range(1, 5)])
  # Oldest first: the restored 1..4, then 7; the window keeps the last 4.
  assert log.recent() == [types.EpisodeStats(float(i), i) for i in (2, 3, 4)] + [
      types.EpisodeStats(7.0, 70)]
  assert log.count == 11  # The restore does not count episodes.
  assert log.summary() == {'episode_return_mean': 4.0, 'episode_length_mean': 19.75,
                           'episodes_in_mean': 4, 'episodes': 11}
  empty = metrics.EpisodeLog()
  empty.restore([])
  assert empty.summary()['episodes_in_mean'] == 0


def test_episode_log_reads_count_and_window_together():
  log = metrics.EpisodeLog(window=1000)
  stop = threading.Event()

  def add_forever():
    while not stop.is_set():
      log.add([types.EpisodeStats(1.0, 1)])

  # Switch threads often, so reading the count and the window apart would race
  # (about 5% of 2,000 such reads disagreed on a 2-core machine).
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  adder = threading.Thread(target=add_forever)
  adder.start()
  try:
    snapshots = [log.snapshot() for _ in range(2000)]
    summaries = [log.summary() for _ in range(2000)]
  finally:
    stop.set()
    adder.join()
    sys.setswitchinterval(interval)
  # While an actor adds episodes, the checkpoint's count and window still agree.
  assert snapshots[-1][0] > 0
  for count, recent in snapshots:
    assert len(recent) == min(count, 1000), (count, len(recent))
  for s in summaries:  # A metrics line's count and mean agree the same way.
    assert s['episodes_in_mean'] == min(s['episodes'], 1000), s


def test_console_line():
  line = metrics.console_line(_base(env_frames=1234567, loss=0.5))
  assert line.startswith('frames 1,234,567 | ')
  assert 'return 4.2' in line  # 4.25 -> one decimal.
  assert '(7 eps)' in line
  assert 'steps 3' in line
  assert 'queue 2/8' in line
  assert 'loss 0.5' in line
  assert 'ETA' not in line  # No total: no progress.
  line = metrics.console_line(_base(episode_return_mean=None))
  assert 'return n/a' in line
  assert 'loss nan' in line


@pytest.mark.parametrize('frames,fps,total,progress,eta', [
    # 526,160 frames left at 20,000 fps: 26 s.
    (473_840, 20_000.0, 1_000_000, 'frames 473,840/1,000,000 (47%)', 'ETA 26 s'),
    (100_000, 1_000.0, 1_000_000, 'frames 100,000/1,000,000 (10%)', 'ETA 15 min'),
    (0, 2_000.0, 200_000_000, 'frames 0/200,000,000 (0%)', 'ETA 27.8 h'),
    (5_000, 0.0, 10_000, 'frames 5,000/10,000 (50%)', 'ETA n/a'),
    (10_040, 300.0, 10_000, 'frames 10,040/10,000 (100%)', 'ETA 0 s'),
])
def test_console_line_progress_and_eta(frames, fps, total, progress, eta):
  line = metrics.console_line(_base(env_frames=frames, fps=fps), total)
  assert line.startswith(progress + ' | fps '), line
  assert line.endswith(' | ' + eta), line
  assert '\n' not in line


@pytest.fixture(scope='module')
def short_run(tmp_path_factory):
  """A short run of the chain env: its logdir and config."""
  config = testing.tiny_config(logdir=str(tmp_path_factory.mktemp('run')),
                               total_environment_frames=300, log_interval_secs=0.2)
  driver.train(config)
  return config


@pytest.mark.e2e
def test_short_run_event_file_read_by_tensorboard(short_run):
  """TensorBoard's own reader finds every scalar under a section, the return
  against env frames and learner steps, and the flags at step 0."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  acc = event_accumulator.EventAccumulator(
      os.path.join(short_run.logdir, 'tensorboard'),
      size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  tags = acc.Tags()['tensors']
  scalars = [t for t in tags
             if acc.SummaryMetadata(t).plugin_data.plugin_name == 'scalars']
  assert len(scalars) >= 25, tags
  for tag in scalars:
    sec, _, name = tag.partition('/')
    assert sec in metrics.SECTION_NAMES and name, tag
  with open(os.path.join(short_run.logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    lines = [json.loads(l) for l in f]
  # metrics.jsonl keeps its flat names; each number is in TensorBoard by its tag.
  assert JSONL_NAMES <= set(lines[-1]), JSONL_NAMES - set(lines[-1])
  numbers = {k for l in lines for k, v in l.items()
             if isinstance(v, (int, float)) and not isinstance(v, bool)}
  assert {metrics.tensorboard_tag(k) for k in numbers} <= set(scalars)
  frames = [e.step for e in acc.Tensors('episode/episode_return_mean')]
  assert frames == [l['env_frames'] for l in lines
                    if l['episode_return_mean'] is not None]
  returns = [float(tf.make_ndarray(e.tensor_proto))
             for e in acc.Tensors('episode/episode_return_mean')]
  assert returns == [8.0] * len(returns)  # The chain env: 8 per episode.
  by_steps = acc.Tensors(metrics.RETURN_BY_LEARNER_STEPS_TAG)
  assert [e.step for e in by_steps] == [l['learner_steps'] for l in lines
                                        if l['episode_return_mean'] is not None]
  assert acc.SummaryMetadata(metrics.FLAGS_TAG).plugin_data.plugin_name == 'text'
  (flags_event,) = acc.Tensors(metrics.FLAGS_TAG)
  assert flags_event.step == 0
  text = tf.make_ndarray(flags_event.tensor_proto).item().decode()
  assert f'| `--env` | `{short_run.env}` |' in text
  assert '| `--total_environment_frames` | `300` |' in text


def test_mean_or_none():
  assert metrics.mean_or_none([]) is None
  assert metrics.mean_or_none([1.0, 2.0, 6.0]) == 3.0
