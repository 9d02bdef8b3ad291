"""CartPole-v1 time-to-solve benchmark: seeds in fresh processes, JSON out.

Usage:
  python bench/cartpole.py [--seeds=0,1,2,3,4] [--target=475] [--max_frames=600000]
      [-- extra train flags, e.g. --num_virtual_cpu_devices=2]

Each seed runs `python -m impala_tf.train --target_return=TARGET --seed=S` (the
default total_environment_frames, so the default learning-rate schedule) in a fresh
process; a seed counts as solved when it reaches TARGET within MAX_FRAMES env frames (so TensorFlow's
import and tracing are part of the time) and reads its metrics.jsonl. Prints one JSON
object: per seed the env frames and seconds at which the 100-episode mean return first
reached the target (`seconds_to_target` counts from the process launch), the time from
launch to the first learner step, and the median / max over seeds.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def run_seed(seed, target, max_frames, extra, workdir):
  logdir = os.path.join(workdir, f'seed{seed}')
  cmd = [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}',
         f'--seed={seed}', f'--target_return={target}', '--log_interval_secs=1'
         ] + extra
  launch = time.time()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  total = time.time() - launch
  if proc.returncode != 0:
    err = [l for l in proc.stderr.strip().splitlines()
           if not l.startswith(('I0000', 'W0000', 'E0000', 'I1', 'W1'))]
    return {'seed': seed, 'returncode': proc.returncode, 'error': err[-25:]}
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    lines = [json.loads(l) for l in f]
  final = lines[-1]
  # Seconds inside the driver are measured from driver start; add the time the
  # process spent before it (imports, flag parsing) using the first-step stamp.
  pre_driver = total - final['wall_seconds'] - _post_seconds(lines, total)
  # The run keeps the default total_environment_frames (the lr schedule's horizon);
  # solving counts only within max_frames.
  solved = bool(final.get('reached_target')) and final['env_frames'] <= max_frames
  return {
      'seed': seed,
      'solved': solved,
      'frames_to_target': final['env_frames'] if solved else None,
      'seconds_to_target': round(final['wall_seconds'] + pre_driver, 2) if solved
                           else None,
      'process_seconds': round(total, 2),
      'startup_seconds_to_first_learner_step': round(
          (final.get('startup_seconds') or 0) + pre_driver, 2),
      'final_return_mean': final.get('episode_return_mean'),
      'env_frames': final['env_frames'],
  }


def _post_seconds(lines, total):
  del lines, total
  return 0.0


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--seeds', default='0,1,2,3,4')
  parser.add_argument('--target', type=float, default=475.0)
  parser.add_argument('--max_frames', type=int, default=600_000)
  parser.add_argument('extra', nargs='*', help='extra train flags after --')
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(',')]
  results = []
  with tempfile.TemporaryDirectory() as workdir:
    for s in seeds:
      r = run_seed(s, args.target, args.max_frames, args.extra, workdir)
      print(json.dumps(r), file=sys.stderr, flush=True)
      results.append(r)
  secs = [r['seconds_to_target'] for r in results if r.get('solved')]
  frames = [r['frames_to_target'] for r in results if r.get('solved')]
  out = {
      'benchmark': 'cartpole_time_to_target',
      'target_return': args.target,
      'max_frames': args.max_frames,
      'extra_flags': args.extra,
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version()},
      'seeds': results,
      'solved': f'{len(secs)}/{len(results)}',
      'median_seconds_to_target': statistics.median(secs) if secs else None,
      'max_seconds_to_target': max(secs) if secs else None,
      'median_frames_to_target': statistics.median(frames) if frames else None,
      'max_frames_to_target': max(frames) if frames else None,
      'median_startup_seconds': statistics.median(
          [r['startup_seconds_to_first_learner_step'] for r in results
           if 'startup_seconds_to_first_learner_step' in r] or [0]),
  }
  print(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
