"""Benchmarks impala_tf.vtrace.from_importance_weights; prints one JSON object.

Run from the repository root:

    python bench/vtrace_bench.py [--batch_size=256] [--unroll_lengths=20,100,500]

For each unroll length T it reports the median time per call (ms) of:
  tf_function_ms: `vtrace.from_importance_weights` inside a `tf.function` (the
    parallel scan this package uses);
  tf_function_xla_ms: the same with `jit_compile=True`;
  tf_scan_ms: a step-by-step `tf.scan` over time (the scalable_agent approach), in a
    tf.function, as the baseline the parallel scan replaced;
  tf_scan_xla_ms: the same with `jit_compile=True`;
  numpy_ms: a plain numpy loop of the same recursion, in the same process.
Each is wall time; `cpu_ms` has the process CPU time (all threads) of the same calls,
which is less sensitive to other load on a shared machine (`load_average_1m`).
Inputs are float32 `[T, B]` with random log_rhos in [-2, 2], discounts 0.99 with 5%
episode ends. Each figure is the median over `repeats` timings of `calls` calls,
timed round-robin.
"""

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
import tensorflow as tf  # pylint: disable=g-import-not-at-top

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from impala_tf import vtrace  # pylint: disable=g-import-not-at-top


def numpy_vtrace(log_rhos, discounts, rewards, values, bootstrap_value):
  """V-trace (clip 1.0, lambda 1.0) with a backward numpy loop over `[T, B]`."""
  rhos = np.exp(log_rhos)
  clipped = np.minimum(1.0, rhos)
  values_next = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
  deltas = clipped * (rewards + discounts * values_next - values)
  decay = discounts * clipped
  diff = np.zeros_like(values)
  acc = np.zeros_like(bootstrap_value)
  for t in range(len(values) - 1, -1, -1):
    acc = deltas[t] + decay[t] * acc
    diff[t] = acc
  vs = diff + values
  vs_next = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
  return vs, clipped * (rewards + discounts * vs_next - values)


def scan_vtrace(log_rhos, discounts, rewards, values, bootstrap_value):
  """V-trace (clip 1.0, lambda 1.0) with a sequential reverse `tf.scan`."""
  rhos = tf.exp(log_rhos)
  clipped = tf.minimum(1.0, rhos)
  values_next = tf.concat([values[1:], bootstrap_value[None]], axis=0)
  deltas = clipped * (rewards + discounts * values_next - values)
  diff = tf.scan(lambda acc, x: x[0] + x[1] * acc, (deltas, discounts * clipped),
                 initializer=tf.zeros_like(bootstrap_value), reverse=True)
  vs = diff + values
  vs_next = tf.concat([vs[1:], bootstrap_value[None]], axis=0)
  return vs, clipped * (rewards + discounts * vs_next - values)


def make_inputs(num_steps, batch_size, seed=0):
  rng = np.random.RandomState(seed)
  shape = (num_steps, batch_size)
  return (rng.uniform(-2, 2, shape).astype(np.float32),
          (0.99 * (rng.uniform(size=shape) > 0.05)).astype(np.float32),
          rng.normal(size=shape).astype(np.float32),
          rng.normal(size=shape).astype(np.float32),
          rng.normal(size=shape[1:]).astype(np.float32))


def median_ms(fns, repeats, calls):
  """Median wall and CPU time per call (ms) of each of `fns`.

  The functions are timed round-robin (`calls` calls of one, then of the next, ...,
  `repeats` times over), so that a change in machine load hits them all alike.

  Args:
    fns: {label: zero-argument callable}.
    repeats: number of timings per function.
    calls: calls per timing.

  Returns:
    ({label: median wall ms per call}, {label: median process CPU ms per call}),
    the CPU time summed over all of the process's threads.
  """
  for fn in fns.values():
    fn()  # warm-up (tracing, compilation)
  wall = {label: [] for label in fns}
  cpu = {label: [] for label in fns}
  for _ in range(repeats):
    for label, fn in fns.items():
      start, start_cpu = time.perf_counter(), time.process_time()
      for _ in range(calls):
        fn()
      wall[label].append((time.perf_counter() - start) / calls * 1e3)
      cpu[label].append((time.process_time() - start_cpu) / calls * 1e3)

  def medians(times):
    return {label: round(float(np.median(t)), 4) for label, t in times.items()}

  return medians(wall), medians(cpu)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batch_size', type=int, default=256)
  parser.add_argument('--unroll_lengths', default='20,100,500')
  parser.add_argument('--repeats', type=int, default=15)
  parser.add_argument('--calls', type=int, default=10)
  args = parser.parse_args()

  def fetch(outputs):
    return [t.numpy() for t in outputs]

  results = []
  for num_steps in [int(t) for t in args.unroll_lengths.split(',')]:
    arrays = make_inputs(num_steps, args.batch_size)
    tensors = [tf.constant(a) for a in arrays]
    ours = tf.function(vtrace.from_importance_weights)
    ours_xla = tf.function(vtrace.from_importance_weights, jit_compile=True)
    scan = tf.function(scan_vtrace)
    scan_xla = tf.function(scan_vtrace, jit_compile=True)
    ref_vs, _ = numpy_vtrace(*[a.astype(np.float64) for a in arrays])
    max_abs_error = float(np.max(np.abs(ours(*tensors).vs.numpy() - ref_vs)))
    wall, cpu = median_ms({
        'tf_function_ms': lambda: fetch(ours(*tensors)),
        'tf_function_xla_ms': lambda: fetch(ours_xla(*tensors)),
        'tf_scan_ms': lambda: fetch(scan(*tensors)),
        'tf_scan_xla_ms': lambda: fetch(scan_xla(*tensors)),
        'numpy_ms': lambda: numpy_vtrace(*arrays),
    }, args.repeats, args.calls)
    row = {'T': num_steps, 'B': args.batch_size, **wall, 'cpu_ms': cpu,
           'max_abs_error_vs_float64': max_abs_error}
    results.append(row)

  print(json.dumps({
      'benchmark': 'vtrace.from_importance_weights',
      'algorithm': 'parallel (Hillis-Steele) scan over time',
      'results': results,
      'machine': {
          'cpu_count': os.cpu_count(),
          'cpus_usable': len(os.sched_getaffinity(0)),
          'load_average_1m': round(os.getloadavg()[0], 2),
          'platform': platform.platform(),
          'python': platform.python_version(),
          'tensorflow': tf.__version__,
          'numpy': np.__version__,
          'gpus': len(tf.config.list_physical_devices('GPU')),
      },
      'repeats': args.repeats,
      'calls_per_repeat': args.calls,
  }))


if __name__ == '__main__':
  main()
