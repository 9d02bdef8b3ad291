"""Learning that holds: full runs per seed, judged after they first solve. JSON out.

Usage:
  python bench/stability.py [--seeds=0-9] [--target=475] [--drop=300]
      [--eval_episodes=20] [--eval_target=490] [--parallel=1] [--output=FILE]
      [-- extra train flags, e.g. --num_virtual_cpu_devices=2]
  python bench/stability.py --envs=CartPole-v1,Acrobot-v1 [--seeds=0-4] ...

One env (the trainer's default, CartPole-v1, or the `--env` of the extra flags)
is judged by `--target`, `--drop` and `--eval_target`. With `--envs`, each env in
turn (`--env=ID` is added to the extra flags) with its own targets from `SUITE`
(gymnasium's `reward_threshold` as the target; an env SUITE does not list takes
that threshold as target and greedy target, and no drop check), and the output
has one entry per env with its seeds and its summary. Each run has the trainer's
frame budget for that env (`--total_environment_frames`, 1M by default).

Each seed runs `python -m impala_tf.train --seed=S --log_interval_secs=1` (plus the
extra flags) in a fresh process to its end (`--total_environment_frames`, default
1M; no `--target_return`), then `python -m impala_tf.evaluate --greedy` on the final
checkpoint. From the run's metrics.jsonl (the 100-episode mean, one line a second)
it reports per seed:

* `final_return_mean`: the 100-episode mean at the end of the run;
* `greedy_eval_mean`: the greedy evaluation of the final checkpoint;
* `frames_to_target`: env frames at the first line with a mean >= TARGET;
* `lowest_after_target`: the lowest 100-episode mean after that line;
* `drops_below`: how many times the mean fell below DROP after it (a fall counts
  once until the mean is back at or above DROP);
* `held`: ended >= TARGET, greedy >= EVAL_TARGET, and never below DROP after
  reaching TARGET.

The summary row counts the seeds that ended solved, whose greedy evaluation passed,
that never dropped, and that held; and the median frames to the first TARGET.
`--parallel=2` runs two seeds at a time (faster on 2 cores, but the runs then share
them: use 1 for figures you publish). Seeds: `0-9`, `0,3,5` or `0-4,7`.
"""

import argparse
import concurrent.futures
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

# Per env: the 100-episode mean that counts as solved (gymnasium's
# reward_threshold), the mean below which a solved run has dropped, and the
# greedy evaluation's target.
SUITE = {
    'CartPole-v1': dict(target=475.0, drop=300.0, eval_target=490.0),
    'Acrobot-v1': dict(target=-100.0, drop=-150.0, eval_target=-100.0),
}


def env_targets(env_id):
  """(target, drop, eval_target) for `env_id`: SUITE's, else its threshold."""
  if env_id in SUITE:
    t = SUITE[env_id]
    return t['target'], t['drop'], t['eval_target']
  # pylint: disable=g-import-not-at-top
  import gymnasium as gym
  from impala_tf import config as config_lib
  from impala_tf import environments
  # pylint: enable=g-import-not-at-top
  try:  # The trainer's check: imports a 'module:' prefix, as --env does.
    environments.check_env_id(env_id)
  except config_lib.ConfigError as e:
    raise SystemExit(f'stability.py: error: --envs: {e}') from None
  threshold = gym.spec(env_id.split(':')[-1]).reward_threshold
  if threshold is None:
    raise SystemExit(f'stability.py: error: --envs: {env_id} has no reward_threshold '
                     f'in gymnasium and no entry in SUITE ({", ".join(SUITE)})')
  return float(threshold), None, float(threshold)


def parse_seeds(spec):
  """'0-4,7' -> [0, 1, 2, 3, 4, 7]; ValueError (one line naming --seeds) if bad."""
  seeds = []
  for part in spec.split(','):
    part = part.strip()
    if not part:
      continue
    lo, sep, hi = part.partition('-')
    try:
      lo, hi = int(lo), int(hi if sep else lo)
    except ValueError:
      raise ValueError(f'--seeds={spec}: {part!r} is neither a seed nor a range '
                       'LO-HI of seeds (e.g. 0-4,7)') from None
    if lo > hi:
      raise ValueError(f'--seeds={spec}: the range {part} is empty (LO > HI)')
    seeds.extend(range(lo, hi + 1))
  if not seeds:
    raise ValueError(f'--seeds={spec}: no seeds')
  return seeds


def curve_statistics(returns, frames, target, drop):
  """Statistics of one run's 100-episode-mean curve.

  Args:
    returns: list of float or None, the mean at each metrics line.
    frames: list of int, env frames at each line.
    target: the return that counts as solved.
    drop: a mean below this after reaching `target` is a drop; None: no drop
      check (drops_below 0).

  Returns:
    dict: frames_to_target (None if never), lowest_after_target, drops_below.
  """
  first = next((i for i, r in enumerate(returns)
                if r is not None and r >= target), None)
  if first is None:
    return {'frames_to_target': None, 'lowest_after_target': None,
            'drops_below': None}
  after = [r for r in returns[first:] if r is not None]
  drops, below = 0, False
  for r in after:
    if drop is None:
      break
    if r < drop and not below:
      drops += 1
    below = r < drop
  return {'frames_to_target': frames[first], 'lowest_after_target': min(after),
          'drops_below': drops}


def run_seed(seed, args, workdir):
  logdir = os.path.join(workdir, f'seed{seed}')
  cmd = [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}',
         f'--seed={seed}', '--log_interval_secs=1'] + args.extra
  start = time.time()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  seconds = time.time() - start
  if proc.returncode != 0:
    return {'seed': seed, 'returncode': proc.returncode,
            'error': proc.stderr.strip().splitlines()[-10:]}
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    lines = [json.loads(l) for l in f]
  returns = [l.get('episode_return_mean') for l in lines]
  frames = [l['env_frames'] for l in lines]
  final = lines[-1]
  out = {'seed': seed, 'final_return_mean': final.get('episode_return_mean'),
         'env_frames': final['env_frames'], 'process_seconds': round(seconds, 1),
         'policy_lag_mean': statistics.mean(
             [l['policy_lag_mean'] for l in lines if 'policy_lag_mean' in l] or
             [0.0])}
  out.update(curve_statistics(returns, frames, args.target, args.drop))
  ev = subprocess.run(
      [sys.executable, '-m', 'impala_tf.evaluate', f'--logdir={logdir}',
       f'--num_episodes={args.eval_episodes}', '--greedy', f'--seed={seed}'],
      capture_output=True, text=True, check=False)
  try:
    out['greedy_eval_mean'] = json.loads(
        ev.stdout.strip().splitlines()[-1])['episode_return_mean']
  except (IndexError, ValueError, KeyError):
    out['greedy_eval_mean'] = None
    out['eval_error'] = ev.stderr.strip().splitlines()[-5:]
  out['held'] = bool(
      out['final_return_mean'] is not None and
      out['final_return_mean'] >= args.target and
      out['greedy_eval_mean'] is not None and
      out['greedy_eval_mean'] >= args.eval_target and
      out['drops_below'] == 0)
  if args.keep_logdirs:
    out['logdir'] = logdir
  return out


def summarize(results, args):
  ok = [r for r in results if 'returncode' not in r]
  frames = [r['frames_to_target'] for r in ok if r['frames_to_target'] is not None]
  count = lambda pred: f'{sum(1 for r in ok if pred(r))}/{len(results)}'
  return {
      'ended_solved': count(lambda r: r['final_return_mean'] is not None and
                            r['final_return_mean'] >= args.target),
      'greedy_passed': count(lambda r: r['greedy_eval_mean'] is not None and
                             r['greedy_eval_mean'] >= args.eval_target),
      'never_dropped': count(lambda r: r['drops_below'] == 0),
      'held': count(lambda r: r['held']),
      'reached_target': f'{len(frames)}/{len(results)}',
      'median_frames_to_target': statistics.median(frames) if frames else None,
      'max_frames_to_target': max(frames) if frames else None,
      'min_lowest_after_target': min(
          (r['lowest_after_target'] for r in ok
           if r['lowest_after_target'] is not None), default=None),
      'min_final_return_mean': min(
          (r['final_return_mean'] for r in ok
           if r['final_return_mean'] is not None), default=None),
      'min_greedy_eval_mean': min(
          (r['greedy_eval_mean'] for r in ok
           if r['greedy_eval_mean'] is not None), default=None),
      'failed_runs': len(results) - len(ok),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--seeds', default='0-9')
  parser.add_argument('--target', type=float, default=475.0)
  parser.add_argument('--drop', type=float, default=300.0)
  parser.add_argument('--eval_episodes', type=int, default=20)
  parser.add_argument('--eval_target', type=float, default=490.0)
  parser.add_argument('--envs', default='',
                      help='comma-separated env ids, each with its SUITE targets')
  parser.add_argument('--parallel', type=int, default=1)
  parser.add_argument('--output', default='', help='also write the JSON here')
  parser.add_argument('--workdir', default='',
                      help='keep the run directories here (default: a temp dir)')
  parser.add_argument('extra', nargs='*', help='extra train flags after --')
  args = parser.parse_args()
  try:
    seeds = parse_seeds(args.seeds)
  except ValueError as e:
    parser.error(str(e))
  args.keep_logdirs = bool(args.workdir)
  start = time.time()
  envs = [e.strip() for e in args.envs.split(',') if e.strip()]
  out = {
      'benchmark': 'stability',
      'extra_flags': args.extra,
      'eval_episodes': args.eval_episodes, 'parallel': args.parallel,
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version()},
  }
  with tempfile.TemporaryDirectory() as tmp:
    workdir = args.workdir or tmp
    if not envs:
      out.update(target=args.target, drop=args.drop, eval_target=args.eval_target)
      out.update(run_env(args, seeds, workdir))
    else:
      out['envs'] = {}
      extra = args.extra
      for env_id in envs:
        env_args = argparse.Namespace(**vars(args))
        env_args.target, env_args.drop, env_args.eval_target = env_targets(env_id)
        env_args.extra = extra + [f'--env={env_id}']
        result = run_env(env_args, seeds, os.path.join(workdir, env_id))
        out['envs'][env_id] = dict(target=env_args.target, drop=env_args.drop,
                                   eval_target=env_args.eval_target, **result)
  out['wall_seconds'] = round(time.time() - start, 1)
  text = json.dumps(out, indent=1)
  print(text)
  if args.output:
    with open(args.output, 'w', encoding='utf-8') as f:
      f.write(text + '\n')


def run_env(args, seeds, workdir):
  """Runs every seed (args.parallel at a time); returns seeds and summary."""
  os.makedirs(workdir, exist_ok=True)
  with concurrent.futures.ThreadPoolExecutor(max(1, args.parallel)) as pool:
    futures = [pool.submit(run_seed, s, args, workdir) for s in seeds]
    results = []
    for f in futures:
      results.append(f.result())
      print(json.dumps(results[-1]), file=sys.stderr, flush=True)
  return {'seeds': results, 'summary': summarize(results, args)}


if __name__ == '__main__':
  main()
