"""What each actor backend costs: start-up, memory, env frames/s. JSON out.

Usage:
  python bench/actor_backends.py [--frames=150000] [--runs=threads:1,ray:1,ray:2]
      [-- extra train flags, e.g. --env=CartPole-v1]

Each run is `python -m impala_tf.train --actor_backend=B --num_actors=N
--total_environment_frames=FRAMES` in a fresh process (so a `ray` run starts and
stops its own local Ray). While it runs, the resident memory of its whole process
tree (Ray's processes and actor processes included) is sampled every 0.5 s (Linux
/proc). Prints per run: `startup_seconds` (launch to the first learner step, from
metrics.jsonl, plus the interpreter start), `fps` (env frames per second after the
first step), `peak_rss_mb` (the tree's largest total RSS) and `wall_seconds`.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from impala_tf import socket_audit


def _tree(root):
  """`root` and the pids of every process below it."""
  return [root] + socket_audit.descendants(root)


def _rss_mb(pids):
  total = 0
  for pid in pids:
    try:
      with open(f'/proc/{pid}/statm', encoding='utf-8') as f:
        total += int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError, IndexError):
      pass
  return total / 2**20


def run(backend, num_actors, frames, extra, workdir):
  logdir = os.path.join(workdir, f'{backend}{num_actors}')
  cmd = [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}',
         f'--actor_backend={backend}', f'--num_actors={num_actors}',
         f'--total_environment_frames={frames}', '--log_interval_secs=1'] + extra
  launch = time.time()
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
  peak = 0.0
  while proc.poll() is None:
    peak = max(peak, _rss_mb(_tree(proc.pid)))
    time.sleep(0.5)
  wall = time.time() - launch
  if proc.returncode != 0:
    return {'backend': backend, 'num_actors': num_actors,
            'returncode': proc.returncode, 'stderr': proc.stderr.read()[-2000:]}
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    lines = [json.loads(l) for l in f]
  final = lines[-1]
  startup = final['startup_seconds']
  return {
      'backend': backend, 'num_actors': num_actors,
      'startup_seconds': round(startup + (wall - final['wall_seconds']), 1),
      'fps': round(final['env_frames'] / max(final['wall_seconds'] - startup, 1e-9)),
      'peak_rss_mb': round(peak),
      'wall_seconds': round(wall, 1),
      'env_frames': final['env_frames'],
      'episode_return_mean': final.get('episode_return_mean'),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--frames', type=int, default=150_000)
  parser.add_argument('--runs', default='threads:1,ray:1,ray:2')
  args, extra = parser.parse_known_args()
  extra = [a for a in extra if a != '--']
  results = []
  with tempfile.TemporaryDirectory() as workdir:
    for spec in args.runs.split(','):
      backend, n = spec.split(':')
      results.append(run(backend, int(n), args.frames, extra, workdir))
      print(json.dumps(results[-1]), file=sys.stderr, flush=True)
  print(json.dumps({'machine': f'{platform.machine()}, {os.cpu_count()} CPUs',
                    'load_average': os.getloadavg(), 'frames': args.frames,
                    'runs': results}, indent=2))


if __name__ == '__main__':
  main()
