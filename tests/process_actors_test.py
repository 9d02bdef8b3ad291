"""Tests of impala_tf.process_actors: actors as child processes over shared memory."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types as types_lib

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import actor as actor_lib
from impala_tf import actor_pool
from impala_tf import data
from impala_tf import environments
from impala_tf import networks
from impala_tf import process_actors
from impala_tf import testing


def _parts(**overrides):
  config = testing.tiny_config(**overrides)
  obs_space, action_space = environments.env_spaces(config.env)
  net = networks.make_network(config, obs_space, action_space)
  rngs = [tf.random.Generator.from_seed(actor_pool.actor_rng_seed(config, i))
          for i in range(config.num_actors)]
  return config, obs_space, action_space, rngs, [v.numpy() for v in net.variables]


def _pool(cls=process_actors.ProcessActorPool, **overrides):
  config, obs_space, action_space, rngs, weights = _parts(**overrides)
  episodes, stop = [], threading.Event()
  pool = cls(config, obs_space, action_space, episodes.extend, rngs, stop)
  return pool, config, episodes, stop, weights


def _blocks(pool):
  names = [c.slots.shm.name for c in pool._blocks.values()]  # pylint: disable=protected-access
  return names + [pool._weights.shm.name]  # pylint: disable=protected-access


def _shm_exists(name):
  return os.path.exists('/dev/shm/' + name.lstrip('/'))


def _children(pool):
  return [c.process.pid for c in pool._blocks.values()]  # pylint: disable=protected-access


@pytest.mark.parametrize('use_lstm', [False, True])
def test_chunk_layout_is_what_an_actor_emits(use_lstm):
  config, obs_space, action_space, rngs, weights = _parts(use_lstm=use_lstm)
  broadcast = actor_lib.ParameterBroadcast()
  broadcast.publish(0, weights)
  chunks = []
  actor = actor_pool.make_actor(config, 0, 0, obs_space, action_space, broadcast,
                                lambda c: chunks.append(c) and False, lambda e: None,
                                threading.Event(), rng=rngs[0])
  try:
    actor.run()
  finally:
    actor.close()
  layout = process_actors.chunk_layout(config, obs_space, action_space)
  assert [k for k, _, _ in layout] == list(chunks[0])
  assert {k: (tuple(v.shape), v.dtype.name) for k, v in chunks[0].items()} == {
      k: (shape, dtype) for k, shape, dtype in layout}


def test_process_pool_gives_the_thread_pools_unrolls_steps_and_episodes():
  chunks = {}
  for cls in (actor_pool.ThreadActorPool, process_actors.ProcessActorPool):
    pool, config, episodes, stop, weights = _pool(cls)
    pool.start(3, weights)
    chunks[cls] = [pool.get_chunk() for _ in range(6)]
    if cls is process_actors.ProcessActorPool:
      pids, blocks = _children(pool), _blocks(pool)
      assert all(map(_shm_exists, blocks))
      assert pool.steps >= 6 * config.num_envs_per_actor * config.unroll_length
      deadline = time.time() + 30
      while not episodes and time.time() < deadline:
        time.sleep(0.05)
      assert episodes and {e.episode_return for e in episodes} == {8.0}
    pool.stop()
    assert stop.is_set() and pool.get_chunk() is None
  threads, processes = chunks.values()
  for a, b in zip(threads, processes):
    assert set(a) == set(b)
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  assert (processes[0]['policy_version'] == 3).all()
  # Stopped: the children are gone and the shared blocks unlinked.
  assert not [p for p in pids if testing.process_alive(p)]
  assert not [b for b in blocks if _shm_exists(b)]
  assert pool.restarts == 0 and pool.error is None


def test_published_weights_reach_the_child_at_an_unroll_boundary():
  pool, _, _, _, weights = _pool(learner_queue_size=1)
  pool.start(0, weights)
  try:
    first = pool.get_chunk()
    assert (first['policy_version'] == 0).all()
    assert np.abs(first['behaviour_logits']).sum() > 0
    pool.publish(7, [np.zeros_like(w) for w in weights])
    later = [pool.get_chunk() for _ in range(4)]
    # With a queue of one chunk the child takes the new weights for the unroll
    # after the one it had finished: every chunk after that acts with them.
    new = [c for c in later if (c['policy_version'] == 7).all()]
    assert len(new) >= 3
    for c in new:
      # Zero weights: logits 0 on every row the new policy acted on (row 0 is the
      # previous unroll's last row).
      np.testing.assert_array_equal(c['behaviour_logits'][:, 1:], 0.0)
  finally:
    pool.stop()


def test_a_killed_child_is_replaced_and_counted():
  pool, _, _, stop, weights = _pool(num_actors=2)
  pool.start(0, weights)
  try:
    pool.get_chunk()
    first = pool._children[1].process.pid  # pylint: disable=protected-access
    os.kill(first, signal.SIGKILL)
    deadline = time.time() + 60
    while (pool._children[1].process.pid == first and  # pylint: disable=protected-access
           time.time() < deadline):
      pool.get_chunk()
    assert pool.restarts == 1 and pool.error is None and not stop.is_set()
    ids = set()
    while len(ids) < 2 and time.time() < deadline:
      ids.add(int(pool.get_chunk()['unroll_id'][0]) >> 40)
    assert ids == {0, 1}  # Actor 1 again, acting next to actor 0.
    pids = _children(pool)
  finally:
    pool.stop()
  assert first not in pids
  assert not [p for p in pids if testing.process_alive(p)]


def test_a_crashing_env_fails_the_pool_in_one_line(monkeypatch):
  # The backoff's own timing is test_replacements_back_off_...'s; here its 1 + 2 +
  # 4 + 8 s before the fifth death would only be waited out.
  monkeypatch.setattr(actor_pool, 'RESTART_BACKOFF_SECS', 0.05)
  pool, _, _, stop, weights = _pool(env=testing.faulty_id('raise'))
  pool.start(0, weights)
  assert stop.wait(timeout=120)
  pool.stop()
  assert isinstance(pool.error, actor_pool.ActorPoolError)
  message = str(pool.error)
  assert pool.restarts == actor_pool.MAX_RESTARTS - 1
  assert message.startswith(f'actor 0 died {actor_pool.MAX_RESTARTS} times in a row '
                            'without finishing an unroll; last error: RuntimeError')
  assert 'injected error' in message and '\n' not in message


def test_a_stalled_child_times_the_learner_out_in_one_line():
  pool, config, _, _, weights = _pool(learner_queue_size=1)
  pool.start(0, weights)
  pid = None
  try:
    pool.get_chunk()  # The child has started (within the default timeout).
    pool.config = config.replace(learner_queue_timeout=2.0)
    pid = _children(pool)[0]
    os.kill(pid, signal.SIGSTOP)
    start = time.time()
    with pytest.raises(data.LearnerQueueTimeout,
                       match=r'^no unroll reached the learner for 2 s '
                             r'\(--learner_queue_timeout\)'):
      for _ in range(2):  # The first may get the one chunk it had finished.
        pool.get_chunk()
    assert time.time() - start < 10
  finally:
    if pid is not None:
      os.kill(pid, signal.SIGCONT)
    pool.stop()
  assert not testing.process_alive(pid)


@pytest.mark.e2e
def test_cli_run_on_process_actors_leaves_its_files_and_no_process(tmp_path):
  logdir = str(tmp_path / 'run')
  proc = subprocess.run(
      [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}',
       '--env=' + testing.CHAIN_ID, '--actor_backend=processes', '--num_actors=2',
       '--num_envs_per_actor=4', '--unroll_length=5', '--batch_size=4',
       '--mlp_hidden_sizes=16', '--total_environment_frames=2000',
       '--log_interval_secs=0.5'],
      capture_output=True, text=True, timeout=300, check=False)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out[-4000:]
  assert '2 actor(s) (processes)' in out
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    final = [json.loads(l) for l in f][-1]
  assert final['final'] is True and final['env_frames'] >= 2000
  assert final['episodes'] > 0 and final['actor_restarts'] == 0
  assert tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
  assert not [l for l in out.splitlines() if 'leaked' in l or 'Traceback' in l], out


class _SlowFirstCopy(process_actors.ProcessActorPool):
  """The first loader's copy waits until `release` is set, then records whether
  its slot still holds the chunk it copied."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.copying, self.release = threading.Event(), threading.Event()
    self.overwritten = None
    self._first = True

  def _copy_out(self, child, slot):
    chunk = super()._copy_out(child, slot)
    if self._first:
      self._first = False
      self.copying.set()
      assert self.release.wait(timeout=120)
      now = super()._copy_out(child, slot)
      self.overwritten = any(not np.array_equal(now[k], chunk[k]) for k in chunk)
    return chunk


def test_two_loaders_copying_at_once_never_see_their_slot_overwritten():
  pool, _, _, _, weights = _pool(_SlowFirstCopy, num_actors=1, learner_queue_size=2)
  pool.start(0, weights)
  try:
    slow = threading.Thread(target=pool.get_chunk)
    slow.start()  # Takes slot 0 and holds it (copying) until released.
    assert pool.copying.wait(timeout=120)
    # The second loader reads slot 1 and hands it back; the child's next chunk
    # must go into slot 1, not into slot 0 (ring order), which is still copied.
    ids = [pool.get_chunk()['unroll_id'][0] for _ in range(2)]
    pool.release.set()
    slow.join(timeout=60)
    assert pool.overwritten is False
    assert ids[0] < ids[1]
  finally:
    pool.release.set()
    pool.stop()


def test_a_dead_childs_block_is_unlinked_once_its_chunks_are_read():
  pool, _, _, _, weights = _pool(num_actors=1)
  pool.start(0, weights)
  try:
    pool.get_chunk()
    dead = pool._children[0]  # pylint: disable=protected-access
    os.kill(dead.process.pid, signal.SIGKILL)
    deadline = time.time() + 60
    while _shm_exists(dead.slots.shm.name) and time.time() < deadline:
      pool.get_chunk()
    assert pool.restarts == 1
    assert not _shm_exists(dead.slots.shm.name)
    assert len(pool._blocks) == 1  # pylint: disable=protected-access
    pool.get_chunk()  # The replacement acts on.
  finally:
    pool.stop()


def _process_tree(pid):
  """`pid`'s descendants (Linux /proc)."""
  out, todo = [], [pid]
  while todo:
    parent = todo.pop()
    for task in os.listdir(f'/proc/{parent}/task'):
      try:
        with open(f'/proc/{parent}/task/{task}/children', encoding='utf-8') as f:
          kids = [int(k) for k in f.read().split()]
      except OSError:
        kids = []
      out += kids
      todo += kids
  return out


def _shm_mapped(pids):
  names = set()
  for pid in pids:
    try:
      with open(f'/proc/{pid}/maps', encoding='utf-8') as f:
        names |= {l.split()[-1] for l in f if '/dev/shm/' in l}
    except OSError:
      pass
  return names


@pytest.mark.e2e
def test_children_of_a_trainer_killed_with_sigkill_exit_and_free_dev_shm(tmp_path):
  logdir = str(tmp_path / 'run')
  proc = subprocess.Popen(
      [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}',
       '--env=' + testing.CHAIN_ID, '--actor_backend=processes', '--num_actors=2',
       '--num_envs_per_actor=4', '--unroll_length=5', '--batch_size=4',
       '--mlp_hidden_sizes=16', '--total_environment_frames=100000000',
       '--log_interval_secs=0.5'],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    metrics = os.path.join(logdir, 'metrics.jsonl')
    deadline = time.time() + 240
    trained = False
    while not trained and time.time() < deadline and proc.poll() is None:
      time.sleep(0.5)
      if os.path.exists(metrics):
        with open(metrics, encoding='utf-8') as f:
          trained = any(json.loads(l).get('learner_steps', 0) > 0 for l in f)
    assert trained, 'the run did not train'
    children = _process_tree(proc.pid)
    blocks = _shm_mapped([proc.pid] + children)
    assert len(children) >= 2 and blocks
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(10)
    assert not [p for p in children if testing.process_alive(p)]
    assert not [b for b in blocks if os.path.exists(b)]
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def _reader_of(writer, alive):
  return process_actors._SharedWeights(  # pylint: disable=protected-access
      writer.shapes, 1, name=writer.shm.name, alive=alive)


def test_a_weights_copy_that_does_not_match_the_writers_crc_is_not_used():
  writer = process_actors._SharedWeights([(3,), (2, 2)], 1)  # pylint: disable=protected-access
  weights = [np.arange(3, dtype=np.float32), np.ones((2, 2), np.float32)]
  writer.publish(5, weights)
  calls = []
  reader = _reader_of(writer, alive=lambda: calls.append(1) or len(calls) < 3)
  try:
    version, got = reader.latest()
    assert version == 5 and not calls
    for a, b in zip(got, weights):
      np.testing.assert_array_equal(a, b)
    # A store the reader saw before the writer's others (a weakly ordered CPU):
    # the sequence number is even but the content is not what was published.
    writer._weights[0][1] = 7.0  # pylint: disable=protected-access
    assert reader.latest() == (5, None)  # Retried until alive() said stop.
    assert len(calls) == 3
    writer.publish(6, weights)
    assert reader.latest()[0] == 6
  finally:
    reader.close()
    writer.close(unlink=True)


def test_a_weights_reader_gives_up_on_a_writer_that_died_mid_write():
  writer = process_actors._SharedWeights([(4,)], 1)  # pylint: disable=protected-access
  writer.publish(1, [np.zeros(4, np.float32)])
  stop = threading.Event()
  reader = _reader_of(writer, alive=lambda: not stop.is_set())
  writer.header[process_actors._SEQ] += 1  # pylint: disable=protected-access
  out = []
  thread = threading.Thread(target=lambda: out.append(reader.latest()))
  try:
    thread.start()
    thread.join(timeout=0.5)
    assert thread.is_alive()  # Waits while the write may still finish...
    stop.set()
    thread.join(timeout=5)
    assert out == [(1, None)]  # ...and gives up once told to stop.
  finally:
    stop.set()
    thread.join(timeout=5)
    reader.close()
    writer.close(unlink=True)


def test_too_little_dev_shm_fails_in_one_line_before_any_child_starts(monkeypatch):
  with pytest.raises(actor_pool.ActorPoolError,
                     match=r'^--actor_backend=processes needs 2\.0 MiB of shared '
                           r'memory in /x and 1\.0 MiB is free: .*--shm-size'):
    monkeypatch.setattr(process_actors.shutil, 'disk_usage',
                        lambda d: types_lib.SimpleNamespace(free=2**20))
    process_actors.check_shm_space(2 * 2**20, '/x')
  process_actors.check_shm_space(2**20, '/x')  # Enough.
  monkeypatch.setattr(process_actors.shutil, 'disk_usage',
                      lambda d: types_lib.SimpleNamespace(free=0))
  pool, _, _, _, weights = _pool()
  with pytest.raises(actor_pool.ActorPoolError, match='needs .* MiB of shared'):
    pool.start(0, weights)
  assert not pool._blocks and pool._weights is None  # pylint: disable=protected-access
  pool.stop()


def test_children_see_no_gpu_and_the_parent_keeps_its_own(monkeypatch):
  monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0,1')
  pool, _, _, _, weights = _pool()
  pool.start(0, weights)
  try:
    pool.get_chunk()
    with open(f'/proc/{_children(pool)[0]}/environ', 'rb') as f:
      env = dict(v.split(b'=', 1) for v in f.read().split(b'\0') if b'=' in v)
    assert env[b'CUDA_VISIBLE_DEVICES'] == b''
    assert os.environ['CUDA_VISIBLE_DEVICES'] == '0,1'
  finally:
    pool.stop()


def test_replacements_back_off_and_stop_at_max_actor_restarts():
  pool, _, _, stop, weights = _pool(max_actor_restarts=1)
  pool.start(0, weights)
  try:
    pool.get_chunk()
    first = pool._children[0].process.pid  # pylint: disable=protected-access
    os.kill(first, signal.SIGKILL)
    killed = time.monotonic()
    deadline = time.time() + 60
    while (pool._children[0].process.pid == first and  # pylint: disable=protected-access
           time.time() < deadline):
      time.sleep(0.01)
    # The replacement starts after the backoff of a first death in a row.
    assert time.monotonic() - killed >= actor_pool.backoff_secs(1) - 0.05
    pool.get_chunk()  # It acts.
    os.kill(pool._children[0].process.pid, signal.SIGKILL)  # pylint: disable=protected-access
    assert stop.wait(timeout=30)
  finally:
    pool.stop()
  assert pool.restarts == 1
  message = str(pool.error)
  assert message.startswith('actor 0 died (ActorProcessExit: the process exited '
                            'with code -9) and the run already replaced 1 actor '
                            'processes, the most --max_actor_restarts=1 allows'), message
