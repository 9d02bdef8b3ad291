"""TensorFlow's CPU kernels with and without oneDNN, op by op, on the shallow torso; JSON.

Usage:
  python bench/cpu_kernels.py [--seconds=3] [--batch=168]

Why the entry points set `TF_ENABLE_ONEDNN_OPTS=1` (`impala_tf.cpu_kernels`): for
each value, 0 (TensorFlow's Eigen kernels) and 1 (oneDNN), a fresh process times,
in CPU milliseconds per call (all threads) after a warm-up, the ops of the IMPALA
shallow torso on a float32 batch `[batch, 84, 84, 4]` (168 = 8 unrolls x 21 rows,
a `configs/pong.cfg` learner batch):

* `conv1`, `conv2`, `fc`: the forward op of each layer;
* `conv1_filter_grad`, `conv2_filter_grad`: their weight gradients;
* `conv2_input_grad`: the gradient into conv1's output (the first layer's input
  gradient is never computed);
* `torso_forward_backward`: `torsos.ShallowTorso` (leaky ReLUs) forward and the
  gradient of a scalar loss with respect to its variables, in one tf.function.

Each op's row has `ms_cpu` and `gmac_per_core_s` (its multiply-adds over its CPU
time) per setting and `off_over_on` (how many times the CPU time without oneDNN is
that with it). `machine.cpu_flags` lists the CPU's AVX-512 and AMX features:
TensorFlow turns oneDNN on by itself only with AVX512_VNNI, AVX512_BF16 or AMX.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

# CPU features that decide TensorFlow's own oneDNN default, as /proc/cpuinfo names them.
_FEATURES = ('avx2', 'fma', 'avx512f', 'avx512_vnni', 'avx512_bf16', 'amx_tile')


def cpu_flags(cpuinfo: str):
  """The features of `_FEATURES` that the `flags` line of a /proc/cpuinfo text has."""
  for line in cpuinfo.splitlines():
    if line.startswith('flags'):
      have = set(line.split(':', 1)[1].split())
      return [f for f in _FEATURES if f in have]
  return []


def layer_macs(batch: int):
  """Multiply-adds of each op (per call) for an 84x84x4 input batch."""
  conv1 = batch * 20 * 20 * (8 * 8 * 4) * 16   # 84 -> 20, 8x8x4 -> 16.
  conv2 = batch * 9 * 9 * (4 * 4 * 16) * 32    # 20 -> 9, 4x4x16 -> 32.
  fc = batch * 2592 * 256
  return {'conv1': conv1, 'conv2': conv2, 'fc': fc, 'conv1_filter_grad': conv1,
          'conv2_filter_grad': conv2, 'conv2_input_grad': conv2,
          # Forward, the weight gradients and the two input gradients past conv1.
          'torso_forward_backward': conv1 + conv2 + fc + conv1 + 2 * conv2 + 2 * fc}


def summary(off, on):
  """Per op: both settings' rows and off_over_on (CPU ms without / with oneDNN)."""
  return {op: {'off': off[op], 'on': on[op],
               'off_over_on': round(off[op]['ms_cpu'] / on[op]['ms_cpu'], 2)}
          for op in off if op in on}


def measure(batch: int, seconds: float):
  """Times each op in this process (TF_ENABLE_ONEDNN_OPTS as already set)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from impala_tf import layers  # pylint: disable=g-import-not-at-top
  from impala_tf import torsos  # pylint: disable=g-import-not-at-top
  rng = tf.random.Generator.from_seed(0)
  x = rng.uniform([batch, 84, 84, 4])
  w1 = tf.Variable(rng.normal([8, 8, 4, 16]) * 0.1)
  w2 = tf.Variable(rng.normal([4, 4, 16, 32]) * 0.1)
  w3 = tf.Variable(rng.normal([2592, 256]) * 0.01)
  h1 = tf.nn.conv2d(x, w1, 4, 'VALID')
  h2 = tf.nn.conv2d(h1, w2, 2, 'VALID')
  dh1, dh2 = rng.normal(h1.shape), rng.normal(h2.shape)
  torso = torsos.ShallowTorso([84, 84, 4], layers.SeedStream(0),
                              weight_init='orthogonal', activation='leaky_relu')

  def torso_grads(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(torso(x)))
    return tape.gradient(loss, torso.trainable_variables)

  ops = {
      'conv1': (lambda x: tf.nn.conv2d(x, w1, 4, 'VALID'), x),
      'conv2': (lambda h: tf.nn.conv2d(h, w2, 2, 'VALID'), h1),
      'fc': (lambda h: tf.reshape(h, [batch, -1]) @ w3, h2),
      'conv1_filter_grad': (lambda x: tf.compat.v1.nn.conv2d_backprop_filter(
          x, [8, 8, 4, 16], dh1, [1, 4, 4, 1], 'VALID'), x),
      'conv2_filter_grad': (lambda h: tf.compat.v1.nn.conv2d_backprop_filter(
          h, [4, 4, 16, 32], dh2, [1, 2, 2, 1], 'VALID'), h1),
      'conv2_input_grad': (lambda d: tf.compat.v1.nn.conv2d_backprop_input(
          [batch, 20, 20, 16], w2, d, [1, 2, 2, 1], 'VALID'), dh2),
      'torso_forward_backward': (torso_grads, x),
  }
  macs = layer_macs(batch)
  rows = {}
  for name, (fn, arg) in ops.items():
    fn = tf.function(fn)
    tf.nest.map_structure(lambda t: t.numpy(), fn(arg))  # Trace and warm up.
    calls, cpu0, wall0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds:
      out = fn(arg)
      tf.nest.map_structure(lambda t: t.numpy(), out)
      calls += 1
    cpu = (time.process_time() - cpu0) / calls
    rows[name] = {'ms_cpu': round(cpu * 1e3, 2),
                  'ms_wall': round((time.perf_counter() - wall0) / calls * 1e3, 2),
                  'gmac_per_core_s': round(macs[name] / cpu / 1e9, 1)}
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--seconds', type=float, default=3.0,
                      help='timing per op and setting, after a warm-up')
  parser.add_argument('--batch', type=int, default=168, help='frame stacks per call')
  parser.add_argument('--one', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.batch < 1 or args.seconds <= 0:
    parser.error('--batch must be >= 1 and --seconds > 0')
  if args.one:  # A child: TF_ENABLE_ONEDNN_OPTS is set by the parent.
    print('RESULT ' + json.dumps(measure(args.batch, args.seconds)))
    return
  results = {}
  for value, key in (('0', 'off'), ('1', 'on')):
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=value, TF_CPP_MIN_LOG_LEVEL='2')
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), '--one',
         f'--batch={args.batch}', f'--seconds={args.seconds}'],
        env=env, capture_output=True, text=True, check=False)
    lines = [l for l in child.stdout.splitlines() if l.startswith('RESULT ')]
    if child.returncode or not lines:
      sys.exit(f'cpu_kernels: the TF_ENABLE_ONEDNN_OPTS={value} child failed: '
               + ' '.join(child.stderr.strip().splitlines()[-1:]))
    results[key] = json.loads(lines[-1][len('RESULT '):])
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      flags = cpu_flags(f.read())
  except OSError:
    flags = None
  print(json.dumps({
      'benchmark': 'cpu_kernels', 'batch': [args.batch, 84, 84, 4],
      'machine': {'cpus': os.cpu_count(), 'machine': platform.machine(),
                  'python': platform.python_version(), 'cpu_flags': flags},
      'ops': summary(results['off'], results['on']),
  }, indent=1))


if __name__ == '__main__':
  main()
