"""The learner step alone, on a fixed batch: steps/s next to the bare network; JSON.

Usage:
  python bench/learner_step.py [--settings=cartpole,shallow,deep] [--seconds=5]
      [-- extra train flags, e.g. --learner_jit=off --learner_steps_per_call=1]

For each setting (in a fresh process of its own, with TensorFlow's inter-op pool
sized as the trainer sizes it, `--tf_inter_op_threads`; no actors, no data loaders)
it builds a `Learner`
with the setting's flags plus the extra flags, and one random batch of the run's
shapes, then times, each for about `--seconds` after a warm-up (tracing excluded):

* `step`: `Learner.step` on the batch already distributed to the replicas (V-trace,
  losses, the all-reduce, clipping, the optimizer, the counters), outputs fetched;
  per learner step (a call of `--learner_steps_per_call` steps counts as that many);
  with `--num_sgd_iter=k` (and the default ring of one batch) the loop, as the
  trainer's, makes k steps on each batch it fetches;
* `loop`: what the trainer's loop pays per learner step: `step_from_iterator` on a
  `tf.data` dataset that repeats the batch (the batch fetch, the weights for the
  actors and the diagnostics, returned as numpy once per call), without the
  per-term gradient norms, as the trainer's calls between two metrics lines (it
  measures them on the one call before each line);
* `bare`: the network's forward and backward pass on the same batch (`unroll`, a
  scalar loss, `tape.gradient`, in a tf.function): the floor a learner step can reach.

Settings: `cartpole` (the trainer's defaults: CartPole-v1, MLP 64-64, batch 8 x 10
steps), `shallow` and `deep` (the IMPALA paper's Atari nets on 84x84x4 uint8
frames, batch 16 x 20 steps, RMSProp, as `bench/atari.py`; loss options as
configs/atari_paper.cfg: no PopArt, no per-term gradient norms). No env is built (the
spaces are given), so no Atari ROMs are needed.

Each result has ms per step and steps/s for `step`, `loop` and `bare`, and
`step_over_bare` / `loop_over_bare` (1.0 = the learner costs only its network), and
`loop_cpu_ms`: this process's CPU time per learner step in the loop (all threads; more
than `loop_ms` when TensorFlow runs ops in parallel). TensorFlow's CPU kernels are
the trainer's (`impala_tf.cpu_kernels`: oneDNN on x86-64 unless
`TF_ENABLE_ONEDNN_OPTS` is set); `machine` records the variable.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

from impala_tf import cpu_kernels

SETTINGS = {
    'cartpole': [],
    'shallow': ['--network=shallow', '--batch_size=16', '--unroll_length=20',
                '--optimizer=rmsprop', '--learning_rate=0.0006',
                '--reward_clipping=abs_one', '--nopopart', '--noloss_term_grad_norms'],
    'deep': ['--network=deep', '--batch_size=16', '--unroll_length=20',
             '--optimizer=rmsprop', '--learning_rate=0.0006',
             '--reward_clipping=abs_one', '--nopopart', '--noloss_term_grad_norms'],
}


def _config(flag_list):
  """A Config from train flags (the package's own parser and validation)."""
  from absl import flags as absl_flags  # pylint: disable=g-import-not-at-top
  from impala_tf import flags as impala_flags  # pylint: disable=g-import-not-at-top
  values = absl_flags.FlagValues()
  impala_flags.define_flags(values)
  values(['learner_step'] + list(flag_list))
  return impala_flags.config_from_flags(values)


def _spaces(name):
  import gymnasium as gym  # pylint: disable=g-import-not-at-top
  if name == 'cartpole':
    env = gym.make('CartPole-v1')
    spaces = env.observation_space, env.action_space
    env.close()
    return spaces
  return (gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Discrete(6))


def _batch(config, obs_space, num_actions, state, seed=0):
  """One random batch `[B, T + 1, ...]` of the data pipeline's signature."""
  rng = np.random.default_rng(seed)
  b, t1, a = config.batch_size, config.unroll_length + 1, num_actions
  if obs_space.dtype == np.uint8:
    obs = rng.integers(0, 255, (b, t1) + obs_space.shape, dtype=np.uint8)
  else:
    obs = rng.normal(size=(b, t1) + obs_space.shape).astype(obs_space.dtype)
  batch = {
      'observation': obs,
      'reward': rng.normal(size=(b, t1)).astype(np.float32),
      'terminated': rng.random((b, t1)) < 0.02,
      'truncated': np.zeros((b, t1), bool),
      'first': np.zeros((b, t1), bool),
      'prev_action': rng.integers(0, a, (b, t1), dtype=np.int32),
      'action': rng.integers(0, a, (b, t1), dtype=np.int32),
      'behaviour_logits': rng.normal(size=(b, t1, a)).astype(np.float32),
      'policy_version': np.zeros(b, np.int64),
      'unroll_id': np.arange(b, dtype=np.int64),
      'replayed': np.zeros(b, bool),
      'reuse': np.zeros(b, np.int32),
  }
  for i, s in enumerate(state):
    batch[f'core_state_{i}'] = np.zeros((b,) + tuple(s.shape[1:]), np.float32)
  return batch


def _timed(fn, seconds, steps_per_call=1):
  """Median wall seconds per learner step over calls of `fn` for about `seconds`.

  Returns:
    (median wall seconds, mean process CPU seconds) per learner step; the CPU time
    is this process's, all threads (TensorFlow's pools included).
  """
  fn()  # Trace.
  fn()
  times, start, cpu = [], time.perf_counter(), time.process_time()
  while time.perf_counter() - start < seconds or len(times) < 3:
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  cpu = (time.process_time() - cpu) / len(times)
  return float(np.median(times)) / steps_per_call, cpu / steps_per_call


def measure(name, extra, seconds):
  """Times step, loop and bare for one setting; returns a dict.

  Call it in a fresh process: it first sizes TensorFlow's inter-op pool as the
  trainer would for the setting (`--tf_inter_op_threads`).
  """
  config = _config(SETTINGS[name] + list(extra))
  obs_space, act_space = _spaces(name)
  from impala_tf import distribute  # pylint: disable=g-import-not-at-top
  inter_op = distribute.inter_op_threads(config, obs_space.shape)
  distribute.set_inter_op_threads(inter_op)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from impala_tf import data, learner, networks, types  # pylint: disable=g-import-not-at-top,g-multiple-import
  repeat = 1 if name == 'cartpole' else 4
  strategy = distribute.get_strategy(config.num_gpus, config.num_virtual_cpu_devices)
  lrn = learner.Learner(
      config, lambda: networks.make_network(config, obs_space, act_space), strategy,
      action_repeat=repeat)
  net = lrn.network
  batch = _batch(config, obs_space, int(act_space.n), net.initial_state(1))
  n = strategy.num_replicas_in_sync
  per = config.batch_size // n

  def shard(ctx):
    i = ctx.replica_id_in_sync_group
    return {k: tf.constant(v[i * per:(i + 1) * per]) for k, v in batch.items()}

  dist = strategy.experimental_distribute_values_from_function(shard)
  # As the trainer does: with a ring of one batch, the learner itself reuses each
  # batch num_sgd_iter times; a call makes a multiple of that many steps.
  reuse = learner.reuse_in_call(config)
  k = reuse * -(-config.learner_steps_per_call // reuse)

  def step():
    out = lrn.step(dist)
    tf.nest.map_structure(lambda x: x.numpy(), out)

  one = {key: tf.constant(v) for key, v in batch.items()}

  def make_dataset():
    ds = tf.data.Dataset.from_tensors(one).repeat()
    if n > 1:
      ds = ds.flat_map(lambda b: tf.data.Dataset.from_tensor_slices(
          {key: tf.reshape(v, [n, per] + v.shape[1:].as_list())
           for key, v in b.items()}))
    return ds.prefetch(n)

  iterator = iter(data.distribute(strategy, make_dataset))

  waits = []

  def loop():
    # Weights and scalars come back as numpy.
    # As the trainer's calls between two metrics lines: no per-term norms.
    out = lrn.step_from_iterator(iterator, reuse, term_norms=False)
    waits.append(out['data_wait_seconds'])

  tm = lambda x: tf.constant(np.swapaxes(x, 0, 1))
  bare_args = (tm(batch['observation']), tm(batch['prev_action']),
               tm(batch['reward']), tm(batch['first']))

  @tf.function(autograph=False)
  def bare_fn(obs, prev_action, reward, first):
    with tf.GradientTape() as tape:
      out, _ = net.unroll(types.AgentInput(obs, prev_action, reward, first),
                          net.initial_state(config.batch_size))
      loss = tf.reduce_sum(out.policy_logits) + tf.reduce_sum(out.baseline)
    return tape.gradient(loss, net.trainable_variables)

  def bare():
    tf.nest.map_structure(lambda x: x.numpy(), bare_fn(*bare_args))

  step_s, _ = _timed(step, seconds)
  loop_start = time.perf_counter()
  loop_s, loop_cpu_s = _timed(loop, seconds, k)
  # The loop's own data wait: the dataset repeats one in-memory batch, so this is
  # the cost of fetching a prefetched element, never a wait for data.
  loop_wait = sum(waits) / (time.perf_counter() - loop_start)
  bare_s, _ = _timed(bare, seconds)
  ms = lambda s: round(s * 1e3, 3)
  return {
      'setting': name,
      'flags': SETTINGS[name] + list(extra),
      'batch': [config.unroll_length + 1, config.batch_size],
      'num_replicas': n,
      'tf_inter_op_threads': inter_op,  # 0: TensorFlow's default.
      'parameters': int(sum(np.prod(v.shape) for v in net.trainable_variables)),
      'step_ms': ms(step_s), 'step_per_sec': round(1 / step_s, 1),
      'loop_ms': ms(loop_s), 'loop_per_sec': round(1 / loop_s, 1),
      'loop_data_wait_fraction': round(loop_wait, 3),
      'loop_cpu_ms': ms(loop_cpu_s),
      'bare_ms': ms(bare_s), 'bare_per_sec': round(1 / bare_s, 1),
      'step_over_bare': round(step_s / bare_s, 3),
      'loop_over_bare': round(loop_s / bare_s, 3),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--settings', default='cartpole,shallow,deep')
  parser.add_argument('--seconds', type=float, default=5.0)
  parser.add_argument('--one', help=argparse.SUPPRESS)  # A child: this setting.
  parser.add_argument('extra', nargs='*', help='extra train flags after --')
  args = parser.parse_args()
  # The CPU kernels `python -m impala_tf.train` runs with (also in the children).
  cpu_kernels.prefer_onednn()
  if args.one:
    print('RESULT ' + json.dumps(measure(args.one, args.extra, args.seconds)))
    return
  load_before = os.getloadavg()
  results = []
  for name in args.settings.split(','):
    if name not in SETTINGS:
      parser.error(f'--settings: unknown setting {name!r}; one of '
                   f'{", ".join(SETTINGS)}')
  for name in args.settings.split(','):
    # A fresh process per setting: TensorFlow's thread pools are sized once.
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), f'--one={name}',
         f'--seconds={args.seconds}', '--'] + list(args.extra),
        capture_output=True, text=True, check=False)
    lines = [l for l in child.stdout.splitlines() if l.startswith('RESULT ')]
    if child.returncode or not lines:
      results.append({'setting': name, 'error': child.stderr.strip().splitlines()[-1:]})
    else:
      results.append(json.loads(lines[-1][len('RESULT '):]))
    print(json.dumps(results[-1]), file=sys.stderr, flush=True)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  print(json.dumps({
      'benchmark': 'learner_step',
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version(),
                  'tensorflow': tf.__version__,
                  cpu_kernels.ENV_VAR: os.environ.get(cpu_kernels.ENV_VAR),
                  'loadavg_1min_before': round(load_before[0], 2),
                  'loadavg_1min_after': round(os.getloadavg()[0], 2)},
      'results': results,
  }, indent=1))


if __name__ == '__main__':
  main()
