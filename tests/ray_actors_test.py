"""Tests of impala_tf.ray_actors: the `ray` actor backend.

* In this process, on one local Ray instance (2 CPUs) shared by the module: a Ray
  actor produces exactly the chunks of a thread actor; unrolls are neither lost nor
  duplicated and steps are counted once; weights are put once per version; a
  CartPole run keeps the thread backend's accounting identities; a killed actor
  process is replaced and the run goes on.
* A two-node `ray.cluster_utils.Cluster` (after the local instance is shut down):
  actors placed on the non-head node by a custom resource train; removing that node
  stops the run with a one-line error and an intact final checkpoint.
* `python -m impala_tf.train --actor_backend=ray` in a subprocess, which starts its
  own Ray: every port its processes listen on is bound to the loopback interface,
  and none of them is left after it exits normally, on SIGINT or on SIGTERM.

The actor's own checks, the Ray session and its socket audit have their own tests
(tests/ray_actor_test.py, tests/ray_session_test.py, tests/socket_audit_test.py).
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import ray
from ray import cluster_utils
import tensorflow as tf

from impala_tf import actor as actor_lib
from impala_tf import actor_pool
from impala_tf import driver
from impala_tf import ray_actor
from impala_tf import ray_actors
from impala_tf import ray_session
from impala_tf import socket_audit
from impala_tf import testing

# What the Ray tests share; pytest finds a fixture by its name in this module.
import ray_testing
from ray_testing import local_ray, no_ray  # pylint: disable=unused-import

import helpers

_REPO = str(helpers.REPO)

_config = ray_testing.ray_config
_spaces = ray_testing.spaces
_weights = ray_testing.weights
_rngs = ray_testing.rngs


def _thread_chunks(config, actor_id, weights, n):
  """The first n chunks a thread actor of `config` produces with `weights`."""
  obs_space, action_space = _spaces(config)
  broadcast = actor_lib.ParameterBroadcast()
  broadcast.publish(0, weights)
  act = actor_pool.make_actor(config, actor_id, 0, obs_space, action_space, broadcast,
                              None, lambda e: None, threading.Event())
  gen = act.unrolls()
  try:
    return [next(gen) for _ in range(n)]
  finally:
    act.close()


def test_ray_pool_chunks_equal_thread_chunks_none_lost_or_duplicated(local_ray):
  del local_ray
  config = _config(num_actors=2, learner_queue_size=3)
  weights = _weights(config, seed=5)
  episodes = []
  stop = threading.Event()
  pool = ray_actors.RayActorPool(config, *_spaces(config), episodes.extend,
                                 _rngs(config), stop)
  n = 4
  per_actor = {0: [], 1: []}
  try:
    pool.start(0, weights)
    while min(len(c) for c in per_actor.values()) < n:
      chunk = pool.get_chunk()
      per_actor[int(chunk['unroll_id'][0] >> 40)].append(chunk)
    # A new version: put once for both actors, and it reaches both.
    weights2 = _weights(config, seed=6)
    pool.publish(7, weights2)
    seen_new = set()
    # Until both actors sent a chunk of the new version; bounded by time, not by
    # a count of chunks: on a loaded machine (the suite with -n 3 on 2 cores) one
    # Ray actor may send 40 chunks while the other sends none.
    deadline = time.time() + 120
    while time.time() < deadline:
      chunk = pool.get_chunk()
      actor_id = int(chunk['unroll_id'][0] >> 40)
      per_actor[actor_id].append(chunk)
      if chunk['policy_version'][0] == 7:
        seen_new.add(actor_id)
      if seen_new == {0, 1}:
        break
    assert seen_new == {0, 1}
    assert pool.num_weight_puts == 2  # One per version, not one per actor.
  finally:
    stop.set()
    time.sleep(0.5)
    queued = pool.queue.qsize()
    steps = pool.steps
    pool.stop()
  b, t = config.num_envs_per_actor, config.unroll_length
  read = sum(len(c) for c in per_actor.values())
  # Every answered unroll is either read or still queued: none lost, none twice.
  assert steps == (read + queued) * b * t, (steps, read, queued)
  for actor_id, chunks in per_actor.items():
    ids = np.concatenate([c['unroll_id'] for c in chunks])
    np.testing.assert_array_equal(ids, actor_id * 2**40 + np.arange(len(ids)))
    # The same unrolls a thread actor produces, field by field.
    for got, want in zip(chunks[:n], _thread_chunks(config, actor_id, weights, n)):
      assert set(got) == set(want)
      for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    for prev, nxt in zip(chunks[:-1], chunks[1:]):
      np.testing.assert_array_equal(prev['observation'][:, t], nxt['observation'][:, 0])
  assert episodes and all(e.length > 0 for e in episodes)
  assert pool.restarts == 0 and pool.error is None


def test_actors_act_only_when_the_learner_queue_has_room(local_ray):
  """A slow learner: the chunks it reads were made with recent weights.

  Like thread actors, Ray actors are asked for an unroll only when the queue has
  room, with the latest weights; they do not act ahead with old ones.
  """
  del local_ray
  config = _config(num_actors=2, learner_queue_size=1)
  stop = threading.Event()
  pool = ray_actors.RayActorPool(config, *_spaces(config), lambda e: None,
                                 _rngs(config), stop)
  weights = _weights(config, seed=1)
  lags = []
  try:
    pool.start(0, weights)
    assert pool.get_chunk() is not None  # The actors are up.
    version = 0
    for _ in range(12):
      time.sleep(0.5)  # The learner's step: the actors have long finished.
      chunk = pool.get_chunk()
      lags.append(version - int(chunk['policy_version'][0]))
      version += 1
      pool.publish(version, weights)
  finally:
    stop.set()
    pool.stop()
  # Read at version v: a chunk asked for when the previous read made room (v - 1)
  # or, made at v - 1 too, waiting while the other was read: lag 1 or 2. Acting
  # ahead (two requests per actor, as before) read chunks 4-5 versions old on
  # every read; one late chunk is a stalled actor on a loaded machine (a suite
  # run on 2 cores read one at lag 6 among lags of 0).
  late = [lag for lag in lags[2:] if lag > 2]
  assert len(late) <= 1, lags
  assert np.mean(lags[2:]) <= 1.8, lags


def test_version_mismatch_stops_the_pool_at_once_in_one_line(local_ray,
                                                             monkeypatch):
  del local_ray
  # The driver says it runs another impala_tf than its actors do.
  monkeypatch.setattr(ray_actor, 'local_versions',
                      lambda: {'impala_tf': '0.0.1', 'TensorFlow': tf.__version__})
  config = _config(num_actors=1)
  stop = threading.Event()
  pool = ray_actors.RayActorPool(config, *_spaces(config), lambda e: None,
                                 _rngs(config), stop)
  try:
    pool.start(0, _weights(config, seed=1))
    assert stop.wait(300)
  finally:
    pool.stop()
  message = str(pool.error)
  assert message.startswith('Ray actor 0 on node 127.0.0.1 runs impala_tf '), message
  assert 'but the driver runs impala_tf 0.0.1' in message and '\n' not in message
  assert pool.restarts == 0


def _run_pool_until_it_fails(config, timeout=300):
  stop = threading.Event()
  pool = ray_actors.RayActorPool(config, *_spaces(config), lambda e: None,
                                 _rngs(config), stop)
  try:
    pool.start(0, _weights(config, seed=1))
    assert stop.wait(timeout), 'the pool did not fail'
  finally:
    pool.stop()
  return pool


def test_restart_backoff_doubles_up_to_its_cap():
  assert [ray_actors.backoff_secs(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]


def test_env_error_stops_the_run_with_its_root_cause(local_ray):
  del local_ray
  config = _config(env=testing.faulty_id('raise'), num_actors=1,
                   max_actor_restarts=0)
  pool = _run_pool_until_it_fails(config)
  message = str(pool.error)
  assert '\n' not in message
  # The env's exception, its message, and the innermost frame: the env's raise.
  assert message.startswith(
      'Ray actor 0 failed (RuntimeError: FaultyChainEnv: injected error at step 3 '
      f'(at {testing.__file__}:'), message
  assert (' in step)) and the run already replaced 0 actors, the most '
          '--max_actor_restarts=0 allows') in message, message
  assert pool.restarts == 0


def test_hung_actor_is_replaced_and_restarts_are_bounded(local_ray):
  del local_ray
  # Every env step 3 hangs: each actor hangs in its first unroll.
  config = _config(env=testing.faulty_id('hang'), env_vectorization='sync',
                   num_actors=1, actor_unroll_timeout_secs=3, max_actor_restarts=1)
  pool = _run_pool_until_it_fails(config)
  message = str(pool.error)
  assert message.startswith(
      'Ray actor 0 failed (ActorHungError: no unroll within '
      '--actor_unroll_timeout_secs=3; a hung env step?) and the run already '
      'replaced 1 actors, the most --max_actor_restarts=1 allows'), message
  assert pool.restarts == 1 and len(pool.deaths) == 2 and len(pool.spawns) == 2
  # The replacement was started after the backoff, not at once.
  assert pool.spawns[1][1] - pool.deaths[0][1] >= ray_actors.RESTART_BACKOFF_SECS


@pytest.mark.e2e
def test_actors_that_do_not_fit_stop_the_run_in_one_line(local_ray, tmp_path):
  del local_ray  # 2 CPUs: three actors of one CPU each do not fit.
  config = _config(str(tmp_path), num_actors=3, ray_placement_timeout_secs=2)
  start = time.monotonic()
  with pytest.raises(driver.TrainingError) as info:
    driver.train(config)
  message = str(info.value)
  assert message.startswith('--num_actors=3 actors with --ray_actor_resources=')
  assert ('need CPU=3, but the Ray cluster did not have them available within '
          '--ray_placement_timeout_secs=2 (available of total: CPU=2 of 2)') in message
  assert '\n' not in message
  assert time.monotonic() - start < 120
  assert ray.is_initialized()  # A Ray the run did not start is left running.
  assert ray.available_resources().get('CPU') == 2  # Nothing left reserved.


@ray.remote(num_cpus=1)
class _Busy:
  """Holds one CPU of the cluster: another job's actor."""

  def ping(self):
    return 1


def test_start_waits_for_busy_resources_saying_what_for(local_ray, monkeypatch):
  del local_ray
  monkeypatch.setattr(ray_actors, '_PLACEMENT_LOG_SECS', 0.5, raising=False)
  said = []
  monkeypatch.setattr(ray_actors.logging, 'info',
                      lambda fmt, *args: said.append(fmt % args))
  busy = [_Busy.remote() for _ in range(2)]  # Both CPUs in use.
  assert ray.get([b.ping.remote() for b in busy], timeout=120) == [1, 1]
  config = _config(num_actors=1)  # Default --ray_placement_timeout_secs.
  stop = threading.Event()
  pool = ray_actors.RayActorPool(config, *_spaces(config), lambda e: None,
                                 _rngs(config), stop)
  started = threading.Thread(target=pool.start, args=(0, _weights(config, 1)),
                             daemon=True)
  try:
    started.start()
    started.join(4)
    assert started.is_alive(), 'started with no CPU available'
    assert said and said[-1].startswith(
        'Waiting for the Ray cluster: --num_actors=1 actors with '
        '--ray_actor_resources={"CPU": 1.0} need CPU=1 (available of total: '
        'CPU=0 of 2); up to '), said
    ray.kill(busy.pop())  # The other job gives a CPU back.
    started.join(60)
    assert not started.is_alive()
    assert pool.error is None
  finally:
    stop.set()
    started.join(30)
    pool.stop()
    for b in busy:
      ray.kill(b)


_read_metrics = helpers.read_metrics


def _checkpoint_counters(logdir):
  path = tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
  assert path is not None
  reader = tf.train.load_checkpoint(path)
  out = {}
  for name in reader.get_variable_to_shape_map():
    for counter in ('learner_steps', 'trained_frames', 'consumed_frames',
                    'replayed_frames'):
      if name.startswith(counter + '/') and 'VARIABLE_VALUE' in name:
        out[counter] = int(reader.get_tensor(name))
  return out


def _check_identities(logdir, config):
  lines = _read_metrics(logdir)
  final = lines[-1]
  assert final['final'] is True
  for m in lines:
    assert m['trained_frames'] == m['learner_steps'] * config.batch_size * \
        config.unroll_length, m
    assert m['consumed_frames'] <= m['env_frames'], m
    assert 0 <= m['learner_queue_size'] <= config.learner_queue_size, m
  for k in ('env_frames', 'trained_frames', 'consumed_frames', 'learner_steps'):
    values = [m[k] for m in lines]
    assert values == sorted(values), k
  assert final['trained_frames'] == (
      final['consumed_frames'] + final['replayed_frames']) * config.num_sgd_iter
  assert final['learner_steps'] % (config.num_sgd_iter *
                                   config.minibatch_buffer_size) == 0
  counters = _checkpoint_counters(logdir)
  for k, v in counters.items():
    assert v == final[k], (k, v, final)
  return final


@pytest.mark.e2e
def test_cartpole_run_keeps_the_accounting_identities(local_ray, tmp_path):
  del local_ray
  config = _config(str(tmp_path), replay_proportion=0.5, replay_buffer_num_slots=8,
                   num_sgd_iter=2, minibatch_buffer_size=2,
                   num_data_loader_buffers=2, total_environment_frames=3000)
  result = driver.train(config)
  final = _check_identities(str(tmp_path), config)
  assert result.metrics['env_frames'] == final['env_frames']
  assert final['env_frames'] >= config.total_environment_frames
  # Back-pressure: the actors ran only a bounded distance ahead of the learner.
  assert final['env_frames'] <= config.total_environment_frames + 2000, final
  assert final['replayed_frames'] > 0 and final['consumed_frames'] > 0
  assert final['episodes'] > 0 and final['actor_restarts'] == 0
  assert os.path.isdir(os.path.join(str(tmp_path), 'saved_policy'))


def _processes():
  """pid -> command line of every process."""
  out = {}
  for d in os.listdir('/proc'):
    if d.isdigit():
      try:
        with open(f'/proc/{d}/cmdline', 'rb') as f:
          out[int(d)] = f.read().replace(b'\0', b' ').decode(errors='replace')
      except OSError:
        pass
  return out


def _start_time(pid):
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return int(f.read().rsplit(')', 1)[1].split()[19])
  except (OSError, ValueError, IndexError):
    return -1


@pytest.mark.e2e
def test_killed_actor_process_is_replaced_and_the_run_goes_on(local_ray, tmp_path):
  del local_ray
  config = _config(str(tmp_path), total_environment_frames=10_000_000)
  stop = threading.Event()
  killed = []
  after_kill = []

  def on_metrics(m):
    if not killed and m['learner_steps'] > 0:
      cmds = _processes()
      # Actors of this process's Ray (its raylet is our child), newest first: not
      # an earlier test's actor, nor one of another test process.
      pids = [p for p in _descendants(os.getpid())
              if cmds.get(p, '').startswith('ray::ImpalaActor')]
      if not pids:  # Its process title not set yet (a loaded machine): next line.
        return
      newest = max(pids, key=_start_time)
      os.kill(newest, signal.SIGKILL)
      killed.append((newest, m['env_frames']))
    elif killed and m['actor_restarts'] >= 1:
      after_kill.append(m)
      # Both actors produce again: wait for frames well past the kill.
      if m['env_frames'] > killed[0][1] + 400 and len(after_kill) >= 3:
        stop.set()

  watchdog = threading.Timer(480, stop.set)
  watchdog.start()
  try:
    result = driver.train(config, stop_event=stop, on_metrics=on_metrics)
  finally:
    watchdog.cancel()
  assert killed
  final = _check_identities(str(tmp_path), config)
  assert final['actor_restarts'] >= 1, final
  assert result.interrupted and final['env_frames'] > killed[0][1] + 400


# --- Two-node cluster ------------------------------------------------------------


@pytest.fixture
def two_nodes():
  """A head node without actor resources and a node with resource actor_node."""
  if ray.is_initialized():
    ray.shutdown()  # The module's local instance (its fixture's close is a no-op).
  with ray_session.loopback_only():  # Keep the test's ports off the network too.
    cluster = cluster_utils.Cluster(initialize_head=True,
                                    head_node_args={'num_cpus': 1})
    node = cluster.add_node(num_cpus=2, resources={'actor_node': 2})
    ray.init(address=cluster.address)
  cluster.wait_for_nodes()
  yield cluster, node
  ray.shutdown()
  cluster.shutdown()


@pytest.mark.e2e
def test_cluster_actors_on_the_other_node_and_node_loss(two_nodes, tmp_path):
  cluster, node = two_nodes
  config = _config(str(tmp_path), ray_address=cluster.address,
                   ray_actor_resources='{"CPU": 1, "actor_node": 1}',
                   total_environment_frames=10_000_000,
                   checkpoint_interval_secs=0.5)
  removed = []

  def on_metrics(m):
    if removed or m['learner_steps'] < 4:
      return
    # Both actors hold the only node with actor_node.
    assert ray.available_resources().get('actor_node', 0) == 0
    assert tf.train.latest_checkpoint(os.path.join(str(tmp_path), 'checkpoints'))
    removed.append(m)
    cluster.remove_node(node)

  with pytest.raises(driver.TrainingError) as info:
    driver.train(config, on_metrics=on_metrics)
  assert removed, 'the run did not train before the node was removed'
  message = str(info.value)
  assert '\n' not in message
  assert '--ray_actor_resources=' in message and 'actor_node' in message, message
  final = _read_metrics(str(tmp_path))[-1]
  assert final['final'] is True and final['learner_steps'] >= 4
  counters = _checkpoint_counters(str(tmp_path))
  assert counters['learner_steps'] == final['learner_steps']


_SHIPPED_ENV = """
import gymnasium as gym
from gymnasium.envs.classic_control import cartpole
gym.register('I20Shipped-v0', entry_point=cartpole.CartPoleEnv, max_episode_steps=50)
"""


def test_runtime_env_ships_code_the_actors_node_lacks(no_ray, tmp_path,
                                                      monkeypatch):
  del no_ray
  # An env module in a directory only the driver has on its path.
  code = tmp_path / 'shipped'
  code.mkdir()
  (code / 'i20_shipped.py').write_text(_SHIPPED_ENV, encoding='utf-8')
  monkeypatch.syspath_prepend(str(code))
  config = _config(env='i20_shipped:I20Shipped-v0', num_actors=1,
                   ray_actor_resources='{"CPU": 0.5}',
                   max_actor_restarts=0,
                   ray_runtime_env=json.dumps({'working_dir': str(code)}))
  stop = threading.Event()
  pool = ray_actors.RayActorPool(config, *_spaces(config), lambda e: None,
                                 _rngs(config), stop)
  try:
    pool.start(0, _weights(config, seed=1))
    chunk = pool.get_chunk()
  finally:
    stop.set()
    pool.stop()
  assert pool.error is None, pool.error
  assert chunk is not None and chunk['reward'].shape == (4, 6)


# --- The command line starts and stops its own Ray --------------------------------


_descendants = helpers.descendants


def _listening():
  """socket inode -> local address (hex, no port) of every listening TCP socket."""
  return {inode: address.rsplit(':', 1)[0]
          for inode, address in socket_audit.listening_sockets().items()}


_LOOPBACK = ('0100007F',  # 127.0.0.1 (IPv4 table, little-endian)
             '0000000000000000FFFF00000100007F',  # ::ffff:127.0.0.1
             '00000000000000000000000001000000')  # ::1


def _sockets_of(pid, listening):
  """Local addresses (hex, no port) of the listening sockets process `pid` holds."""
  return [listening[i] for i in socket_audit.socket_inodes(pid) if i in listening]


class _Watch:
  """Samples a process tree: its processes and their listening sockets."""

  def __init__(self, proc):
    self.proc = proc
    self.pids = {}  # pid -> latest command line
    self._started = {}  # pid -> start time (tells a reused pid apart)
    self.addresses = set()
    self.saw_actor = threading.Event()  # A Ray actor process was sampled.
    self._thread = threading.Thread(target=self._run, daemon=True)
    self._thread.start()

  def _run(self):
    while self.proc.poll() is None:
      listening = _listening()
      cmds = _processes()
      for pid in _descendants(self.proc.pid):
        if pid in cmds:
          self.pids[pid] = cmds[pid]
          self._started.setdefault(pid, _start_time(pid))
        self.addresses.update(_sockets_of(pid, listening))
        if cmds.get(pid, '').startswith('ray::ImpalaActor'):
          self.saw_actor.set()
      time.sleep(0.5)

  def join(self):
    self._thread.join(timeout=10)

  def left_over(self, grace=20.0):
    """Recorded descendants still running after `grace` s: pid -> command line."""
    deadline = time.time() + grace
    while True:
      alive = {p: self.pids[p] for p, t in self._started.items()
               if _start_time(p) == t and not _zombie(p)}
      if not alive or time.time() > deadline:
        return alive
      time.sleep(0.5)


def _zombie(pid):
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[0] == 'Z'
  except OSError:
    return True


# A line of TensorFlow's native (absl C++) logging, as a Ray actor prints it, e.g.
# `(ImpalaActor pid=7) I0000 00:00:1.0  7 cpu_feature_guard.cc:210] This ...`.
_TF_NATIVE_LINE_RE = re.compile(r'\.cc:\d+\] ')

_CLI_FLAGS = ['--actor_backend=ray', '--num_actors=2', '--num_envs_per_actor=4',
              '--unroll_length=5', '--batch_size=4', '--mlp_hidden_sizes=16',
              '--log_interval_secs=0.5', '--learner_queue_timeout=300']


def _start_cli(logdir, flags, quiet=False):
  """Starts a training run; `quiet`: with a user's defaults (no TF_CPP_MIN_LOG_LEVEL),
  so the run's quiet start applies."""
  env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2')
  env.pop('RAY_ADDRESS', None)
  if quiet:
    env.pop('TF_CPP_MIN_LOG_LEVEL')
    env.pop('IMPALA_TF_QUIET', None)
  cmd = [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}'] + flags
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=env, cwd=_REPO)


@pytest.mark.e2e
@pytest.mark.parametrize('how', ['normal', 'SIGINT', 'SIGTERM'])
def test_cli_ray_listens_on_loopback_and_leaves_no_process(tmp_path, how):
  logdir = str(tmp_path / 'run')
  total = 1500 if how == 'normal' else 10_000_000
  proc = _start_cli(logdir, _CLI_FLAGS + [f'--total_environment_frames={total}'],
                    quiet=how == 'normal')
  watch = _Watch(proc)
  try:
    if how != 'normal':
      deadline = time.time() + 300
      metrics = os.path.join(logdir, 'metrics.jsonl')
      while time.time() < deadline and proc.poll() is None:
        if os.path.exists(metrics) and os.path.getsize(metrics) > 0:
          break
        time.sleep(0.5)
      watch.saw_actor.wait(timeout=60)  # Sample the running tree first.
      time.sleep(1.0)
      proc.send_signal(getattr(signal, how))
    out, _ = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  watch.join()
  assert proc.returncode == 0, out[-4000:]
  assert 'impala_tf.train: done:' in out, out[-4000:]
  if how == 'normal':  # Quiet start: the actor processes' TensorFlow lines too.
    assert 'cuInit' not in out and 'absl::InitializeLog' not in out, out[-4000:]
    # TensorFlow's native lines (absl: `... name.cc:123] ...`), not Ray's own (its
    # raylet warns `(raylet) file_system_monitor.cc:116: ...` when the disk is full).
    assert not [l for l in out.splitlines() if _TF_NATIVE_LINE_RE.search(l)], out[-4000:]
  ray_pids = [p for p, c in watch.pids.items() if 'ray' in c]
  assert len(ray_pids) >= 3, watch.pids  # gcs_server, raylet, the actors, ...
  assert watch.saw_actor.is_set(), watch.pids
  assert len(watch.addresses) >= 2, watch.addresses
  assert all(a in _LOOPBACK for a in watch.addresses), watch.addresses
  assert watch.left_over() == {}
  final = _read_metrics(logdir)[-1]
  assert final['final'] is True and final['interrupted'] is (how != 'normal')
  assert tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
