"""Tests for impala_tf.distribute: strategies, virtual CPU devices, GPU checks.

Virtual CPU devices must be configured before TensorFlow initialises its devices,
and pytest runs many test files in one process, so the multi-replica checks run in
a subprocess that prints JSON.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import distribute

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_default_strategy_is_one_cpu_replica():
  strategy = distribute.get_strategy(0, 0)
  assert isinstance(strategy, tf.distribute.MirroredStrategy)
  assert strategy.num_replicas_in_sync == 1
  devices = strategy.extended.worker_devices
  assert len(devices) == 1 and 'CPU:0' in devices[0]
  # The single replica still runs the replica-context path (all_reduce, merge_call).
  def replica_fn():
    ctx = tf.distribute.get_replica_context()
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(3.0))
  result = strategy.run(tf.function(replica_fn))
  assert float(strategy.experimental_local_results(result)[0]) == 3.0


def test_virtual_devices_without_configure_raise():
  # This process did not call configure_devices: it has a single CPU device.
  assert len(tf.config.list_logical_devices('CPU')) < 3
  with pytest.raises(RuntimeError, match='num_virtual_cpu_devices'):
    distribute.get_strategy(num_virtual_cpu_devices=3)


def _fake_gpus(monkeypatch, num, visible):
  """TensorFlow with `num` GPUs, initialised with the first `visible` shown."""
  gpus = [tf.config.PhysicalDevice(f'/physical_device:GPU:{i}', 'GPU')
          for i in range(num)]
  real_list = tf.config.list_physical_devices
  monkeypatch.setattr(tf.config, 'list_physical_devices', lambda kind=None: (
      list(gpus) if kind == 'GPU' else real_list(kind)))

  def set_visible_devices(devices, kind=None):
    raise RuntimeError('Visible devices cannot be modified after being initialized')

  monkeypatch.setattr(tf.config, 'set_visible_devices', set_visible_devices)
  monkeypatch.setattr(tf.config, 'get_visible_devices', lambda kind=None: (
      gpus[:visible] if kind == 'GPU' else []))
  warnings = []
  monkeypatch.setattr(distribute.logging, 'warning',
                      lambda msg, *args: warnings.append(msg % args))
  return warnings


def test_gpus_that_cannot_be_hidden_any_more_are_warned_about(monkeypatch):
  warnings = _fake_gpus(monkeypatch, num=2, visible=2)
  distribute.configure_devices(num_gpus=1)
  assert warnings == [
      'num_gpus=1: /physical_device:GPU:1 stay visible, not hidden; TensorFlow '
      'initialised its devices before configure_devices ran (configure devices '
      'before any TensorFlow op runs, e.g. in a fresh process)']
  distribute.configure_devices(num_gpus=2)  # The layout it has: nothing to say.
  assert len(warnings) == 1


def test_gpus_asked_for_but_hidden_for_good_are_an_error(monkeypatch):
  warnings = _fake_gpus(monkeypatch, num=2, visible=1)
  with pytest.raises(RuntimeError,
                     match=r'^num_gpus=2: /physical_device:GPU:1 hidden; '):
    distribute.configure_devices(num_gpus=2)
  assert not warnings


def test_check_gpus_asks_for_more_than_visible():
  # On a GPU-less machine (CI, this test's home) found == 0 and num_gpus=1 fails.
  found = len(distribute.visible_gpus())
  distribute.check_gpus(0)  # Nothing asked, nothing to check.
  distribute.check_gpus(found)
  with pytest.raises(config_lib.ConfigError, match='num_gpus') as info:
    distribute.check_gpus(found + 1)
  assert info.value.field == 'num_gpus'
  assert f'num_gpus={found + 1}' in str(info.value)
  assert f'only {found} GPU' in str(info.value)
  assert isinstance(info.value, ValueError)


_SCRIPT = textwrap.dedent(r"""
    import json
    from impala_tf import distribute
    distribute.configure_devices(num_virtual_cpu_devices=2)
    import tensorflow as tf

    out = {}
    out['logical_cpus'] = len(tf.config.list_logical_devices('CPU'))
    strategy = distribute.get_strategy(num_virtual_cpu_devices=2)
    out['replicas'] = strategy.num_replicas_in_sync
    out['devices'] = list(strategy.extended.worker_devices)

    @tf.function
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      rid = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
      return ctx.all_reduce(tf.distribute.ReduceOp.SUM, rid + 1.0), rid

    total, rid = strategy.run(replica_fn)
    out['sums'] = [float(x) for x in strategy.experimental_local_results(total)]
    out['ids'] = [float(x) for x in strategy.experimental_local_results(rid)]
    with strategy.scope():
      v = tf.Variable(1.0)
    out['mirrored_components'] = len(strategy.experimental_local_results(v))

    # One replica is still available once the CPU is split.
    out['one_replica'] = distribute.get_strategy(0, 0).num_replicas_in_sync

    def error(fn):
      try:
        fn()
      except RuntimeError as e:
        return str(e)
      return None

    # More devices than were configured.
    out['get_3_error'] = error(
        lambda: distribute.get_strategy(num_virtual_cpu_devices=3))
    # Reconfiguring after TensorFlow initialised its devices.
    out['configure_3_error'] = error(
        lambda: distribute.configure_devices(num_virtual_cpu_devices=3))
    # The same layout again is fine (e.g. driver.train after the caller configured).
    out['configure_2_again_error'] = error(
        lambda: distribute.configure_devices(num_virtual_cpu_devices=2))
    print('RESULT ' + json.dumps(out))
""")


def test_two_virtual_cpu_devices_in_a_subprocess(tmp_path):
  script = tmp_path / 'distribute_check.py'
  script.write_text(_SCRIPT)
  env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2')
  proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        env=env, cwd=_REPO, timeout=240, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
  assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
  out = json.loads(lines[-1][len('RESULT '):])
  assert out['logical_cpus'] == 2
  assert out['replicas'] == 2
  assert [d.split('/')[-1] for d in out['devices']] == ['device:CPU:0', 'device:CPU:1']
  assert out['sums'] == [3.0, 3.0]  # (0 + 1) + (1 + 1) on both replicas.
  assert out['ids'] == [0.0, 1.0]
  assert out['mirrored_components'] == 2
  assert out['one_replica'] == 1
  assert out['get_3_error'] and 'num_virtual_cpu_devices=3' in out['get_3_error']
  assert out['configure_3_error'] and 'num_virtual_cpu_devices=3' in (
      out['configure_3_error'])
  assert out['configure_2_again_error'] is None


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
