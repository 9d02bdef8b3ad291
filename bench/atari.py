"""Atari (Pong) throughput for the shallow, deep and deep+LSTM networks; prints JSON.

Usage:
  python bench/atari.py [--env=ALE/Pong-v5] [--seconds=90] [--networks=shallow,deep,deep_lstm]
      [-- extra train flags]

Two measurements per network:

1. The whole trainer: `python -m impala_tf.train` on the env for `seconds` of wall
   time (SIGINT then), with `--num_actors=2 --num_envs_per_actor=8 --batch_size=16
   --unroll_length=20`. From metrics.jsonl, between the first line after the first
   learner step and the last line: env frames/s (actors), learner frames/s (frames
   trained; Atari frames = agent steps x 4) and learner_wait_fraction.
2. In this process, on the same batch shape ([T+1=21, B=16, 84, 84, C] uint8): the
   time of one `Learner.step` (the tf.data element already on the device, V-trace,
   loss, all-reduce, clipping, RMSProp) next to the bare forward+backward pass of the
   same network (`network.unroll` + a scalar loss + `tape.gradient`, in a
   tf.function). The ratio shows what the learner adds around the network.
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

import numpy as np

NETWORKS = {
    'shallow': ['--network=shallow'],
    'deep': ['--network=deep'],
    'deep_lstm': ['--network=deep', '--use_lstm'],
}
TRAIN_FLAGS = ['--num_actors=2', '--num_envs_per_actor=8', '--batch_size=16',
               '--unroll_length=20', '--optimizer=rmsprop', '--learning_rate=0.0006',
               '--reward_clipping=abs_one', '--log_interval_secs=5']


def trainer_rates(env, name, seconds, extra, workdir):
  logdir = os.path.join(workdir, name)
  cmd = [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}', f'--env={env}',
         '--total_environment_frames=100000000'] + TRAIN_FLAGS + NETWORKS[name] + extra
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  time.sleep(seconds)
  proc.send_signal(signal.SIGINT)
  proc.wait(timeout=120)
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    lines = [json.loads(l) for l in f]
  steady = [l for l in lines if l.get('learner_steps', 0) > 0 and not l.get('final')]
  if len(steady) < 3:
    return {'error': f'only {len(steady)} metrics lines after the first step; '
                     'raise --seconds'}
  a, b = steady[1], steady[-1]
  dt = b['wall_seconds'] - a['wall_seconds']
  waits = [l['learner_wait_fraction'] for l in steady[2:]]
  return {
      'env_fps': round((b['env_frames'] - a['env_frames']) / dt),
      'learner_fps': round((b['trained_frames'] - a['trained_frames']) / dt),
      'learner_steps_per_sec': round((b['learner_steps'] - a['learner_steps']) / dt, 2),
      'learner_wait_fraction': round(sum(waits) / len(waits), 3) if waits else None,
      'window_seconds': round(dt, 1),
      'startup_seconds_to_first_learner_step': lines[-1].get('startup_seconds'),
  }


def step_vs_bare(env, name, repeats=3):
  """Times Learner.step and the bare forward+backward on one fixed batch."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from impala_tf import config as config_lib  # pylint: disable=g-import-not-at-top
  from impala_tf import data, distribute, environments, learner, networks, types  # pylint: disable=g-import-not-at-top,g-multiple-import
  use_lstm = name == 'deep_lstm'
  torso = 'shallow' if name == 'shallow' else 'deep'
  cfg = config_lib.Config(env=env, network=torso, use_lstm=use_lstm, batch_size=16,
                          unroll_length=20, optimizer='rmsprop',
                          learning_rate=0.0006, reward_clipping='abs_one')
  obs_space, act_space = environments.env_spaces(env, use_lstm=use_lstm)
  strategy = distribute.get_strategy()
  lrn = learner.Learner(cfg, lambda: networks.make_network(cfg, obs_space, act_space),
                        strategy, action_repeat=4)
  b, t1, a = 16, 21, int(act_space.n)
  rng = np.random.default_rng(0)
  batch = {
      'observation': rng.integers(0, 255, (b, t1) + obs_space.shape, dtype=np.uint8),
      'reward': rng.normal(size=(b, t1)).astype(np.float32),
      'terminated': np.zeros((b, t1), bool), 'truncated': np.zeros((b, t1), bool),
      'first': np.zeros((b, t1), bool),
      'prev_action': rng.integers(0, a, (b, t1), dtype=np.int32),
      'action': rng.integers(0, a, (b, t1), dtype=np.int32),
      'behaviour_logits': rng.normal(size=(b, t1, a)).astype(np.float32),
      'policy_version': np.zeros(b, np.int64), 'unroll_id': np.arange(b, dtype=np.int64),
      'replayed': np.zeros(b, bool), 'reuse': np.zeros(b, np.int32),
  }
  for i, s in enumerate(lrn.network.initial_state(b)):
    batch[f'core_state_{i}'] = np.zeros(s.shape, np.float32)
  dist = strategy.experimental_distribute_values_from_function(
      lambda ctx: {k: tf.constant(v) for k, v in batch.items()})
  net = lrn.network

  @tf.function(autograph=False)
  def bare(obs, prev_action, reward, first):
    with tf.GradientTape() as tape:
      out, _ = net.unroll(types.AgentInput(obs, prev_action, reward, first),
                          net.initial_state(b))
      loss = tf.reduce_sum(out.policy_logits) + tf.reduce_sum(out.baseline)
    return tape.gradient(loss, net.trainable_variables)

  tm = lambda x: tf.constant(np.swapaxes(x, 0, 1))
  bare_args = (tm(batch['observation']), tm(batch['prev_action']),
               tm(batch['reward']), tm(batch['first']))

  def timeit(fn):
    fn()  # Trace.
    times = []
    for _ in range(repeats):
      t = time.perf_counter()
      out = fn()
      tf.nest.map_structure(lambda x: x.numpy() if hasattr(x, 'numpy') else x, out)
      times.append(time.perf_counter() - t)
    return float(np.median(times))

  step_s = timeit(lambda: lrn.step(dist))
  bare_s = timeit(lambda: bare(*bare_args))
  del data
  return {'learner_step_seconds': round(step_s, 3),
          'bare_forward_backward_seconds': round(bare_s, 3),
          'step_over_bare': round(step_s / bare_s, 3)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--env', default='ALE/Pong-v5')
  parser.add_argument('--seconds', type=float, default=90)
  parser.add_argument('--networks', default='shallow,deep,deep_lstm')
  parser.add_argument('extra', nargs='*', help='extra train flags after --')
  args = parser.parse_args()
  results = []
  with tempfile.TemporaryDirectory() as workdir:
    for name in args.networks.split(','):
      r = {'network': name, 'flags': NETWORKS[name]}
      r.update(trainer_rates(args.env, name, args.seconds, args.extra, workdir))
      r.update(step_vs_bare(args.env, name))
      print(json.dumps(r), file=sys.stderr, flush=True)
      results.append(r)
  print(json.dumps({
      'benchmark': 'atari_throughput', 'env': args.env,
      'train_flags': TRAIN_FLAGS + args.extra,
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version()},
      'results': results,
  }, indent=1))


if __name__ == '__main__':
  main()
