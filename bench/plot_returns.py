"""Plots episode return against env frames from a run's metrics.jsonl.

Usage:
  python bench/plot_returns.py LOGDIR/metrics.jsonl OUT.png [--title=TEXT]
      [--random=-20.5]

Needs matplotlib (`pip install -e ".[bench]"`). Also prints a JSON summary: the first
and last 100-episode mean returns, the best, the frames and the wall hours.
"""

import argparse
import json

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('metrics')
  parser.add_argument('out')
  parser.add_argument('--title', default='')
  parser.add_argument('--random', type=float, default=None,
                      help='return of random play, drawn as a dashed line')
  args = parser.parse_args()
  with open(args.metrics, encoding='utf-8') as f:
    lines = [json.loads(l) for l in f if l.strip()]
  pts = [(l['env_frames'], l['episode_return_mean']) for l in lines
         if l.get('episode_return_mean') is not None]
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], label='impala_tf')
  if args.random is not None:
    ax.axhline(args.random, ls='--', c='gray', label=f'random play ({args.random})')
  ax.set_xlabel('env frames (millions)')
  ax.set_ylabel('mean return, last 100 episodes')
  ax.set_title(args.title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(args.out, dpi=100)
  print(json.dumps({
      'points': len(pts),
      'first_return_mean': pts[0][1] if pts else None,
      'last_return_mean': pts[-1][1] if pts else None,
      'best_return_mean': max(p[1] for p in pts) if pts else None,
      'env_frames': lines[-1]['env_frames'] if lines else 0,
      'wall_hours': round(lines[-1]['wall_seconds'] / 3600, 3) if lines else 0,
      'episodes': lines[-1].get('episodes') if lines else 0,
  }))


if __name__ == '__main__':
  main()
