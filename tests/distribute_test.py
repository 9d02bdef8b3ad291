"""Tests for impala_tf.distribute: strategies, virtual CPU devices, GPU checks.

Virtual CPU devices must be configured before TensorFlow initialises its devices,
and pytest runs many test files in one process, so the multi-replica checks run in
a subprocess that prints JSON.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import distribute
from impala_tf import testing

import helpers

_REPO = str(helpers.REPO)


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


@pytest.mark.parametrize('allow_growth', [None, 'false'])
def test_the_learners_gpus_grow_their_memory_and_the_others_are_hidden(
    monkeypatch, allow_growth):
  gpus = [tf.config.PhysicalDevice(f'/physical_device:GPU:{i}', 'GPU')
          for i in range(3)]
  real_list = tf.config.list_physical_devices
  monkeypatch.setattr(tf.config, 'list_physical_devices', lambda kind=None: (
      list(gpus) if kind == 'GPU' else real_list(kind)))
  calls = []
  monkeypatch.setattr(tf.config, 'set_visible_devices',
                      lambda devices, kind=None: calls.append(('visible', devices)))
  monkeypatch.setattr(tf.config.experimental, 'set_memory_growth',
                      lambda device, on: calls.append(('growth', device, on)))
  if allow_growth is None:
    monkeypatch.delenv('TF_FORCE_GPU_ALLOW_GROWTH', raising=False)
  else:
    monkeypatch.setenv('TF_FORCE_GPU_ALLOW_GROWTH', allow_growth)
  distribute.configure_devices(num_gpus=2)
  growth = [] if allow_growth == 'false' else [('growth', gpus[0], True),
                                               ('growth', gpus[1], True)]
  assert calls == [('visible', gpus[:2])] + growth


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
    out = {'inter_op_set': distribute.set_inter_op_threads(3)}  # Before TF starts.
    distribute.configure_devices(num_virtual_cpu_devices=2)
    import tensorflow as tf

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
    out['inter_op'] = tf.config.threading.get_inter_op_parallelism_threads()

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


@pytest.mark.e2e
def test_two_virtual_cpu_devices_in_a_subprocess(tmp_path):
  script = tmp_path / 'distribute_check.py'
  script.write_text(_SCRIPT)
  out = helpers.run_probe(script)
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
  assert out['inter_op_set'] is True and out['inter_op'] == 3


@pytest.mark.parametrize('fields, shape, want', [
    ({}, [4], 1),  # The CartPole defaults: auto, an 'auto' net on vectors.
    (dict(network='mlp'), [84, 84, 4], 1),  # An MLP acts with numpy on any input.
    ({}, [84, 84, 4], 0),  # 'auto' on images: a conv net, TensorFlow actors.
    (dict(network='shallow'), [84, 84, 4], 0),
    (dict(use_lstm=True), [4], 0),
    (dict(compute_dtype='bfloat16'), [4], 0),  # A bfloat16 MLP acts with TF.
    (dict(actor_backend='ray'), [4], 0),
    (dict(num_virtual_cpu_devices=2), [4], 0),
    (dict(num_learner_workers=2), [4], 0),
    (dict(num_gpus=1), [4], 0),
    (dict(tf_inter_op_threads=0), [4], 0),  # Asked for: as asked.
    (dict(tf_inter_op_threads=3, network='shallow'), [84, 84, 4], 3),
])
def test_inter_op_threads_auto_is_one_only_for_a_cpu_learner_with_numpy_actors(
    fields, shape, want):
  assert distribute.inter_op_threads(config_lib.Config(**fields), shape) == want


def test_inter_op_threads_after_tensorflow_started(monkeypatch):
  tf.constant(1.0) + 1.0  # pylint: disable=expression-not-assigned
  have = tf.config.threading.get_inter_op_parallelism_threads()
  warnings = []
  monkeypatch.setattr(distribute.logging, 'warning',
                      lambda msg, *args: warnings.append(msg % args))
  assert distribute.set_inter_op_threads(0) is False  # 0: nothing to set.
  assert distribute.set_inter_op_threads(have + 5, explicit=False) is False
  assert not warnings  # An automatic choice that cannot apply is dropped.
  assert distribute.set_inter_op_threads(have + 5) is False
  assert warnings == [
      f'tf_inter_op_threads={have + 5} not applied: TensorFlow already initialised '
      'its thread pools in this process (set it before any TensorFlow op runs, '
      'e.g. in a fresh process)']
  assert tf.config.threading.get_inter_op_parallelism_threads() == have


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))


# ---------------------------------------------------------------------------
# Several learner workers: TF_CONFIG, ports, and the tower invariant across
# processes.

def _tf_config(workers, index, task_type='worker'):
  return json.dumps({'cluster': {'worker': workers},
                     'task': {'type': task_type, 'index': index}})


def test_parse_tf_config_gives_the_workers_and_this_task():
  c = distribute.parse_tf_config(_tf_config(['10.0.0.1:2222', '10.0.0.2:2223'], 1))
  assert c.workers == ('10.0.0.1:2222', '10.0.0.2:2223')
  assert (c.index, c.num_workers, c.port, c.is_chief) == (1, 2, 2223, False)
  # Each worker's TF_CONFIG names the same cluster and its own index.
  again = distribute.parse_tf_config(c.tf_config(0))
  assert again.workers == c.workers and again.index == 0 and again.is_chief


@pytest.mark.parametrize('text, match', [
    ('{"cluster": ', 'TF_CONFIG is not JSON'),
    ('[1]', 'must be a JSON object with a "cluster" object'),
    (_tf_config(['a:1', 'b:2'], 2), r'task index 2 is out of range: the cluster has '
     r'2 worker\(s\), indices 0\.\.1'),
    (_tf_config(['a:1', 'b:2'], -1), 'task index -1 is out of range'),
    (_tf_config(['a:1', 'b:2'], 0, 'ps'), 'task must be'),
    (_tf_config(['a:1', 'b'], 0), "worker 'b' is not \"host:port\""),
    (_tf_config(['a:1', 'b:70000'], 0), "worker 'b:70000' is not"),
    (_tf_config(['a:1', 'a:1'], 0), 'names a worker address twice'),
    (_tf_config([], 0), 'must be a non-empty list'),
    (json.dumps({'cluster': {'chief': ['a:1'], 'worker': ['b:2']},
                 'task': {'type': 'worker', 'index': 0}}), 'has job\\(s\\) chief'),
])
def test_bad_tf_config_is_one_line_naming_the_problem(text, match):
  with pytest.raises(distribute.ClusterError, match=match) as e:
    distribute.parse_tf_config(text)
  assert '\n' not in str(e.value)


def test_cluster_from_env():
  two = _tf_config(['a:1', 'b:2'], 1)
  assert distribute.cluster_from_env(1, {}) is None
  assert distribute.cluster_from_env(1, {'TF_CONFIG': ' '}) is None
  # One worker is the single-process learner.
  assert distribute.cluster_from_env(1, {'TF_CONFIG': _tf_config(['a:1'], 0)}) is None
  assert distribute.cluster_from_env(1, {'TF_CONFIG': two}).index == 1
  assert distribute.cluster_from_env(2, {'TF_CONFIG': two}).num_workers == 2
  with pytest.raises(distribute.ClusterError,
                     match='--num_learner_workers=3 but TF_CONFIG names 2'):
    distribute.cluster_from_env(3, {'TF_CONFIG': two})


def test_port_in_use_is_named():
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  try:
    sock.bind(('0.0.0.0', 0))
    sock.listen(1)
    port = sock.getsockname()[1]
    with pytest.raises(distribute.ClusterError,
                       match=f'TF_CONFIG worker 0 port {port} cannot be opened'):
      distribute.check_port_free(port, 'TF_CONFIG worker 0 port')
  finally:
    sock.close()
  distribute.check_port_free(port)  # Free again.
  ports = distribute.free_local_ports(3)
  assert len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)


def test_resolve_cluster_takes_the_cluster_size_once_the_port_is_free():
  config = testing.tiny_config()
  assert distribute.resolve_cluster(config, {}) == (None, config)
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  try:
    sock.bind(('0.0.0.0', 0))
    sock.listen(1)
    taken = sock.getsockname()[1]
    free = distribute.free_local_ports(1)[0]
    workers = [f'localhost:{taken}', f'localhost:{free}']
    cluster, one = distribute.resolve_cluster(
        config, {'TF_CONFIG': _tf_config(workers, 1)})
    assert (cluster.index, cluster.port, cluster.num_workers) == (1, free, 2)
    assert one.num_learner_workers == 2
    assert one.replace(num_learner_workers=1) == config
    with pytest.raises(distribute.ClusterError,
                       match=f'^TF_CONFIG worker 0 port {taken} cannot be opened'):
      distribute.resolve_cluster(config, {'TF_CONFIG': _tf_config(workers, 0)})
    with pytest.raises(distribute.ClusterError, match='--num_learner_workers=3'):
      distribute.resolve_cluster(config.replace(num_learner_workers=3, batch_size=6),
                                 {'TF_CONFIG': _tf_config(workers, 1)})
  finally:
    sock.close()


def test_exposure_line_names_every_port_on_all_interfaces():
  line = distribute.exposure_line([23456, 23457])
  assert '\n' not in line
  assert '[::]:23456, [::]:23457' in line and 'ALL network interfaces' in line
  assert 'firewall' in line and 'docs/scaling.md' in line


def test_worker_seed_differs_per_worker_and_keeps_worker_0():
  assert distribute.worker_seed(5, 0) == 5
  seeds = {distribute.worker_seed(5, i) for i in range(8)}
  assert len(seeds) == 8 and all(0 <= s < 2**31 for s in seeds)


_WORKERS_SCRIPT = textwrap.dedent("""\
    import json, sys
    import numpy as np
    from impala_tf import config as config_lib
    from impala_tf import distribute

    mode, cases_path = sys.argv[1], sys.argv[2]
    if mode == 'devices':  # 1 worker x 2 devices.
      distribute.configure_devices(num_virtual_cpu_devices=2)
      strategy = distribute.get_strategy(num_virtual_cpu_devices=2)
      index, workers = 0, 1
    else:  # This process is one of 2 workers x 1 device (TF_CONFIG).
      cluster = distribute.cluster_from_env(2)
      strategy = distribute.get_strategy(cluster=cluster)
      index, workers = cluster.index, cluster.num_workers
    import gymnasium as gym
    from impala_tf import data
    from impala_tf import learner as learner_lib
    from impala_tf import networks

    total = distribute.sum_over_workers(strategy)([index + 1.0, 10.0])
    obs_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(3)
    out = {'replicas': strategy.num_replicas_in_sync,
           'local': distribute.local_replicas(strategy),
           'workers': distribute.num_workers(strategy), 'sum': total.tolist()}
    for name, case in json.load(open(cases_path)).items():
      cfg = config_lib.Config.from_dict(case['config'])
      # Each worker seeds its own initial weights differently: equal starting
      # weights can then only come from the strategy's broadcast of worker 0's.
      cfg = cfg.replace(seed=cfg.seed + 1000 * index)
      arrays = dict(np.load(case['batch']))
      # This worker's share of the global batch, as the driver feeds it.
      per = cfg.batch_size // workers
      arrays = {k: v[index * per:(index + 1) * per] for k, v in arrays.items()}
      signature = data.unroll_signature(
          (3,), np.float32, 3, cfg.unroll_length,
          [cfg.lstm_size] * 2 if cfg.use_lstm else [])
      learner = learner_lib.Learner(
          cfg, lambda: networks.make_network(cfg, obs_space, action_space), strategy)
      learner.learner_steps.assign(5)
      chunks = iter([arrays])
      source = data.ChunkSource(lambda: next(chunks, None), None)
      dist = data.distribute(strategy, lambda: data.build_dataset(
          source, signature, batch_size=per,
          num_replicas=distribute.local_replicas(strategy)))
      w0 = learner.get_weights()
      diags = learner.step(next(iter(dist)))
      out[name] = dict(
          w0=[w.tolist() for w in w0],
          weights=[w.tolist() for w in learner.get_weights()],
          diags={k: float(v) for k, v in diags.items()},
          counters=[int(learner.learner_steps.numpy()),
                    int(learner.consumed_frames.numpy()),
                    int(learner.trained_frames.numpy())])
    print('RESULT ' + json.dumps(out), flush=True)
""")


@pytest.mark.e2e
def test_two_workers_give_the_update_of_two_devices(tmp_path):
  """The tower invariant across processes: 2 workers x 1 device (127.0.0.1)
  apply the same update as 1 worker x 2 devices on the same batch."""
  import learner_test  # pylint: disable=g-import-not-at-top
  specs = {
      # PopArt's statistics and the mean's count from the whole batch, one clip.
      'popart_mean': dict(optimizer='adam', learning_rate=0.01, grad_clip=1e-3,
                          popart=True, popart_beta=0.3, loss_reduction='mean'),
      'rmsprop_lstm': dict(optimizer='rmsprop', learning_rate=0.05, grad_clip=0.5,
                           use_lstm=True, entropy_cost=0.05),
  }
  cases = {}
  for i, (name, kw) in enumerate(specs.items()):
    cfg = learner_test._config(**kw)  # pylint: disable=protected-access
    batch = learner_test.make_batch(
        seed=20 + i, lstm_size=cfg.lstm_size if cfg.use_lstm else 0)
    np.savez(tmp_path / f'{name}.npz', **batch)
    cases[name] = dict(config=cfg.to_dict(), batch=str(tmp_path / f'{name}.npz'))
  (tmp_path / 'cases.json').write_text(json.dumps(cases))
  script = tmp_path / 'workers_check.py'
  script.write_text(_WORKERS_SCRIPT)
  env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2')
  env.pop('TF_CONFIG', None)
  ports = distribute.free_local_ports(2)
  workers = [f'127.0.0.1:{p}' for p in ports]
  procs = []
  try:
    for i in range(2):
      procs.append(subprocess.Popen(
          [sys.executable, str(script), 'worker', str(tmp_path / 'cases.json')],
          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=_REPO,
          env=dict(env, TF_CONFIG=_tf_config(workers, i))))
    devices = subprocess.run(
        [sys.executable, str(script), 'devices', str(tmp_path / 'cases.json')],
        capture_output=True, text=True, env=env, cwd=_REPO, timeout=120,
        check=False)
    outputs = [p.communicate(timeout=120) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()

  def result(stdout, stderr, code):
    lines = [l for l in stdout.splitlines() if l.startswith('RESULT ')]
    assert code == 0 and lines, stdout[-2000:] + stderr[-4000:]
    return json.loads(lines[-1][len('RESULT '):])
  ref = result(devices.stdout, devices.stderr, devices.returncode)
  runs = [result(o, e, p.returncode) for (o, e), p in zip(outputs, procs)]
  assert (ref['replicas'], ref['local'], ref['workers']) == (2, 2, 1)
  for r in runs:
    assert (r['replicas'], r['local'], r['workers']) == (2, 1, 2)
    assert r['sum'] == [3.0, 20.0]  # Each worker's vector counts once.
  for name in specs:
    one = ref[name]
    for r in runs:
      two = r[name]
      for a, b in zip(one['w0'], two['w0']):  # Worker 0's start, broadcast.
        np.testing.assert_array_equal(np.array(a), np.array(b))
      moved = max(np.max(np.abs(np.array(a) - np.array(b)))
                  for a, b in zip(one['weights'], one['w0']))
      assert moved > 1e-4, name
      for a, b in zip(one['weights'], two['weights']):
        np.testing.assert_allclose(np.array(b), np.array(a), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
      assert set(one['diags']) == set(two['diags'])
      for k in one['diags']:
        np.testing.assert_allclose(two['diags'][k], one['diags'][k], rtol=1e-5,
                                   atol=1e-5, err_msg=f'{name}: {k}')
      assert two['diags']['grad_norm'] > specs[name]['grad_clip']  # Clipped.
      # Lags 0, 2, 1, 4: the max is in worker 1's half, the sum over both.
      assert two['diags']['policy_lag_max'] == 4
      assert two['diags']['policy_lag_sum'] == 7
      assert two['counters'] == one['counters'] == [6, 2 * 5, 4 * 5]


def test_config_fingerprint_covers_learning_fields_not_per_worker_ones():
  base = config_lib.Config()
  fp = distribute.config_fingerprint(base)
  assert '--learning_rate' in fp and '--grad_clip' in fp and '--seed' in fp
  assert not {f'--{f}' for f in distribute.PER_WORKER_FIELDS} & set(fp)
  assert distribute.config_fingerprint(base.replace(logdir='/elsewhere')) == fp
  other = distribute.config_fingerprint(base.replace(grad_clip=base.grad_clip * 2))
  assert [k for k in fp if fp[k] != other[k]] == ['--grad_clip']
  assert all(0 <= v < 2**24 for v in fp.values())


def test_workers_disagree_on_names_what_differs_on_every_worker():
  """Three workers as threads; the all-reduce is a barrier-backed sum."""
  values = [{'a': 5, 'b': 7, 'c': 2**23}, {'a': 5, 'b': 8, 'c': 2**23},
            {'a': 5, 'b': 7, 'c': 2**23}]
  barrier = threading.Barrier(3)
  slots = [None] * 3

  def sum_fn_for(i):
    def sum_fn(x):
      slots[i] = np.asarray(x, np.float64)
      barrier.wait()
      total = np.sum(slots, axis=0)
      barrier.wait()  # Everyone read the sum before the next call writes.
      return total
    return sum_fn

  results = [None] * 3

  def worker(i):
    results[i] = distribute.workers_disagree_on(sum_fn_for(i), values[i], 3)
  threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=10)
  assert results == [['b'], ['b'], ['b']]
  values[1]['b'] = 7  # All agree.
  results[:] = [None] * 3
  threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=10)
  assert results == [[], [], []]
