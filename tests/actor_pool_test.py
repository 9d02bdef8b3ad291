"""Tests of impala_tf.actor_pool: the pool interface and its thread backend.

The Ray backend has its own tests (tests/ray_actors_test.py).
"""

import logging
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from impala_tf import actor_pool
from impala_tf import data
from impala_tf import environments
from impala_tf import networks
from impala_tf import testing

CRASH_ID = 'ImpalaPoolCrash-v0'


class _CrashEnv(testing.ChainEnv):
  """The chain env, whose step raises after 3 steps."""

  def step(self, action):
    if self._t >= 3:
      raise RuntimeError('emulator crashed')
    return super().step(action)


if CRASH_ID not in gym.registry:
  gym.register(CRASH_ID, entry_point=_CrashEnv)


def _pool(**overrides):
  config = testing.tiny_config(**dict(dict(num_actors=2), **overrides))
  obs_space, action_space = environments.env_spaces(testing.CHAIN_ID)
  episodes = []
  stop = threading.Event()
  rngs = [tf.random.Generator.from_seed(actor_pool.actor_rng_seed(config, i))
          for i in range(config.num_actors)]
  pool = actor_pool.ThreadActorPool(config, obs_space, action_space, episodes.extend,
                                    rngs, stop)
  net = networks.make_network(config, obs_space, action_space)
  return pool, config, episodes, stop, [v.numpy() for v in net.variables]


def _settle(ready):
  """Waits (up to 60 s) until `ready()`, then 1 s more for any stray unroll."""
  deadline = time.monotonic() + 60
  while not ready() and time.monotonic() < deadline:
    time.sleep(0.05)
  time.sleep(1.0)


def test_thread_pool_chunks_steps_episodes_and_stop():
  pool, config, episodes, stop, weights = _pool()
  pool.start(3, weights)
  # Under load one actor can fill the queue before the other has started: read
  # until both have delivered (bounded, so a dead actor fails the test).
  chunks = []
  while len(chunks) < 8 or len({c['unroll_id'][0] >> 40 for c in chunks}) < 2:
    assert len(chunks) < 400, 'actor 1 or 0 never delivered an unroll'
    chunks.append(pool.get_chunk())
  b, t = config.num_envs_per_actor, config.unroll_length
  for actor_id in (0, 1):
    ids = np.concatenate([c['unroll_id'] for c in chunks
                          if c['unroll_id'][0] >> 40 == actor_id])
    # Each actor's unrolls arrive in order, none skipped or repeated.
    np.testing.assert_array_equal(ids, actor_id * 2**40 + np.arange(len(ids)))
  assert all((c['policy_version'] == 3).all() for c in chunks)
  assert pool.steps >= len(chunks) * b * t
  assert episodes and {e.episode_return for e in episodes} == {8.0}
  assert pool.queue.maxsize == config.learner_queue_size
  pool.publish(4, weights)
  assert any((pool.get_chunk()['policy_version'] == 4).all() for _ in range(12))
  pool.stop()
  assert stop.is_set() and pool.get_chunk() is None
  steps = pool.steps
  time.sleep(0.5)  # Long enough for a running actor to add several unrolls.
  assert pool.steps == steps  # Stopped: nothing steps any more.
  assert pool.restarts == 0 and pool.error is None


def test_thread_actor_waits_for_room_before_its_next_unroll():
  pool, config, _, _, weights = _pool(num_actors=1, learner_queue_size=1)
  b, t = config.num_envs_per_actor, config.unroll_length
  pool.start(0, weights)
  try:
    _settle(lambda: pool.queue.qsize() >= 1)
    # One unroll queued and no second one stepped: the actor acts only when there is
    # room (it would otherwise hold a finished unroll, one chunk older, until then).
    assert pool.queue.qsize() == 1 and pool.steps == b * t
    pool.publish(5, weights)
    assert pool.get_chunk()['policy_version'].tolist() == [0] * b
    # The next unroll starts after the take, with the weights published before it.
    assert (pool.get_chunk()['policy_version'] == 5).all()
  finally:
    pool.stop()


@pytest.mark.parametrize('claims,collected', [(True, 1), (False, 2)])
def test_two_thread_actors_and_one_queue_slot(claims, collected):
  pool, config, _, _, weights = _pool(num_actors=2, learner_queue_size=1,
                                      claim_queue_slots=claims)
  b = config.num_envs_per_actor
  chunk_steps = b * config.unroll_length
  pool.start(0, weights)
  try:
    _settle(lambda: pool.steps >= collected * chunk_steps)
    # One chunk queued. Without claims (the default) both actors saw the room, so
    # the other waits, finished, in its actor's hands; with claims no other chunk
    # is collected.
    assert pool.queue.qsize() == 1 and pool.queue.claims == 0
    assert pool.steps == collected * chunk_steps
    for taken in range(2 if claims else 0):
      pool.publish(taken + 1, weights)
      assert pool.get_chunk()['policy_version'].tolist() == [taken] * b
      # Each take lets exactly one actor collect one chunk, with the newest weights.
      _settle(lambda: pool.queue.qsize() >= 1)
      assert pool.queue.qsize() == 1 and pool.steps == (taken + 2) * chunk_steps
  finally:
    pool.stop()


def test_thread_pool_restarts_a_dying_actor_then_fails_in_one_line():
  pool, _, _, stop, weights = _pool(env=CRASH_ID, num_actors=1)
  pool.start(0, weights)
  assert stop.wait(timeout=60)  # The pool stops the run ...
  pool.stop()
  assert isinstance(pool.error, actor_pool.ActorPoolError)
  message = str(pool.error)
  # ... after MAX_RESTARTS deaths in a minute, saying so in one line.
  assert pool.restarts == actor_pool.MAX_RESTARTS - 1
  assert message.startswith(f'actor 0 died {actor_pool.MAX_RESTARTS} times in 60 s')
  assert 'emulator crashed' in message and '\n' not in message


def test_restarts_log_one_line_each_and_the_traceback_once(caplog):
  pool, _, _, stop, weights = _pool(env=CRASH_ID, num_actors=1)
  with caplog.at_level(logging.ERROR):
    pool.start(0, weights)
    assert stop.wait(timeout=60)
    pool.stop()
  records = [r.getMessage() for r in caplog.records]
  died = [m for m in records if m.startswith('actor 0 died')]
  assert len(died) == actor_pool.MAX_RESTARTS, records
  assert all('\n' not in m for m in died), died
  tracebacks = [m for m in records if 'Traceback (most recent call last)' in m]
  assert len(tracebacks) == 1, records  # Five deaths, one distinct error.
  assert 'emulator crashed' in tracebacks[0]


def test_first_time_tells_errors_apart_numbers_aside():
  pool = _pool()[0]
  assert pool.first_time(RuntimeError('env 0 failed at step 3'))
  assert not pool.first_time(RuntimeError('env 1 failed at step 7'))
  assert pool.first_time(ValueError('env 0 failed at step 3'))
  assert pool.first_time(RuntimeError('something else'))


def test_restart_budget_counts_deaths_in_the_window():
  budget = actor_pool.RestartBudget(max_deaths=3, window_secs=10.0)
  assert budget.died(now=0.0) and budget.died(now=1.0)
  assert not budget.died(now=2.0)  # The third death within 10 s.
  budget = actor_pool.RestartBudget(max_deaths=3, window_secs=10.0)
  assert budget.died(now=0.0) and budget.died(now=1.0)
  assert budget.died(now=11.5)  # The first death left the window.


def test_actor_seeds_are_distinct_and_fresh_after_a_restart():
  config = testing.tiny_config(num_actors=3, num_envs_per_actor=4, seed=7)
  seeds = {(a, r): actor_pool.env_seed(config, a, r, 0)
           for a in range(3) for r in range(3)}
  # Env i of an actor uses seed + i: the ranges of all (actor, restart) are disjoint.
  envs = [s + i for s in seeds.values() for i in range(4)]
  assert len(set(envs)) == len(envs)
  assert seeds[(1, 0)] == 7 * 1_000_003 + 4
  # A resumed run draws seeds no earlier run of the same config used.
  assert actor_pool.env_seed(config, 1, 0, 1) not in seeds.values()
  assert actor_pool.actor_rng_seed(config, 2) == 7 * 1_000_003 + 2


def test_make_actor_builds_the_configured_actor():
  config = testing.tiny_config(num_envs_per_actor=3, unroll_length=4)
  obs_space, action_space = environments.env_spaces(config.env)
  from impala_tf import actor as actor_lib  # pylint: disable=g-import-not-at-top
  broadcast = actor_lib.ParameterBroadcast()
  act = actor_pool.make_actor(config, 1, 0, obs_space, action_space, broadcast,
                              None, lambda e: None, threading.Event())
  try:
    chunk = next(act.unrolls())
  finally:
    act.close()
  assert chunk['observation'].shape == (3, 5, 3)
  np.testing.assert_array_equal(chunk['unroll_id'], 2**40 + np.arange(3))


@pytest.mark.parametrize('mode', ['unroll', 'step'])
def test_make_actor_passes_the_refresh_mode(mode):
  # Thread and process actors are built here (tests/actor_test.py checks what
  # each mode does with the weights).
  config = testing.tiny_config(actor_refresh=mode)
  obs_space, action_space = environments.env_spaces(config.env)
  from impala_tf import actor as actor_lib  # pylint: disable=g-import-not-at-top
  act = actor_pool.make_actor(config, 0, 0, obs_space, action_space,
                              actor_lib.ParameterBroadcast(), None, lambda e: None,
                              threading.Event())
  act.close()
  assert act._refresh_every_step == (mode == 'step')  # pylint: disable=protected-access


class _FoldProbe:
  """An actor that dies after 5 steps; when its steps are folded into the
  thread's total (`steps = 0`), another thread reads the total."""

  def __init__(self, stop):
    self._steps = 5
    self._stop = stop
    self.thread = None
    self.seen = []

  @property
  def steps(self):
    return self._steps

  @steps.setter
  def steps(self, value):
    if value == 0 and self._steps:
      reader = threading.Thread(target=lambda: self.seen.append(self.thread.steps))
      reader.start()
      reader.join(timeout=0.5)  # Blocks for the whole fold, if it is locked.
      self.reader = reader
    self._steps = value

  def run(self):
    self._stop.set()
    raise RuntimeError('died')

  def close(self):
    pass


def test_steps_read_during_a_fold_are_counted_once():
  stop = threading.Event()
  probe = _FoldProbe(stop)

  class FakePool:
    stop_event = stop
    config = testing.tiny_config()
    queue = data.LearnerQueue(1, 5.0, stop)

    def build(self, actor_id, restarts):
      del actor_id, restarts
      return probe

  thread = actor_pool._ActorThread(FakePool(), 0)  # pylint: disable=protected-access
  probe.thread = thread
  thread.run()  # In this thread: the actor dies, its 5 steps are folded in.
  probe.reader.join(timeout=5)
  assert probe.seen == [5]  # Not 10: steps_done and the actor's both.
  assert thread.steps == 5


def test_make_actor_closes_its_env_when_the_network_build_fails(monkeypatch):
  config = testing.tiny_config()
  obs_space, action_space = environments.env_spaces(config.env)
  made = []
  real_make = environments.make_vector_env

  def make_vector_env(*args, **kwargs):
    env = real_make(*args, **kwargs)
    made.append(env)
    return env

  def broken_network(*unused_args):
    raise ValueError('torso build failed')

  monkeypatch.setattr(environments, 'make_vector_env', make_vector_env)
  monkeypatch.setattr(networks, 'make_network', broken_network)
  from impala_tf import actor as actor_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match='torso build failed'):
    actor_pool.make_actor(config, 0, 0, obs_space, action_space,
                          actor_lib.ParameterBroadcast(), None, lambda e: None,
                          threading.Event())
  assert len(made) == 1 and made[0].closed


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
