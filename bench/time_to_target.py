"""Time to solve an env (CartPole-v1, Acrobot-v1): seeds in fresh processes, JSON out.

Usage:
  python bench/time_to_target.py [--env=CartPole-v1] [--seeds=0,1,2,3,4 or 0-4]
      [--target=475] [--max_frames=600000] [--compare_sb3=PYTHON]
      [--sb3_script=bench/peers/sb3_ppo_cartpole.py]
      [-- extra train flags, e.g. --num_virtual_cpu_devices=2]

`--env` picks the env and its defaults (`ENVS`): CartPole-v1 (target 475 within 600k
frames, peer `bench/peers/sb3_ppo_cartpole.py`) or Acrobot-v1 (target -100,
gymnasium's threshold, within 1M frames, peer `bench/peers/sb3_ppo_acrobot.py`:
SB3 PPO with RL-Zoo's Acrobot config); `--target`, `--max_frames` and
`--sb3_script` override them.

Each seed runs `python -m impala_tf.train --target_return=TARGET --seed=S` (the
default total_environment_frames, so the default learning-rate schedule) in a fresh
process; a seed counts as solved when it reaches TARGET within MAX_FRAMES env frames.
`seconds_to_target` is the process's whole life, launch to exit (TensorFlow's import,
tracing and the final SavedModel export included). Start-up is launch to the first
learner step (`first_learner_step_unix` in metrics.jsonl); before each seed the
script also times a bare `python -c "import tensorflow"` with the same interpreter,
and `ours_startup_seconds` = start-up - that import: the part of start-up that is
impala_tf's.

With `--compare_sb3=PYTHON`, Stable-Baselines3 PPO (the peer script, run with that
interpreter, which has SB3 installed; SB3 is not a dependency of impala_tf) runs too,
alternating with impala_tf seed by seed (PPO seed S+1 after impala_tf seed S, as the
peer's figures use seeds 1..N), and the output adds both medians and their ratio
(`ratio_impala_over_sb3`; below 1 means impala_tf is faster). The peer's time is its
`script_start_to_target_s`.
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

import stability  # bench/stability.py, beside this script: its --seeds syntax.

_HERE = os.path.dirname(os.path.abspath(__file__))
_PEERS = os.path.join(_HERE, 'peers')

# Per env: the 100-episode mean that counts as solved, the frame budget to solve
# it in, the peer script and how to read it (its flags and JSON keys differ).
ENVS = {
    'CartPole-v1': dict(target=475.0, max_frames=600_000,
                        sb3_script=os.path.join(_PEERS, 'sb3_ppo_cartpole.py'),
                        sb3_flags=('--target-return', '{target}', '--quiet'),
                        sb3_frames='env_steps_to_return_{target:g}',
                        sb3_final='final_mean_return'),
    'Acrobot-v1': dict(target=-100.0, max_frames=1_000_000,
                       sb3_script=os.path.join(_PEERS, 'sb3_ppo_acrobot.py'),
                       sb3_flags=('--target', '{target}'),
                       sb3_frames='steps_to_target',
                       sb3_final='last_100_mean'),
}


def bare_tf_import_seconds(python):
  """Seconds for `python -c "import tensorflow"` (launch to exit)."""
  start = time.time()
  subprocess.run([python, '-c', 'import tensorflow'], capture_output=True,
                 check=False)
  return time.time() - start


def run_seed(seed, target, max_frames, extra, workdir, env='CartPole-v1'):
  logdir = os.path.join(workdir, f'seed{seed}')
  tf_import = bare_tf_import_seconds(sys.executable)
  cmd = [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}',
         f'--env={env}', f'--seed={seed}', f'--target_return={target}',
         '--log_interval_secs=1'] + extra
  launch = time.time()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  total = time.time() - launch
  if proc.returncode != 0:
    return {'seed': seed, 'returncode': proc.returncode,
            'error': proc.stderr.strip().splitlines()[-25:]}
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    lines = [json.loads(l) for l in f]
  final = lines[-1]
  first = final.get('first_learner_step_unix')
  startup = round(first - launch, 2) if first else None
  # The run keeps the default total_environment_frames (the lr schedule's horizon);
  # solving counts only within max_frames.
  solved = bool(final.get('reached_target')) and final['env_frames'] <= max_frames
  return {
      'seed': seed,
      'solved': solved,
      'frames_to_target': final['env_frames'] if solved else None,
      'seconds_to_target': round(total, 2) if solved else None,
      'process_seconds': round(total, 2),
      'startup_seconds_to_first_learner_step': startup,
      'bare_tensorflow_import_seconds': round(tf_import, 2),
      'ours_startup_seconds': (round(startup - tf_import, 2)
                               if startup is not None else None),
      'final_return_mean': final.get('episode_return_mean'),
      'env_frames': final['env_frames'],
      'policy_lag_mean': final.get('policy_lag_mean'),
  }


def run_sb3(python, script, seed, target, spec):
  cmd = [python, script, '--seed', str(seed)] + [
      f.format(target=target) for f in spec['sb3_flags']]
  launch = time.time()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  total = time.time() - launch
  try:
    out = json.loads(proc.stdout.strip().splitlines()[-1])
  except (IndexError, ValueError):
    return {'seed': seed, 'returncode': proc.returncode,
            'error': proc.stderr.strip().splitlines()[-10:]}
  secs = out.get('script_start_to_target_s')
  return {
      'seed': seed,
      'solved': secs is not None,
      'seconds_to_target': secs,
      'frames_to_target': out.get(spec['sb3_frames'].format(target=target)),
      'process_seconds': round(total, 2),
      'startup_seconds': (out.get('startup') or {}).get('script_start_to_ready_s'),
      'final_return_mean': out.get(spec['sb3_final']),
  }


def _median(values):
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--env', default='CartPole-v1', choices=sorted(ENVS))
  parser.add_argument('--seeds', default='0,1,2,3,4')
  parser.add_argument('--target', type=float, default=None)
  parser.add_argument('--max_frames', type=int, default=None)
  parser.add_argument('--compare_sb3', default='',
                      help='a Python interpreter with stable-baselines3 installed')
  parser.add_argument('--sb3_script', default=None)
  parser.add_argument('extra', nargs='*', help='extra train flags after --')
  args = parser.parse_args()
  spec = ENVS[args.env]
  for key in ('target', 'max_frames', 'sb3_script'):
    if getattr(args, key) is None:
      setattr(args, key, spec[key])
  if args.compare_sb3 and not os.path.exists(args.sb3_script):
    parser.error(f'--sb3_script={args.sb3_script}: no such file')
  try:
    seeds = stability.parse_seeds(args.seeds)
  except ValueError as e:
    parser.error(str(e))
  results, peer = [], []
  with tempfile.TemporaryDirectory() as workdir:
    for s in seeds:
      r = run_seed(s, args.target, args.max_frames, args.extra, workdir, args.env)
      print(json.dumps(r), file=sys.stderr, flush=True)
      results.append(r)
      if args.compare_sb3:
        p = run_sb3(args.compare_sb3, args.sb3_script, s + 1, args.target, spec)
        print(json.dumps({'sb3': p}), file=sys.stderr, flush=True)
        peer.append(p)
  solved = [r for r in results if r.get('solved')]
  secs = [r['seconds_to_target'] for r in solved]
  frames = [r['frames_to_target'] for r in solved]
  out = {
      'benchmark': 'time_to_target',
      'env': args.env,
      'target_return': args.target,
      'max_frames': args.max_frames,
      'extra_flags': args.extra,
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version()},
      'seeds': results,
      'solved': f'{len(solved)}/{len(results)}',
      'median_seconds_to_target': _median(secs),
      'max_seconds_to_target': max(secs) if secs else None,
      'median_frames_to_target': _median(frames),
      'max_frames_to_target': max(frames) if frames else None,
      'median_startup_seconds': _median(
          [r.get('startup_seconds_to_first_learner_step') for r in results]),
      'median_bare_tensorflow_import_seconds': _median(
          [r.get('bare_tensorflow_import_seconds') for r in results]),
      'median_ours_startup_seconds': _median(
          [r.get('ours_startup_seconds') for r in results]),
  }
  if args.compare_sb3:
    peer_secs = [p['seconds_to_target'] for p in peer if p.get('solved')]
    out['sb3'] = {
        'python': args.compare_sb3,
        'seeds': peer,
        'solved': f'{len(peer_secs)}/{len(peer)}',
        'median_seconds_to_target': _median(peer_secs),
        'median_frames_to_target': _median(
            [p['frames_to_target'] for p in peer if p.get('solved')]),
    }
    if out['median_seconds_to_target'] and out['sb3']['median_seconds_to_target']:
      out['ratio_impala_over_sb3'] = round(
          out['median_seconds_to_target'] / out['sb3']['median_seconds_to_target'], 3)
  print(json.dumps(out, indent=1))


if __name__ == '__main__':
  main()
