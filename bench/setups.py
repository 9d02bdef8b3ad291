"""Setups side by side from their runs' metrics: how many reach a target; JSON out.

Usage:
  python bench/setups.py --setup=NAME=PATTERN[,PATTERN...] [--setup=...]
      --target=18 [--within=15e6] [--at=15e6 ...] [--env=PongNoFrameskip-v4]

Each `--setup` names a setup and the runs of it (run directories or metrics.jsonl
files, by comma-separated glob patterns or paths, as `impala_tf.plot --group`
reads them): its seeds. Prints one JSON line:

  {"target": 18.0, "within": 15000000, "at": [15000000],
   "setups": [{"name": "configs/pong.cfg", "runs": 13, "reached": 9,
               "mean_at": {"15000000": 14.9}, "per_run": [
                 {"path": ..., "target_env_frames": 9750080,
                  "target_wall_hours": 0.55, "returns_at": {"15000000": 19.6},
                  "best_return_mean": 19.98, "env_frames": 20000000}, ...]}]}

`reached` counts the runs whose 100-episode mean reached `--target` at or before
`--within` env frames (any frames without it); `target_env_frames` and
`target_wall_hours` are each run's first line at the target (null when none, or
past `--within`). `returns_at` is each run's return when it reached each `--at`
(its first line at or past it; null when it stopped short), `mean_at` the mean
over the runs that got there (null when none did). docs/pong.md's table of
setups comes from it.
"""

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from impala_tf import plot  # pylint: disable=g-import-not-at-top,wrong-import-position


def parse_setup(text):
  """'NAME=PATTERNS' -> (NAME, PATTERNS); ValueError names the flag."""
  name, sep, patterns = text.partition('=')
  if not sep or not name or not patterns:
    raise ValueError(f'--setup={text}: must be NAME=PATTERN[,PATTERN...]')
  return name, patterns


def summarize(name, runs, target, within=None, at=()):
  """One setup's summary (the module docstring's `setups` entry).

  Args:
    name: the setup's name.
    runs: `plot.read_run` dicts, one per seed.
    target: the return to reach.
    within: env frames the target counts within, or None (any).
    at: env frames to give each run's return at.
  """
  per_run = []
  for run in runs:
    hit = plot.target_reached(run, target)
    if hit is not None and within is not None and hit['env_frames'] > within:
      hit = None
    per_run.append({
        'path': run['path'],
        'target_env_frames': hit and hit['env_frames'],
        'target_wall_hours': hit and hit['wall_hours'],
        'returns_at': {str(a): plot.return_at(run, a) for a in at},
        'best_return_mean': float(run['returns'].max()),
        'env_frames': run['env_frames'],
    })
  mean_at = {}
  for a in at:
    values = [r['returns_at'][str(a)] for r in per_run
              if r['returns_at'][str(a)] is not None]
    mean_at[str(a)] = sum(values) / len(values) if values else None
  return {'name': name, 'runs': len(runs),
          'reached': sum(r['target_env_frames'] is not None for r in per_run),
          'mean_at': mean_at, 'per_run': per_run}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--setup', action='append', required=True,
                      help='NAME=PATTERN[,PATTERN...]: a setup and its runs.')
  parser.add_argument('--target', type=float, required=True)
  parser.add_argument('--within', default=None,
                      help='Env frames the target counts within (default: any).')
  parser.add_argument('--at', action='append', default=[],
                      help='Env frames to give the returns at (repeat).')
  parser.add_argument('--env', default=None,
                      help='The env id of runs without a config.json.')
  args = parser.parse_args(argv)
  try:
    within = (None if args.within is None
              else plot.env_frames_arg('within', args.within))
    at = [plot.env_frames_arg('at', a) for a in args.at]
    setups = [parse_setup(s) for s in args.setup]
    runs = [[plot.read_run(p, args.env)
             for p in plot.expand_group(patterns, f'--setup={name}={patterns}')]
            for name, patterns in setups]
  except (ValueError, plot.PlotError) as e:  # PlotError is a ValueError.
    parser.exit(2, f'{parser.prog}: error: {e}\n')
  print(json.dumps({
      'target': args.target, 'within': within, 'at': at,
      'setups': [summarize(name, r, args.target, within, at)
                 for (name, _), r in zip(setups, runs)],
  }), flush=True)


if __name__ == '__main__':
  main()
