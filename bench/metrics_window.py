"""Rates over a window of a run's metrics.jsonl lines, shared by the bench scripts.

A metrics line (impala_tf/metrics.py) carries cumulative counters: `env_frames`
(frames the actors stepped), `trained_frames` (frames the learner trained on, each
use counted), `learner_steps` and `wall_seconds`, plus per-interval values such as
`learner_wait_fraction` and `policy_lag_mean`. A rate is the difference of a
counter between two lines over the difference of their `wall_seconds`.
"""


def window_rates(first, last, steps_decimals=2):
  """Rates between two metrics lines (dicts), `last` later than `first`.

  Returns a dict: env_fps and learner_fps (ints, frames/s), learner_steps_per_sec
  (rounded to `steps_decimals`) and window_seconds (one decimal).

  Raises:
    ValueError: when `last` is not later than `first`.
  """
  dt = last['wall_seconds'] - first['wall_seconds']
  if dt <= 0:
    raise ValueError(f'metrics window of {dt} s: the last line must be later '
                     'than the first')
  rate = lambda key: (last[key] - first[key]) / dt
  return {
      'env_fps': round(rate('env_frames')),
      'learner_fps': round(rate('trained_frames')),
      'learner_steps_per_sec': round(rate('learner_steps'), steps_decimals),
      'window_seconds': round(dt, 1),
  }


def mean_of(lines, key, decimals=3):
  """Mean of `key` over the lines that have it (not None), rounded; None if none."""
  values = [l[key] for l in lines if l.get(key) is not None]
  return round(sum(values) / len(values), decimals) if values else None
