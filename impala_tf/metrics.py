"""Run metrics: metrics.jsonl, TensorBoard scalars and a console line.

Every log interval the driver writes one JSON object to `logdir/metrics.jsonl` and the
same numeric values as `tf.summary` scalars (under `logdir/tensorboard/`, step =
env_frames), and logs one console line.

metrics.jsonl keeps flat names (`episode_return_mean`, `fps`, ...): scripts read them,
so they are a stable interface. In TensorBoard the same values are grouped in
sections a reader scans, the tag being `SECTION/NAME` (`episode/episode_return_mean`,
`throughput/fps`): `SECTIONS` maps each known name to its section, and a name it does
not list gets one from `_SECTION_RULES` (never an error). `docs/metrics.md` lists
every name with its tag. Besides, `episode/episode_return_mean_vs_learner_steps`
holds the return with step = learner steps, and `run/flags` (text, step 0) the run's
flags.
`LearnerWindow` gathers the learner's statistics between two lines (frames/s,
policy lag, the wait split, the clipped fraction).
"""

import collections
import json
import math
import os
import threading
import time
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from impala_tf import types

from tensorflow.core.framework import summary_pb2  # pylint: disable=g-direct-tensorflow-import

_SCALAR_METADATA_PROTO = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name='scalars'),
    data_class=summary_pb2.DATA_CLASS_SCALAR)
# What tf.summary.text writes (TensorBoard's text plugin, markdown rendered).
_TEXT_METADATA_PROTO = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name='text'),
    data_class=summary_pb2.DATA_CLASS_TENSOR)

# TensorBoard sections, in the order a reader scans them.
SECTION_NAMES = ('episode', 'eval', 'loss', 'optimizer', 'throughput', 'lag',
                 'actors')

# metrics.jsonl name -> TensorBoard section (tag `SECTION/NAME`). Add a row for a new
# metric (and one to docs/metrics.md); a name missing here still gets a section from
# _SECTION_RULES.
SECTIONS = {
    # Finished episodes (game scores; the mean over the last 100).
    'episode_return_mean': 'episode',
    'episode_length_mean': 'episode',
    'episodes_in_mean': 'episode',
    'episodes': 'episode',
    # Periodic evaluations (--eval_interval_frames), on envs of their own.
    'eval_return_mean': 'eval',
    'eval_return_std': 'eval',
    'eval_episode_length_mean': 'eval',
    'eval_episodes': 'eval',
    'eval_env_frames': 'eval',
    'eval_seconds': 'eval',
    # The loss terms and what V-trace saw in the batch.
    'loss': 'loss',
    'policy_loss': 'loss',
    'baseline_loss': 'loss',
    'entropy_loss': 'loss',
    'entropy': 'loss',
    'rho_mean': 'loss',
    'rho_clip_fraction': 'loss',
    'advantage_mean': 'loss',
    'advantage_std': 'loss',
    'value_mean': 'loss',
    'log_rho_abs_mean': 'loss',
    'rho_above_1p1_fraction': 'loss',
    'ppo_clip_fraction': 'loss',
    'popart_mu': 'loss',
    'popart_sigma': 'loss',
    'popart_replica_spread': 'loss',
    # The update.
    'learning_rate': 'optimizer',
    'grad_norm': 'optimizer',
    'grad_norm_policy': 'optimizer',
    'grad_norm_baseline': 'optimizer',
    'grad_norm_entropy': 'optimizer',
    'grad_clipped_fraction': 'optimizer',
    'nonfinite_updates': 'optimizer',
    # Frames, steps and time.
    'env_frames': 'throughput',
    'trained_frames': 'throughput',
    'consumed_frames': 'throughput',
    'replayed_frames': 'throughput',
    'learner_steps': 'throughput',
    'fps': 'throughput',
    'wall_seconds': 'throughput',
    'startup_seconds': 'throughput',
    'first_learner_step_unix': 'throughput',
    'learner_wait_fraction': 'throughput',
    'num_replicas': 'throughput',
    # How stale the data is: policy lag and the learner queue's fill.
    'policy_lag_mean': 'lag',
    'policy_lag_max': 'lag',
    'learner_queue_size': 'lag',
    'learner_queue_capacity': 'lag',
    # The actors.
    'actor_restarts': 'actors',
}

# For names SECTIONS does not list: the first rule whose word is in the name gives
# the section; a name none matches is a learner diagnostic and goes to 'loss'.
_SECTION_RULES = (
    ('eval_', 'eval'),
    ('episode', 'episode'),
    ('actor', 'actors'),
    ('lag', 'lag'),
    ('queue', 'lag'),
    ('grad', 'optimizer'),
    ('learning_rate', 'optimizer'),
    ('optimizer', 'optimizer'),
    ('frames', 'throughput'),
    ('fps', 'throughput'),
    ('seconds', 'throughput'),
    ('steps', 'throughput'),
)
_DEFAULT_SECTION = 'loss'

# Episode return against learner steps (step = learner_steps), besides env frames.
RETURN_BY_LEARNER_STEPS_TAG = 'episode/episode_return_mean_vs_learner_steps'
FLAGS_TAG = 'run/flags'


def section(name: str) -> str:
  """The TensorBoard section of a metrics.jsonl name (one of SECTION_NAMES)."""
  if name in SECTIONS:
    return SECTIONS[name]
  for word, sec in _SECTION_RULES:
    if word in name:
      return sec
  return _DEFAULT_SECTION


def tensorboard_tag(name: str) -> str:
  """`SECTION/NAME`: the TensorBoard tag of a metrics.jsonl name."""
  return f'{section(name)}/{name}'


class EpisodeLog:
  """Thread-safe record of finished episodes: a count and the last `window`."""

  def __init__(self, window: int = 100):
    self._lock = threading.Lock()
    self._recent = collections.deque(maxlen=window)
    self.window = window
    self.count = 0

  def add(self, episodes: Iterable[types.EpisodeStats]):
    with self._lock:
      for e in episodes:
        self._recent.append(e)
        self.count += 1

  def recent(self) -> List[types.EpisodeStats]:
    """The episodes of the mean, oldest first (at most `window`)."""
    with self._lock:
      return list(self._recent)

  def snapshot(self) -> Tuple[int, List[types.EpisodeStats]]:
    """The count and the episodes of the mean, taken together under one lock.

    An episode added while a checkpoint is written is in both or in neither, so
    a resumed run never averages more episodes than its count says.
    """
    with self._lock:
      return self.count, list(self._recent)

  def restore(self, episodes: Iterable[types.EpisodeStats]):
    """Puts a resumed run's last episodes before any new ones (oldest first).

    The count is not changed (the run counters restore it); of `episodes` and the
    episodes added since, the last `window` are kept.
    """
    with self._lock:
      added = list(self._recent)
      self._recent.clear()
      self._recent.extend(list(episodes) + added)

  def summary(self) -> Dict[str, Optional[float]]:
    """The count and the mean return/length over the last `window` episodes.

    Returns:
      `episodes` (int, the count), `episodes_in_mean` (int, <= `window`) and
      `episode_return_mean`, `episode_length_mean` (float; None before any
      episode), all read under one lock: an episode an actor adds meanwhile is
      in all of them or in none.
    """
    count, recent = self.snapshot()
    if not recent:
      return {'episode_return_mean': None, 'episode_length_mean': None,
              'episodes_in_mean': 0, 'episodes': count}
    return {
        'episode_return_mean': float(np.mean([e.episode_return for e in recent])),
        'episode_length_mean': float(np.mean([e.length for e in recent])),
        'episodes_in_mean': len(recent),
        'episodes': count,
    }


def _jsonable(v):
  if isinstance(v, (np.floating, np.integer)):
    v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return None
  return v


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def flags_markdown(flag_values: Mapping[str, object]) -> str:
  """A markdown table `| flag | value |` of `flag_values` (name -> value), sorted."""
  rows = ['| flag | value |', '| --- | --- |']
  for name in sorted(flag_values):
    value = flag_values[name]
    if isinstance(value, (list, tuple)):
      value = ','.join(str(v) for v in value)
    elif value is None:
      value = 'none'
    elif isinstance(value, bool):
      value = 'true' if value else 'false'
    text = str(value).replace('|', '\\|')
    rows.append(f'| `--{name}` | `{text}` |')
  return '\n'.join(rows)


class MetricsWriter:
  """Writes metric dicts to metrics.jsonl and TensorBoard.

  Args:
    logdir: the run directory (must exist).
    flag_values: optional name -> value (e.g. `Config.to_dict()`), written once as
      the text summary `run/flags` (a markdown table) at step 0.
  """

  def __init__(self, logdir: str,
               flag_values: Optional[Mapping[str, object]] = None):
    self._path = os.path.join(logdir, 'metrics.jsonl')
    self._file = open(self._path, 'a', encoding='utf-8')
    self._summary = tf.summary.create_file_writer(os.path.join(logdir, 'tensorboard'))
    if flag_values is not None:
      summary = summary_pb2.Summary()
      value = summary.value.add(tag=FLAGS_TAG, metadata=_TEXT_METADATA_PROTO)
      value.tensor.CopyFrom(tf.make_tensor_proto(flags_markdown(flag_values)))
      self._write_summary(summary, 0)

  def _write_summary(self, summary: summary_pb2.Summary, step: int):
    with self._summary.as_default(step=step):
      tf.summary.experimental.write_raw_pb(summary.SerializeToString())

  def write(self, metrics: Dict[str, object]):
    """Appends one line and the scalars (step = metrics['env_frames']).

    Each number `NAME` becomes the scalar `tensorboard_tag(NAME)`; None, non-finite,
    bool and string values are left out of TensorBoard (and non-finite numbers are
    null in metrics.jsonl).
    """
    line = {k: _jsonable(v) for k, v in metrics.items()}
    self._file.write(json.dumps(line, sort_keys=True) + '\n')
    self._file.flush()
    step = int(metrics.get('env_frames', 0))
    # One Summary proto with every scalar, written by one op: what tf.summary.scalar
    # writes (the scalar plugin's metadata), without needing the tensorboard package
    # and without an eager op per scalar (~30 per line).
    summary = summary_pb2.Summary()
    for k, v in line.items():
      if _is_number(v):
        value = summary.value.add(tag=tensorboard_tag(k),
                                  metadata=_SCALAR_METADATA_PROTO)
        value.tensor.CopyFrom(tf.make_tensor_proto(float(v), tf.float32))
    self._write_summary(summary, step)
    ret, steps = line.get('episode_return_mean'), line.get('learner_steps')
    if _is_number(ret) and _is_number(steps):
      by_steps = summary_pb2.Summary()
      value = by_steps.value.add(tag=RETURN_BY_LEARNER_STEPS_TAG,
                                 metadata=_SCALAR_METADATA_PROTO)
      value.tensor.CopyFrom(tf.make_tensor_proto(float(ret), tf.float32))
      self._write_summary(by_steps, int(steps))
    self._summary.flush()

  def close(self):
    self._file.close()
    self._summary.close()


def format_duration(seconds: float) -> str:
  """'26 s', '12 min', '3.4 h' (rounded; for an ETA)."""
  if seconds < 99.5:
    return f'{seconds:.0f} s'
  if seconds < 99.5 * 60:
    return f'{seconds / 60:.0f} min'
  return f'{seconds / 3600:.1f} h'


def console_line(m: Dict[str, object], total_frames: Optional[int] = None) -> str:
  """One human line: progress, fps, return, losses, lag, queue fill, ETA.

  Args:
    m: a metrics dict (as `MetricsWriter.write` takes).
    total_frames: the run's `total_environment_frames`; with it the line starts
      `frames 473,840/1,000,000 (47%)` and ends `ETA 26 s`, the time left at the
      recent rate (`m['fps']`, the frames per second since the previous line).

  Returns:
    str, one line.
  """
  ret = m.get('episode_return_mean')
  ret = 'n/a' if ret is None else f'{ret:.1f}'
  frames = m['env_frames']
  progress = f'frames {frames:,}'
  eta = ''
  if total_frames:
    progress += f'/{total_frames:,} ({100 * min(frames / total_frames, 1):.0f}%)'
    left = max(total_frames - frames, 0)
    fps = m.get('fps') or 0.0
    if not left or m.get('final'):
      eta = ' | ETA 0 s'
    elif fps > 0 and math.isfinite(fps):
      eta = f' | ETA {format_duration(left / fps)}'
    else:
      eta = ' | ETA n/a'
  return (f"{progress} | fps {m['fps']:,.0f} | steps "
          f"{m['learner_steps']:,} | return {ret} ({m['episodes']} eps) | loss "
          f"{m.get('loss', float('nan')):.3g} | entropy "
          f"{m.get('entropy', float('nan')):.3f} | lag {m['policy_lag_mean']:.2f}"
          f"/{m['policy_lag_max']:.0f} | queue {m['learner_queue_size']}"
          f"/{m['learner_queue_capacity']} | wait {m['learner_wait_fraction']:.2f}"
          f'{eta}')


def mean_or_none(values: List[float]) -> Optional[float]:
  return float(np.mean(values)) if values else None


class LearnerWindow:
  """Learner statistics between two metrics lines."""

  def __init__(self, frames: int):
    self.reset(frames)

  def reset(self, frames: int):
    """Starts a window at `frames` env frames, now."""
    self.frames, self.time = frames, time.time()
    self.wait = self.busy = 0.0
    self.lag_sum = self.lag_max = self.num_unrolls = 0.0
    self.steps = self.clipped = 0

  def add(self, out: Mapping[str, object], step_secs: Optional[float]):
    """One learner call's output (`out['steps']` steps, their sums and maximum).

    Args:
      out: the call's outputs (scalars: numpy or tensors): `data_wait_seconds`,
        `policy_lag_sum`, `num_unrolls`, `policy_lag_max`, `steps`,
        `grad_clipped`.
      step_secs: the call's wall time; None leaves it out of the wait split.
    """
    if step_secs is not None:
      data_wait = float(out['data_wait_seconds'])
      self.wait += data_wait
      self.busy += step_secs - data_wait
    self.lag_sum += float(out['policy_lag_sum'])
    self.num_unrolls += float(out['num_unrolls'])
    self.lag_max = max(self.lag_max, float(out['policy_lag_max']))
    self.steps += int(out['steps'])
    self.clipped += float(out['grad_clipped'])

  def metrics(self, frames: int) -> Dict[str, float]:
    """The window's line entries, the window ending at `frames` env frames now."""
    busy_and_wait = self.wait + self.busy
    return {
        'fps': (frames - self.frames) / max(time.time() - self.time, 1e-9),
        'policy_lag_mean': (self.lag_sum / self.num_unrolls if self.num_unrolls
                            else 0.0),
        'policy_lag_max': self.lag_max,
        'learner_wait_fraction': (self.wait / busy_and_wait if busy_and_wait > 0
                                  else 0.0),
        # Steps in the window whose gradient norm exceeded grad_clip.
        'grad_clipped_fraction': self.clipped / self.steps if self.steps else 0.0,
    }
