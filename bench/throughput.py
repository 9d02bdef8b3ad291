"""Steady-state throughput of the whole trainer on CartPole-v1; prints JSON.

Usage:
  python bench/throughput.py [--frames=400000] [--settings=default,sgd4]

For each setting it runs `python -m impala_tf.train` in a fresh process for `frames`
env frames (no target return) and reads metrics.jsonl (one line per second). Rates are
measured between the first metrics line after the first learner step and the last
line before the end, so TensorFlow's import and tracing are excluded (the start-up is
reported separately):

* env_fps: env frames produced by the actors per second;
* learner_fps: frames trained per second (counting minibatch reuse);
* learner_wait_fraction: share of the learner loop spent waiting for data
  (0 = the loading path never starves the learner);
* process_cpu_seconds, process_cpu_cores_mean: CPU time of the run's process and
  its children (start-up included), and that over the run's wall time.

Settings: `default` (the trainer's defaults) and `sgd4` (`--num_sgd_iter=4`, which
makes the learner the bottleneck).

In the same run (a fresh process, before the settings) it measures the actor loop
alone: one `impala_tf.actor.Actor` with the default env count and network, acting
for `--actor_seconds` with its unrolls dropped (no learner, no queue). Each setting
then reports `env_fps_over_actor_alone`: its env frames/s over that rate (1.0 = the
whole trainer steps envs as fast as its actor loop can on its own). The actor loop
alone also reports its CPU time per 1,000 env frames and the cores it kept busy.
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import metrics_window  # bench/metrics_window.py, beside this script.

from impala_tf import cpu_kernels

SETTINGS = {
    'default': [],
    'sgd4': ['--num_sgd_iter=4'],
    # The same with k learner steps per call (fewer Python-to-TensorFlow calls).
    'calls4': ['--learner_steps_per_call=4'],
    'calls8': ['--learner_steps_per_call=8'],
    'sgd4_calls8': ['--num_sgd_iter=4', '--learner_steps_per_call=8'],
}


def actor_alone(seconds):
  """Env frames/s of one default Actor with its unrolls dropped (in this process)."""
  import threading  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from impala_tf import actor as actor_lib  # pylint: disable=g-import-not-at-top
  from impala_tf import config as config_lib  # pylint: disable=g-import-not-at-top
  from impala_tf import environments  # pylint: disable=g-import-not-at-top
  from impala_tf import networks  # pylint: disable=g-import-not-at-top
  config = config_lib.Config()
  kwargs = environments.env_kwargs(config)
  obs_space, action_space = environments.env_spaces(config.env, **kwargs)
  env = environments.make_vector_env(config.env, config.num_envs_per_actor, 0,
                                     vectorization=config.env_vectorization, **kwargs)
  with tf.device('/cpu:0'):
    net = networks.make_network(config, obs_space, action_space)
  broadcast = actor_lib.ParameterBroadcast()
  broadcast.publish(0, [v.numpy() for v in net.variables])
  stop = threading.Event()
  actor = actor_lib.Actor(0, env, net, broadcast, config.unroll_length,
                          lambda chunk: True, lambda episodes: None, 0, stop)
  thread = threading.Thread(target=actor.run, daemon=True)
  thread.start()
  time.sleep(2.0)  # Warm-up: tracing, first resets.
  steps0, t0, cpu0 = actor.steps, time.time(), time.process_time()
  time.sleep(seconds)
  steps1, t1, cpu1 = actor.steps, time.time(), time.process_time()
  stop.set()
  thread.join()
  actor.close()
  repeat = environments.action_repeat(config.env)
  frames = (steps1 - steps0) * repeat
  return {'env': config.env, 'num_envs': config.num_envs_per_actor,
          'env_fps': round(frames / (t1 - t0)),
          'cpu_ms_per_1k_frames': round((cpu1 - cpu0) / frames * 1e6, 3),
          'cpu_cores_mean': round((cpu1 - cpu0) / (t1 - t0), 2)}


def measure(name, frames, extra, workdir, alone_fps=None):
  logdir = os.path.join(workdir, name)
  cmd = [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}',
         f'--total_environment_frames={frames}', '--log_interval_secs=1'
         ] + SETTINGS[name] + extra
  start = time.time()
  cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
  if proc.returncode:
    return {'setting': name, 'error': proc.stderr.strip().splitlines()[-1:]}
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    lines = [json.loads(l) for l in f]
  steady = [l for l in lines[1:] if not l.get('final')]
  if len(steady) < 2:
    return {'setting': name, 'error': 'run too short for a steady-state window'}
  rates = metrics_window.window_rates(steady[0], steady[-1], steps_decimals=1)
  return {
      'setting': name,
      'flags': SETTINGS[name] + extra,
      'env_fps': rates['env_fps'],
      'learner_fps': rates['learner_fps'],
      'learner_steps_per_sec': rates['learner_steps_per_sec'],
      'learner_wait_fraction': metrics_window.mean_of(steady[1:],
                                                      'learner_wait_fraction'),
      'policy_lag_mean': metrics_window.mean_of(steady, 'policy_lag_mean', 2),
      'env_fps_over_actor_alone': (
          round(rates['env_fps'] / alone_fps, 3) if alone_fps else None),
      'window_seconds': rates['window_seconds'],
      'startup_seconds_to_first_learner_step': lines[-1].get('startup_seconds'),
      'process_seconds': round(time.time() - start, 1),
      'process_cpu_seconds': round(cpu, 1),
      'process_cpu_cores_mean': round(cpu / (time.time() - start), 2),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--frames', type=int, default=400_000)
  parser.add_argument('--settings', default='default,sgd4')
  parser.add_argument('--actor_seconds', type=float, default=10.0)
  parser.add_argument('--actor_alone_child', action='store_true',
                      help=argparse.SUPPRESS)
  parser.add_argument('extra', nargs='*', help='extra train flags after --')
  args = parser.parse_args()
  # The CPU kernels `python -m impala_tf.train` runs with (also in the children).
  cpu_kernels.prefer_onednn()
  if args.actor_alone_child:
    print(json.dumps(actor_alone(args.actor_seconds)))
    return
  child = subprocess.run(
      [sys.executable, os.path.abspath(__file__), '--actor_alone_child',
       f'--actor_seconds={args.actor_seconds}'], capture_output=True, text=True,
      check=True)
  alone = json.loads(child.stdout.strip().splitlines()[-1])
  print(json.dumps({'actor_alone': alone}), file=sys.stderr, flush=True)
  results = []
  with tempfile.TemporaryDirectory() as workdir:
    for name in args.settings.split(','):
      results.append(measure(name, args.frames, args.extra, workdir,
                             alone['env_fps']))
      print(json.dumps(results[-1]), file=sys.stderr, flush=True)
  print(json.dumps({
      'benchmark': 'cartpole_throughput',
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version()},
      'frames_per_run': args.frames,
      'actor_alone': alone,
      'results': results,
  }, indent=1))


if __name__ == '__main__':
  main()
