"""Learning curves without TensorBoard: `python -m impala_tf.plot DIR [DIR ...]`.

    python -m impala_tf.plot /tmp/run_a /tmp/run_b --output=curve.png
        [--x=frames|hours] [--random=auto|none|R] [--target=T] [--title=TEXT]
        [--env=ID] [--label=A --label=B] [--mark=FRAMES:RETURN:TEXT ...]
        [--at=FRAMES ...] [--group='docs/pong_metrics_leaky_s*.jsonl' ...]

Draws the 100-episode mean return (`episode_return_mean` of `metrics.jsonl`) against
env frames (`--x=hours`: wall-clock hours) into a PNG, and prints one JSON object
that summarises what it drew. Each argument is a run directory (its `metrics.jsonl`,
and `config.json` when there is one) or a `metrics.jsonl` file itself.

* Runs whose `config.json` differ only in `--seed` (and `--logdir`) are repeated
  seeds of the same flags: they are drawn as one line, the mean over the seeds, with
  a shaded band from the lowest to the highest seed (over the frames all of them
  reached). Every other run is a line of its own. The legend names a line by the
  flags in which it differs from the other lines (or by its directory), with the
  number of seeds; `--label` (repeated, one per line) replaces those names.
* `--group=PATTERN[,PATTERN...]` (repeated) draws the runs its glob patterns (or
  paths) match as seeds of one setup, one line with a band as above, whatever
  their config.json says (bare metrics files have none:
  `--group='docs/pong_metrics_leaky_s*.jsonl'`). These lines come first, in the
  order of the flags, named by the flag's value and the number of runs; then the
  arguments' lines.
* Random play (`--random=auto`: the score of uniformly random actions in a table
  of known envs, `RANDOM_SCORES`; or a number; `none` draws nothing) and
  `--target` (default: the runs' `--target_return` when they share one) are
  black horizontal lines, dashed and dotted (no run's line is black).
* `--mark=FRAMES:RETURN:TEXT` (repeated) draws a reference point, e.g. another
  package's published result (`--mark=20e6:18:RLlib tuned IMPALA`), as a marker
  at FRAMES env frames (`--x=frames` only) and RETURN, named TEXT in the legend.
* `--legend=outside` puts the legend right of the axes on a wider figure (1000 x
  450 pixels instead of 700 x 400, taller when the legend needs it: 0.19 inch per
  entry), where many entries would hide the curves.
* The title names the env and the frames (`PongNoFrameskip-v4, 11.2M env
  frames`); `--title` replaces it. `--env` names the env of runs without a
  config.json.

The summary has, per run: `path`, `label`, `env`, `points` (lines with a return),
`first_return_mean`, `last_return_mean`, `best_return_mean` (with its
`best_env_frames`), `env_frames`, `wall_hours`, `episodes`, `fps_median` (of the
lines' `fps`; null without any), `evals` (`[env_frames, eval_return_mean]` of each
periodic evaluation) and `target_reached` (the first line at or above the target:
`env_frames`, `wall_hours`, `return_mean`; null when no line reached it or there is
no target), and with `--at=FRAMES` (repeated) `returns_at`: the return when the
run reached each FRAMES (its first line at or past it), keyed by FRAMES as an
integer string (null when the run stopped short of it); per line (`lines`):
`label`, `runs`, `last_return_mean` (mean over its seeds), the band's
`last_return_min` / `last_return_max`, and its `color` / `linestyle`
(`line_style`: ten colours, solid, then dashed, ...); and `output`, `x`, `random`,
`target`, `title`, `marks` (`frames`, `return`, `text` each).

Needs matplotlib: `pip install 'impala_tf[plot]'`. Errors (no metrics.jsonl, no
returns in it, no matplotlib, a bad flag) end the program with exit status 2 and one
line on stderr. This module imports neither TensorFlow nor the rest of impala_tf's
training code.
"""

import glob
import json
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

from absl import app
from absl import flags
import numpy as np

from impala_tf import flags as flags_lib

PROG = 'impala_tf.plot'
PLOT_INSTALL_HINT = "pip install 'impala_tf[plot]'"
X_AXES = ('frames', 'hours')
# Flags that do not make runs different experiments.
_NOT_EXPERIMENT_FLAGS = frozenset(('seed', 'logdir'))
_BAND_POINTS = 200

# Mean return of uniformly random actions. Atari: the "random" column of Mnih et
# al. 2015 (Nature, Extended Data Table 2), matched by game name in any id
# ('PongNoFrameskip-v4', 'ALE/Pong-v5'). CartPole-v1: the mean of 10,000 episodes of
# uniformly random actions (env i reset with seed i, actions from
# numpy.random.default_rng(0)): 22.2 (standard error 0.1).
RANDOM_SCORES = {
    'CartPole-v1': 22.2,
    'Alien': 227.8, 'Amidar': 5.8, 'Assault': 222.4, 'Asterix': 210.0,
    'Asteroids': 719.1, 'Atlantis': 12850.0, 'BankHeist': 14.2,
    'BattleZone': 2360.0, 'BeamRider': 363.9, 'Bowling': 23.1, 'Boxing': 0.1,
    'Breakout': 1.7, 'Centipede': 2091.0, 'Enduro': 0.0, 'Freeway': 0.0,
    'Gravitar': 173.0, 'MontezumaRevenge': 0.0, 'MsPacman': 307.3, 'Pong': -20.7,
    'PrivateEye': 24.9, 'Qbert': 163.9, 'Seaquest': 68.4, 'SpaceInvaders': 148.0,
    'Venture': 0.0,
}


class PlotError(ValueError):
  """A run cannot be read or drawn; the message is one line."""


LEGENDS = ('inside', 'outside')
DPI = 100
# Height of the figure with the legend outside: padding plus one row per entry
# (inches; fontsize 'small' at DPI).
OUTSIDE_LEGEND_PAD_IN = 0.6
OUTSIDE_LEGEND_ENTRY_IN = 0.19


def _whole_pixels(inches: float) -> float:
  """`inches`, moved to a whole number of pixels at DPI plus a quarter pixel.

  Matplotlib releases turn inches x dpi into pixels differently (some truncate,
  some round: 7.82 in at 100 dpi is 781 or 782 pixels); a quarter pixel above a
  whole number gives the same size under both.
  """
  return (round(inches * DPI) + 0.25) / DPI


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the plot flags (not at import: importing defines no flags)."""
  def define(fn, name, *args, **kwargs):
    if name not in flag_values:
      fn(name, *args, flag_values=flag_values, **kwargs)

  define(flags.DEFINE_string, 'output', None, 'The PNG to write. Required.')
  define(flags.DEFINE_enum, 'x', 'frames', list(X_AXES),
         "x axis: 'frames' (env frames) or 'hours' (wall-clock hours).")
  define(flags.DEFINE_string, 'random', 'auto',
         "Return of random play, drawn dashed: 'auto' (RANDOM_SCORES, when the "
         "env is in it), 'none', or a number.")
  define(flags.DEFINE_float, 'target', None,
         "A target return, drawn dashed; default: the runs' --target_return "
         'when they share one.')
  define(flags.DEFINE_string, 'title', None,
         "The title; default: the env and the frames ('Pong..., 11.2M env "
         "frames').")
  define(flags.DEFINE_string, 'env', None,
         'The env id of runs without a config.json (a bare metrics.jsonl).')
  define(flags.DEFINE_multi_string, 'mark', None,
         'A reference point FRAMES:RETURN:TEXT (repeat for more), drawn as a '
         'marker named TEXT, e.g. 20e6:18:RLlib tuned IMPALA. Needs --x=frames.')
  define(flags.DEFINE_enum, 'legend', 'inside', list(LEGENDS),
         'Where the legend goes: inside the axes (700 x 400 pixels), or outside, '
         'right of them (1000 x 450 pixels), for many lines and marks.')
  define(flags.DEFINE_multi_string, 'at', None,
         "Env frames at which the summary gives each run's return (repeat for "
         "more): its `returns_at`, e.g. --at=15e6.")
  define(flags.DEFINE_multi_string, 'label', None,
         'Legend name of a line; repeat it, one per line in the order of the '
         'lines: the --group lines, then the arguments (repeated seeds of the '
         'same flags are one line).')
  define(flags.DEFINE_multi_string, 'group', None,
         'Glob patterns or paths, comma-separated, whose runs (run directories '
         'or metrics.jsonl files) are drawn as seeds of one setup: one line, '
         'their mean, with a band (repeat for more setups), e.g. '
         "--group='docs/pong_metrics_leaky_s*.jsonl'.")


def _random_score(env: Optional[str]) -> Optional[float]:
  if not env:
    return None
  if env in RANDOM_SCORES:
    return RANDOM_SCORES[env]
  name = env.split(':')[-1].split('/')[-1]  # 'ALE/Pong-v5' -> 'Pong-v5'.
  name = re.sub(r'(NoFrameskip|Deterministic)?-v\d+$', '', name)
  return RANDOM_SCORES.get(name)


def read_run(path: str, env: Optional[str] = None) -> Dict[str, object]:
  """Reads a run directory or a metrics.jsonl file.

  Args:
    path: a run directory, or a metrics.jsonl file.
    env: the env id when the run has no config.json.

  Returns:
    dict: `path`, `config` (config.json as a dict, or {}), `env`, `frames`,
    `hours`, `returns` (float64 `[N]` numpy arrays of the lines that have a return),
    `wall_hours`, `env_frames` and `episodes` (of the last line), `fps` (float64
    `[M]`, the lines' `fps`) and `evals` (`[env_frames, eval_return_mean]` pairs).

  Raises:
    PlotError: no metrics.jsonl, an unreadable one, or no episode return in it.
  """
  if os.path.isdir(path):
    metrics_path = os.path.join(path, 'metrics.jsonl')
    config_path = os.path.join(path, 'config.json')
  else:
    metrics_path = path
    config_path = os.path.join(os.path.dirname(path), 'config.json')
    if os.path.basename(path) != 'metrics.jsonl':
      config_path = None  # A renamed copy (docs/pong_metrics.jsonl): no config.
  if not os.path.isfile(metrics_path):
    raise PlotError(f'{path}: no such run directory or metrics.jsonl'
                    if not os.path.exists(path) else f'{path}: has no metrics.jsonl')
  lines = []
  with open(metrics_path, encoding='utf-8') as f:
    for number, text in enumerate(f, 1):
      if not text.strip():
        continue
      try:
        lines.append(json.loads(text))
      except ValueError:
        raise PlotError(f'{metrics_path}:{number}: not a JSON line') from None
  config = {}
  if config_path and os.path.isfile(config_path):
    with open(config_path, encoding='utf-8') as f:
      config = json.load(f)
  points = [l for l in lines if l.get('episode_return_mean') is not None and
            l.get('env_frames') is not None]
  if not points:
    raise PlotError(f'{metrics_path}: has no episode_return_mean yet (no episode '
                    'has finished)')
  last = lines[-1]
  return {
      'path': path,
      'config': config,
      'env': config.get('env') or env,
      'frames': np.array([p['env_frames'] for p in points], np.float64),
      'hours': np.array([p.get('wall_seconds', 0.0) / 3600 for p in points],
                        np.float64),
      'returns': np.array([p['episode_return_mean'] for p in points], np.float64),
      'env_frames': int(last.get('env_frames', 0)),
      'wall_hours': float(last.get('wall_seconds', 0.0)) / 3600,
      'episodes': last.get('episodes'),
      'fps': np.array([l['fps'] for l in lines if l.get('fps') is not None],
                      np.float64),
      'evals': [[l.get('env_frames'), l['eval_return_mean']] for l in lines
                if l.get('eval_return_mean') is not None],
  }


def target_reached(run: Dict[str, object],
                   target: Optional[float]) -> Optional[Dict[str, object]]:
  """The first point of `run` (from `read_run`) whose return is >= `target`.

  Returns:
    {'env_frames': int, 'wall_hours': float, 'return_mean': float}, or None when
    `target` is None or no point reaches it.
  """
  if target is None:
    return None
  hits = np.flatnonzero(run['returns'] >= target)
  if not hits.size:
    return None
  i = int(hits[0])
  return {'env_frames': int(run['frames'][i]),
          'wall_hours': round(float(run['hours'][i]), 3),
          'return_mean': float(run['returns'][i])}


def expand_group(patterns: str, flag: Optional[str] = None) -> List[str]:
  """The paths a `--group` value matches: its comma-separated globs, in order.

  Args:
    patterns: comma-separated glob patterns or paths.
    flag: the flag as given, for the error (default: `--group=PATTERNS`).

  Returns:
    Each pattern's matches, sorted; a path matched twice is kept once.

  Raises:
    PlotError: a pattern matches nothing.
  """
  found = []
  for pattern in patterns.split(','):
    matches = sorted(glob.glob(pattern))
    if not matches:
      raise PlotError(f'{flag or "--group=" + patterns}: {pattern} matches no run '
                      'directory or metrics.jsonl')
    found += [p for p in matches if p not in found]
  return found


def _experiment(run: Dict[str, object]) -> Optional[str]:
  """The run's flags but the seed (a key that groups repeated seeds), or None."""
  if not run['config']:
    return None
  return json.dumps({k: v for k, v in run['config'].items()
                     if k not in _NOT_EXPERIMENT_FLAGS}, sort_keys=True)


def _group(runs: List[Dict[str, object]]) -> List[List[Dict[str, object]]]:
  """Runs grouped by their flags but the seed, in the order of first appearance."""
  groups, index = [], {}
  for run in runs:
    key = _experiment(run)
    if key is None:
      groups.append([run])
    elif key in index:
      groups[index[key]].append(run)
    else:
      index[key] = len(groups)
      groups.append([run])
  return groups


def _value_text(value) -> str:
  if isinstance(value, (list, tuple)):
    return ','.join(str(v) for v in value)
  return str(value)


def _labels(groups: List[List[Dict[str, object]]]) -> List[str]:
  """Each line's legend name: the flags in which it differs, or its directory."""
  configs = [g[0]['config'] for g in groups]
  keys = sorted({k for c in configs for k in c} - _NOT_EXPERIMENT_FLAGS)
  differing = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True)
                                       for c in configs}) > 1]
  labels = []
  for group in groups:
    config = group[0]['config']
    if config and differing and all(g[0]['config'] for g in groups):
      label = ', '.join(f'{k}={_value_text(config.get(k))}' for k in differing)
    else:
      path = os.path.normpath(group[0]['path'])
      label = os.path.basename(path)
      if label == 'metrics.jsonl':
        label = os.path.basename(os.path.dirname(path))
      if len(group) > 1:
        label = os.path.commonprefix(
            [os.path.basename(os.path.normpath(r['path'])) for r in group]
        ).rstrip('_-.') or label
    if len(group) > 1:
      label += f' ({len(group)} seeds)'
    labels.append(label)
  return labels


def _band(group: List[Dict[str, object]], x: str):
  """(xs, mean, low, high) over the x range every run of the group reached."""
  start = max(r[x][0] for r in group)
  end = min(r[x][-1] for r in group)
  if end <= start:
    return None
  xs = np.linspace(start, end, _BAND_POINTS)
  ys = np.stack([np.interp(xs, r[x], r['returns']) for r in group])
  return xs, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def _mark(text: str) -> Dict[str, object]:
  """A `--mark` value 'FRAMES:RETURN:TEXT' as {'frames', 'return', 'text'}."""
  parts = text.split(':', 2)
  try:
    if len(parts) != 3 or not parts[2].strip():
      raise ValueError
    frames, ret = float(parts[0]), float(parts[1])
  except ValueError:
    raise PlotError(f'--mark={text}: must be FRAMES:RETURN:TEXT, e.g. '
                    '20e6:18:RLlib tuned IMPALA') from None
  if not (np.isfinite(frames) and np.isfinite(ret)) or frames < 0:
    raise PlotError(f'--mark={text}: FRAMES must be a number >= 0 and RETURN a '
                    'finite number')
  return {'frames': frames, 'return': ret, 'text': parts[2].strip()}


def env_frames_arg(flag: str, value) -> int:
  """A count of env frames given as `--FLAG=value` ('15e6', '15000000', 15e6).

  Raises PlotError, one line naming the flag, unless it is a whole number >= 0.
  """
  try:
    frames = float(value)
  except (TypeError, ValueError):
    frames = float('nan')
  if not (np.isfinite(frames) and frames >= 0 and frames == int(frames)):
    raise PlotError(f'--{flag}={value}: must be a whole number of env frames >= 0, '
                    'e.g. 15e6')
  return int(frames)


def return_at(run: Dict[str, object], frames: int) -> Optional[float]:
  """The return when `run` reached `frames`: its first point at or past them.

  None when the run stopped short of `frames`. A run's lines are some seconds apart,
  so the point can be past `frames` by up to one line's frames.
  """
  i = int(np.searchsorted(run['frames'], frames, side='left'))
  return float(run['returns'][i]) if i < len(run['returns']) else None


def _frames_text(frames: int) -> str:
  if frames >= 1e6:
    return f'{frames / 1e6:.1f}M'
  if frames >= 1e3:
    return f'{frames / 1e3:.0f}k'
  return str(frames)


_LINESTYLES = ('-', '--', '-.', ':')


def line_style(k: int) -> Tuple[str, str]:
  """The (colour, line style) of the k-th line (k >= 0): no two of 40 alike.

  Matplotlib's 10 default colours, then the same colours dashed, dash-dotted and
  dotted, so an eleventh line is not mistaken for the first.
  """
  return f'C{k % 10}', _LINESTYLES[(k // 10) % len(_LINESTYLES)]


def plot(paths: Sequence[str], output: str, x: str = 'frames',
         random: object = 'auto', target: Optional[float] = None,
         title: Optional[str] = None, env: Optional[str] = None,
         labels: Optional[Sequence[str]] = None,
         marks: Optional[Sequence[str]] = None,
         legend: str = 'inside',
         at: Optional[Sequence[object]] = None,
         group: Optional[Sequence[str]] = None) -> Dict[str, object]:
  """Draws the return curves of `paths` into the PNG `output`; see the module doc.

  Args:
    paths: run directories or metrics.jsonl files (at least one, or `group`).
    output: the PNG file to write.
    x: 'frames' or 'hours'.
    random: 'auto', 'none' (or None), or a number: random play's return.
    target: a return to draw; None: the runs' shared --target_return, if any.
    title: None for '<env>, <frames> env frames'.
    env: the env id of runs without config.json.
    labels: the legend names of the lines (one per line), or None.
    marks: reference points 'FRAMES:RETURN:TEXT' (see the module docstring).
    legend: 'inside' or 'outside' (right of the axes, on a wider figure).
    at: env frames (numbers or numeric strings) at which to give each run's
      return (`returns_at`), or None.
    group: comma-separated glob patterns (or paths), each string drawn as one
      line of seeds (the first lines), or None.

  Returns:
    The summary dict (the module docstring lists its keys).

  Raises:
    PlotError: a run cannot be read, a bad argument, or matplotlib is missing.
  """
  if not paths and not group:
    raise PlotError('give at least one run directory or metrics.jsonl')
  if x not in X_AXES:
    raise PlotError(f'--x={x}: must be one of {", ".join(X_AXES)}')
  if legend not in LEGENDS:
    raise PlotError(f'--legend={legend}: must be one of {", ".join(LEGENDS)}')
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise PlotError(f'drawing needs matplotlib (the plot extra): '
                    f'{PLOT_INSTALL_HINT}') from None
  parent = os.path.dirname(os.path.abspath(output))
  if not os.path.isdir(parent):
    raise PlotError(f'--output={output}: no such directory {parent}')
  points = [_mark(m) for m in marks or ()]
  at_frames = [env_frames_arg('at', a) for a in at or ()]
  if points and x != 'frames':
    raise PlotError(f'--mark={marks[0]}: needs --x=frames (a mark is at env frames)')
  matched = [expand_group(patterns) for patterns in group or ()]
  given = [[read_run(p, env) for p in found] for found in matched]
  argument_runs = [read_run(p, env) for p in paths]
  groups = given + _group(argument_runs)
  runs = [r for g in given for r in g] + argument_runs
  names = list(labels) if labels else (
      [f'{pattern} ({len(g)} runs)' for pattern, g in zip(group or (), given)] +
      _labels(groups[len(given):]))
  if len(names) != len(groups):
    raise PlotError(f'--label: {len(names)} given for {len(groups)} lines '
                    '(repeated seeds of the same flags are one line)')
  envs = sorted({r['env'] for r in runs if r['env']})
  if random is None or random == 'none':
    random_score = None
  elif random == 'auto':
    scores = {_random_score(e) for e in envs}
    random_score = scores.pop() if len(scores) == 1 and len(envs) == 1 else None
  else:
    try:
      random_score = float(random)
    except ValueError:
      raise PlotError(f"--random={random}: must be 'auto', 'none' or a number"
                      ) from None
  if target is None:
    targets = {r['config'].get('target_return') for r in runs}
    target = targets.pop() if len(targets) == 1 else None
  frames = max(r['env_frames'] for r in runs)
  if title is None:
    title = f"{', '.join(envs) or 'impala_tf'}, {_frames_text(frames)} env frames"

  fig, ax = plt.subplots(figsize=(10, 4.5) if legend == 'outside' else (7, 4))
  if x == 'hours':
    scale, xlabel = 1.0, 'wall-clock hours'
  elif frames >= 1e6:
    scale, xlabel = 1e6, 'env frames (millions)'
  elif frames >= 1e4:
    scale, xlabel = 1e3, 'env frames (thousands)'
  else:
    scale, xlabel = 1.0, 'env frames'
  lines = []
  for k, (group, name) in enumerate(zip(groups, names)):
    color, linestyle = line_style(k)
    style = {'color': color, 'linestyle': linestyle}
    if len(group) == 1:
      ax.plot(group[0][x] / scale, group[0]['returns'], label=name, **style)
    else:
      band = _band(group, x)
      if band is None:  # No common range: each seed alone, one legend entry.
        for i, run in enumerate(group):
          ax.plot(run[x] / scale, run['returns'], label=name if i == 0 else None,
                  **style)
      else:
        xs, mean, low, high = band
        ax.plot(xs / scale, mean, label=name, **style)
        ax.fill_between(xs / scale, low, high, color=color, alpha=0.25,
                        linewidth=0)
    lasts = [float(r['returns'][-1]) for r in group]
    lines.append({'label': name, 'runs': [r['path'] for r in group],
                  'color': color, 'linestyle': linestyle,
                  'last_return_mean': float(np.mean(lasts)),
                  'last_return_min': min(lasts), 'last_return_max': max(lasts)})
  if random_score is not None:
    ax.axhline(random_score, ls='--', c='black', label=f'random play ({random_score:g})')
  if target is not None:
    ax.axhline(target, ls=':', c='black', label=f'target ({target:g})')
  for j, point in enumerate(points):
    ax.plot([point['frames'] / scale], [point['return']], marker='*', ms=12,
            ls='none', color=line_style(len(groups) + j)[0], label=point['text'])
  ax.set_xlabel(xlabel)
  ax.set_ylabel('mean return, last 100 episodes')
  ax.set_title(title)
  ax.grid(alpha=0.3)
  if legend == 'outside':
    # Taller than 4.5 inches when the entries need it, so none is cut off.
    entries = len(ax.get_legend_handles_labels()[1])
    fig.set_size_inches(10, _whole_pixels(max(
        4.5, OUTSIDE_LEGEND_PAD_IN + OUTSIDE_LEGEND_ENTRY_IN * entries)))
    ax.legend(loc='upper left', bbox_to_anchor=(1.02, 1.0), fontsize='small',
              borderaxespad=0.0)
  else:
    ax.legend()
  fig.tight_layout()
  fig.savefig(output, dpi=DPI, format='png')
  plt.close(fig)

  by_path = {id(r): label for group, label in zip(groups, names) for r in group}
  return {
      'output': output,
      'x': x,
      'title': title,
      'random': random_score,
      'target': target,
      'marks': points,
      'lines': lines,
      'runs': [{
          'path': r['path'],
          'label': by_path[id(r)],
          'env': r['env'],
          'points': int(len(r['returns'])),
          'first_return_mean': float(r['returns'][0]),
          'last_return_mean': float(r['returns'][-1]),
          'best_return_mean': float(r['returns'].max()),
          'best_env_frames': int(r['frames'][int(np.argmax(r['returns']))]),
          'env_frames': r['env_frames'],
          'wall_hours': round(r['wall_hours'], 3),
          'episodes': r['episodes'],
          'fps_median': float(np.median(r['fps'])) if r['fps'].size else None,
          'evals': r['evals'],
          'target_reached': target_reached(r, target),
          **({'returns_at': {str(a): return_at(r, a) for a in at_frames}}
             if at_frames else {}),
      } for r in runs],
  }


def main(argv):
  fv = flags.FLAGS
  paths = argv[1:]
  if not paths and not fv.group:
    flags_lib.exit_with_error('give one or more run directories (or metrics.jsonl '
                              'files, or --group): python -m impala_tf.plot DIR '
                              '[DIR ...] --output=curve.png', PROG)
  if not fv.output:
    flags_lib.exit_with_error('--output is required: the PNG to write', PROG)
  try:
    summary = plot(paths, fv.output, x=fv.x, random=fv.random, target=fv.target,
                   title=fv.title, env=fv.env, labels=fv.label, marks=fv.mark,
                   at=fv.at, legend=fv.legend, group=fv.group)
  except PlotError as e:
    flags_lib.exit_with_error(str(e), PROG)
  print(json.dumps(summary, sort_keys=True), flush=True)


def run():
  define_flags()
  app.run(main, flags_parser=lambda argv: flags_lib.parse_flags(
      argv, prog=PROG, allow_positional=True))


if __name__ == '__main__':
  run()
