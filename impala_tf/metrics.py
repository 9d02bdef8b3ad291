"""Run metrics: metrics.jsonl, TensorBoard scalars and a console line.

Every log interval the driver writes one JSON object to `logdir/metrics.jsonl` and the
same numeric values as `tf.summary` scalars (under `logdir/tensorboard/`, step =
env_frames), and logs one console line.
"""

import collections
import json
import math
import os
import threading
from typing import Dict, Iterable, List, Optional

import numpy as np
import tensorflow as tf

from impala_tf import types

from tensorflow.core.framework import summary_pb2  # pylint: disable=g-direct-tensorflow-import

_SCALAR_METADATA_PROTO = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name='scalars'),
    data_class=summary_pb2.DATA_CLASS_SCALAR)


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

  def summary(self) -> Dict[str, Optional[float]]:
    """Mean return/length over the last `window` episodes (None before any)."""
    with self._lock:
      recent = list(self._recent)
    if not recent:
      return {'episode_return_mean': None, 'episode_length_mean': None,
              'episodes_in_mean': 0}
    return {
        'episode_return_mean': float(np.mean([e.episode_return for e in recent])),
        'episode_length_mean': float(np.mean([e.length for e in recent])),
        'episodes_in_mean': len(recent),
    }


def _jsonable(v):
  if isinstance(v, (np.floating, np.integer)):
    v = v.item()
  if isinstance(v, float) and not math.isfinite(v):
    return None
  return v


class MetricsWriter:
  """Writes metric dicts to metrics.jsonl and TensorBoard.

  Args:
    logdir: the run directory (must exist).
  """

  def __init__(self, logdir: str):
    self._path = os.path.join(logdir, 'metrics.jsonl')
    self._file = open(self._path, 'a', encoding='utf-8')
    self._summary = tf.summary.create_file_writer(os.path.join(logdir, 'tensorboard'))

  def write(self, metrics: Dict[str, object]):
    """Appends one line and the scalars (step = metrics['env_frames'])."""
    line = {k: _jsonable(v) for k, v in metrics.items()}
    self._file.write(json.dumps(line, sort_keys=True) + '\n')
    self._file.flush()
    step = int(metrics.get('env_frames', 0))
    # One Summary proto with every scalar, written by one op: what tf.summary.scalar
    # writes (the scalar plugin's metadata), without needing the tensorboard package
    # and without an eager op per scalar (~30 per line).
    summary = summary_pb2.Summary()
    for k, v in line.items():
      if isinstance(v, (int, float)) and not isinstance(v, bool):
        value = summary.value.add(tag=k, metadata=_SCALAR_METADATA_PROTO)
        value.tensor.CopyFrom(tf.make_tensor_proto(float(v), tf.float32))
    with self._summary.as_default(step=step):
      tf.summary.experimental.write_raw_pb(summary.SerializeToString())
    self._summary.flush()

  def close(self):
    self._file.close()
    self._summary.close()


def console_line(m: Dict[str, object]) -> str:
  """One human line: frames, fps, return, losses, lag, queue fill."""
  ret = m.get('episode_return_mean')
  ret = 'n/a' if ret is None else f'{ret:.1f}'
  return (f"frames {m['env_frames']:,} | fps {m['fps']:,.0f} | steps "
          f"{m['learner_steps']:,} | return {ret} ({m['episodes']} eps) | loss "
          f"{m.get('loss', float('nan')):.3g} | entropy "
          f"{m.get('entropy', float('nan')):.3f} | lag {m['policy_lag_mean']:.2f}"
          f"/{m['policy_lag_max']:.0f} | queue {m['learner_queue_size']}"
          f"/{m['learner_queue_capacity']} | wait {m['learner_wait_fraction']:.2f}")


def mean_or_none(values: List[float]) -> Optional[float]:
  return float(np.mean(values)) if values else None
