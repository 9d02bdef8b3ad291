"""Soak test: a long training run watched for memory growth, threads and open files.

Usage:
  python bench/soak.py [--minutes=30] [--env=CartPole-v1] [--interval=10]
      [--warmup_minutes=5] [-- extra train flags]

Starts `python -m impala_tf.train` (CartPole-v1 by default; for Pong pass
`--env=ALE/Pong-v5`, which adds `--network=shallow` and Atari settings sized for 2
cores) with a frame budget it cannot reach, samples the whole process tree every
`interval` seconds -- resident memory (sum of VmRSS over the trainer and its child
processes), the trainer's thread count and its open file descriptors -- then stops
it with SIGINT and waits for a clean exit. Prints one JSON object:

* `rss_slope_mb_per_hour`: least-squares slope of the RSS samples taken after
  `warmup_minutes` (start-up, tracing and the first buffers filling are excluded);
* `rss_mb_first` / `rss_mb_last` / `rss_mb_max` after the warm-up;
* `threads_min` / `threads_max`, `fds_min` / `fds_max` after the warm-up (flat means
  min == max or a small constant band, not a climb);
* the trainer's exit status and final env frames (from metrics.jsonl).

Target (issue 11): RSS slope <= 20 MB/hour; flat thread and fd counts.
Linux only (reads /proc).
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

PONG_FLAGS = ['--network=shallow', '--num_actors=2', '--num_envs_per_actor=8',
              '--batch_size=16', '--unroll_length=20', '--optimizer=rmsprop',
              '--learning_rate=0.0006', '--reward_clipping=abs_one']


def _children(pid):
  """Direct and indirect child pids of `pid` (from /proc/*/stat)."""
  parents = {}
  for name in os.listdir('/proc'):
    if not name.isdigit():
      continue
    try:
      with open(f'/proc/{name}/stat', encoding='utf-8') as f:
        stat = f.read()
    except OSError:
      continue
    # The command name may contain spaces; fields after the last ')' are fixed.
    ppid = int(stat.rsplit(')', 1)[1].split()[1])
    parents.setdefault(ppid, []).append(int(name))
  out, todo = [], [pid]
  while todo:
    p = todo.pop()
    for c in parents.get(p, []):
      out.append(c)
      todo.append(c)
  return out


def _status(pid):
  """(rss_kb, threads) of one process, or None when it is gone."""
  try:
    with open(f'/proc/{pid}/status', encoding='utf-8') as f:
      fields = dict(l.split(':', 1) for l in f if ':' in l)
  except OSError:
    return None
  return int(fields['VmRSS'].split()[0]), int(fields['Threads'])


def sample(pid):
  """One sample of the process tree rooted at `pid`, or None when it exited."""
  root = _status(pid)
  if root is None:
    return None
  rss_kb, threads = root
  for c in _children(pid):
    s = _status(c)
    if s:
      rss_kb += s[0]
  try:
    fds = len(os.listdir(f'/proc/{pid}/fd'))
  except OSError:
    return None
  return {'t': time.time(), 'rss_mb': rss_kb / 1024.0, 'threads': threads, 'fds': fds}


def slope_per_hour(samples):
  """Least-squares slope of rss_mb over time, in MB/hour."""
  n = len(samples)
  if n < 2:
    return None
  ts = [s['t'] for s in samples]
  ys = [s['rss_mb'] for s in samples]
  mt, my = sum(ts) / n, sum(ys) / n
  var = sum((t - mt) ** 2 for t in ts)
  if var == 0:
    return None
  cov = sum((t - mt) * (y - my) for t, y in zip(ts, ys))
  return cov / var * 3600.0


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--minutes', type=float, default=30.0)
  parser.add_argument('--warmup_minutes', type=float, default=5.0)
  parser.add_argument('--interval', type=float, default=10.0)
  parser.add_argument('--env', default='CartPole-v1')
  parser.add_argument('--logdir', default='',
                      help='where the run writes (default: a temporary directory)')
  parser.add_argument('extra', nargs='*', help='extra train flags after --')
  args = parser.parse_args()
  if args.warmup_minutes >= args.minutes:
    parser.error(f'--warmup_minutes={args.warmup_minutes} must be below '
                 f'--minutes={args.minutes}')
  tmp = None
  logdir = args.logdir
  if not logdir:
    tmp = tempfile.TemporaryDirectory()
    logdir = tmp.name
  flags = [f'--env={args.env}', f'--logdir={logdir}',
           '--total_environment_frames=100000000000', '--log_interval_secs=30']
  if args.env.startswith('ALE/') or 'NoFrameskip' in args.env:
    flags += PONG_FLAGS
  cmd = [sys.executable, '-m', 'impala_tf.train'] + flags + args.extra
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
  start = time.time()
  samples = []
  try:
    while time.time() - start < args.minutes * 60:
      s = sample(proc.pid)
      if s is None or proc.poll() is not None:
        break
      s['t_rel'] = round(s['t'] - start, 1)
      samples.append(s)
      print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v)
                        for k, v in s.items() if k != 't'}),
            file=sys.stderr, flush=True)
      time.sleep(args.interval)
  finally:
    if proc.poll() is None:
      proc.send_signal(signal.SIGINT)
    try:
      _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
      proc.kill()
      _, err = proc.communicate()
  steady = [s for s in samples if s['t'] - start >= args.warmup_minutes * 60]
  final = {}
  try:
    with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
      lines = [json.loads(l) for l in f if l.strip()]
    final = lines[-1] if lines else {}
  except OSError:
    pass
  out = {
      'benchmark': 'soak',
      'env': args.env,
      'command': ' '.join(cmd[1:]),
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version()},
      'minutes': round((time.time() - start) / 60, 1),
      'num_samples': len(samples),
      'returncode': proc.returncode,
      'env_frames': final.get('env_frames'),
      'episode_return_mean': final.get('episode_return_mean'),
  }
  if proc.returncode not in (0, None):
    out['stderr_tail'] = err.strip().splitlines()[-5:]
  if steady:
    out.update({
        'rss_slope_mb_per_hour': round(slope_per_hour(steady), 1)
                                 if len(steady) > 1 else None,
        'rss_mb_first': round(steady[0]['rss_mb'], 1),
        'rss_mb_last': round(steady[-1]['rss_mb'], 1),
        'rss_mb_max': round(max(s['rss_mb'] for s in steady), 1),
        'threads_min': min(s['threads'] for s in steady),
        'threads_max': max(s['threads'] for s in steady),
        'fds_min': min(s['fds'] for s in steady),
        'fds_max': max(s['fds'] for s in steady),
    })
  print(json.dumps(out, indent=1))
  if tmp is not None:
    tmp.cleanup()


if __name__ == '__main__':
  main()
