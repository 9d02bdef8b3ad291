"""Tests of impala_tf.process_actors: actors as child processes over shared memory."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

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
  pool, _, _, stop, weights = _pool()
  pool.start(0, weights)
  try:
    pool.get_chunk()
    first = _children(pool)[0]
    os.kill(first, signal.SIGKILL)
    deadline = time.time() + 60
    while pool.restarts == 0 and time.time() < deadline:
      pool.get_chunk()
    assert pool.restarts == 1 and pool.error is None and not stop.is_set()
    ids = [pool.get_chunk()['unroll_id'][0] for _ in range(3)]
    assert all(i >> 40 == 0 for i in ids)  # Actor 0 again, acting on.
    pids = _children(pool)
    assert len(pids) == 2 and pids[0] == first
  finally:
    pool.stop()
  assert not [p for p in pids if testing.process_alive(p)]


def test_a_crashing_env_fails_the_pool_in_one_line():
  pool, _, _, stop, weights = _pool(env=testing.faulty_id('raise'))
  pool.start(0, weights)
  assert stop.wait(timeout=120)
  pool.stop()
  assert isinstance(pool.error, actor_pool.ActorPoolError)
  message = str(pool.error)
  assert pool.restarts == actor_pool.MAX_RESTARTS - 1
  assert message.startswith(f'actor 0 died {actor_pool.MAX_RESTARTS} times in 60 s')
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
