"""Tests for impala_tf.actor on the deterministic chain env of impala_tf.testing.

ChainEnv: every episode is 8 steps of reward 1, observation [t / 8, 1, -1]. With
NEXT_STEP autoreset the global row sequence of every env is periodic with period 9:
rows 9e (first, reward 0), 9e + 1 .. 9e + 8 (reward 1), row 9e + 8 terminated.
"""

import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import actor as actor_lib
from impala_tf import environments
from impala_tf import networks
from impala_tf import testing
from impala_tf import types

B, T = 3, 5
ROW_FIELDS = ('observation', 'reward', 'terminated', 'truncated', 'first',
              'prev_action', 'action', 'behaviour_logits')


def _net(use_lstm=False, seed=0):
  return networks.AgentNetwork((3,), tf.float32, 2, mlp_hidden_sizes=(8,),
                               use_lstm=use_lstm, lstm_size=4, seed=seed)


def _run(net, num_chunks, env_id=testing.CHAIN_ID, broadcast=None, on_chunk=None,
         actor_id=0):
  """Runs an Actor until it has emitted `num_chunks`; returns (chunks, episodes)."""
  env = environments.make_vector_env(env_id, B, seed=0, vectorization='sync')
  chunks, episodes = [], []

  def emit(chunk):
    chunks.append(chunk)
    if on_chunk is not None:
      on_chunk(len(chunks) - 1)
    return len(chunks) < num_chunks

  act = actor_lib.Actor(actor_id, env, net, broadcast or actor_lib.ParameterBroadcast(),
                        T, emit, episodes.extend, seed=0,
                        stop_event=threading.Event())
  try:
    act.run()
  finally:
    act.close()
  assert len(chunks) == num_chunks
  assert act.steps == B * T * num_chunks
  return chunks, episodes, act


def _rows(chunks, key):
  """Global row sequence `[B, num_chunks * T + 1, ...]` (overlap removed)."""
  parts = [c[key][:, :T] for c in chunks] + [chunks[-1][key][:, T:]]
  return np.concatenate(parts, axis=1)


def _logits(net, chunk, state=None):
  """The network's logits for a chunk's stored rows (time-major unroll)."""
  tm = lambda x: np.swapaxes(x, 0, 1)
  inputs = types.AgentInput(tm(chunk['observation']), tm(chunk['prev_action']),
                            tm(chunk['reward']), tm(chunk['first']))
  out, final = net.unroll(inputs, state)
  return tm(out.policy_logits.numpy()), final


@pytest.fixture(scope='module')
def mlp_run():
  net = _net()
  chunks, episodes, _ = _run(net, 6)
  return net, chunks, episodes


def test_chunk_shapes_and_dtypes(mlp_run):
  _, chunks, _ = mlp_run
  expected = {
      'observation': ((B, T + 1, 3), np.float32),
      'reward': ((B, T + 1), np.float32),
      'terminated': ((B, T + 1), np.bool_),
      'truncated': ((B, T + 1), np.bool_),
      'first': ((B, T + 1), np.bool_),
      'prev_action': ((B, T + 1), np.int32),
      'action': ((B, T + 1), np.int32),
      'behaviour_logits': ((B, T + 1, 2), np.float32),
      'policy_version': ((B,), np.int64),
      'unroll_id': ((B,), np.int64),
      'replayed': ((B,), np.bool_),
  }
  for c in chunks:
    assert set(c) == set(expected)  # No core_state_* without an LSTM.
    for k, (shape, dtype) in expected.items():
      assert c[k].shape == shape, k
      assert c[k].dtype == dtype, k
    assert not c['replayed'].any()


def test_unrolls_generator_yields_what_run_emits(mlp_run):
  # The Ray backend takes chunks from Actor.unrolls one at a time; they must be the
  # chunks Actor.run emits with the same seeds and weights.
  _, chunks, episodes = mlp_run
  env = environments.make_vector_env(testing.CHAIN_ID, B, seed=0, vectorization='sync')
  got_episodes = []
  act = actor_lib.Actor(0, env, _net(), actor_lib.ParameterBroadcast(), T, None,
                        got_episodes.extend, seed=0, stop_event=threading.Event())
  gen = act.unrolls()
  try:
    got = [next(gen) for _ in range(len(chunks))]
  finally:
    act.close()
  for g, c in zip(got, chunks):
    assert set(g) == set(c)
    for k in c:
      np.testing.assert_array_equal(g[k], c[k], err_msg=k)
  assert act.steps == B * T * len(chunks)
  assert got_episodes == episodes[:len(got_episodes)] and got_episodes


def test_consecutive_unrolls_overlap_by_one_step(mlp_run):
  _, chunks, _ = mlp_run
  for prev, nxt in zip(chunks[:-1], chunks[1:]):
    for k in ROW_FIELDS:
      np.testing.assert_array_equal(prev[k][:, T], nxt[k][:, 0], err_msg=k)


def test_rows_follow_the_chain_with_next_step_autoreset(mlp_run):
  _, chunks, _ = mlp_run
  n = len(chunks) * T + 1
  g = np.arange(n)
  pos = g % 9  # Position within the 9-row cycle (8 steps + the reset row).
  first = _rows(chunks, 'first')
  terminated = _rows(chunks, 'terminated')
  reward = _rows(chunks, 'reward')
  obs = _rows(chunks, 'observation')
  for b in range(B):
    np.testing.assert_array_equal(first[b], pos == 0)
    np.testing.assert_array_equal(terminated[b], pos == 8)
    np.testing.assert_array_equal(reward[b], np.where(pos == 0, 0.0, 1.0))
    np.testing.assert_allclose(obs[b, :, 0], pos / 8.0)
  assert not _rows(chunks, 'truncated').any()
  # `first` exactly after each terminated row (and at the very first row).
  np.testing.assert_array_equal(first[:, 1:], terminated[:, :-1])
  assert first[:, 0].all()


def test_prev_action_is_previous_action_except_at_first(mlp_run):
  _, chunks, _ = mlp_run
  action = _rows(chunks, 'action')
  prev = _rows(chunks, 'prev_action')
  first = _rows(chunks, 'first')
  expected = np.where(first[:, 1:], 0, action[:, :-1])
  np.testing.assert_array_equal(prev[:, 1:], expected)
  np.testing.assert_array_equal(prev[:, 0], 0)
  assert set(np.unique(action).tolist()) == {0, 1}  # Sampled, both appear.


def test_episode_stats_for_the_chain(mlp_run):
  _, chunks, episodes = mlp_run
  # Rows 0..30 were produced; terminations at rows 8, 17, 26 for each env.
  assert len(chunks) * T == 30
  assert episodes == [types.EpisodeStats(8.0, 8)] * (3 * B)


def test_behaviour_logits_are_the_networks_logits(mlp_run):
  net, chunks, _ = mlp_run
  for c in chunks:
    logits, _ = _logits(net, c)
    np.testing.assert_allclose(c['behaviour_logits'], logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(c['policy_version'], 0)  # Nothing published.


def test_unroll_ids_unique_and_tagged_with_actor_id():
  chunks, _, _ = _run(_net(), 3, actor_id=5)
  ids = np.concatenate([c['unroll_id'] for c in chunks])
  np.testing.assert_array_equal(ids, 5 * 2**40 + np.arange(3 * B))


def test_truncation_is_not_termination():
  chunks, episodes, _ = _run(_net(), 3, env_id=testing.CHAIN_TRUNCATED_ID)
  # Time limit 5: rows 5, 11 truncated; rows 6, 12 first with reward 0.
  pos = np.arange(3 * T + 1) % 6
  truncated = _rows(chunks, 'truncated')
  for b in range(B):
    np.testing.assert_array_equal(truncated[b], pos == 5)
    np.testing.assert_array_equal(_rows(chunks, 'first')[b], pos == 0)
    np.testing.assert_array_equal(_rows(chunks, 'reward')[b],
                                  np.where(pos == 0, 0.0, 1.0))
  assert not _rows(chunks, 'terminated').any()
  assert episodes == [types.EpisodeStats(5.0, 5)] * (2 * B)


def test_policy_version_follows_broadcast():
  net = _net(seed=0)
  learner = _net(seed=1)
  new = _net(seed=2)
  broadcast = actor_lib.ParameterBroadcast()
  broadcast.publish(3, [v.numpy() for v in learner.variables])
  assert broadcast.version == 3

  def on_chunk(index):
    if index == 1:  # Between unrolls 1 and 2.
      broadcast.publish(7, [v.numpy() for v in new.variables])

  chunks, _, _ = _run(net, 4, broadcast=broadcast, on_chunk=on_chunk)
  assert [int(c['policy_version'][0]) for c in chunks] == [3, 3, 7, 7]
  for c in chunks:
    assert len(set(c['policy_version'].tolist())) == 1
  # The actor acts with the published weights, not its initial ones: checked on its
  # logits below (an MLP actor acts with numpy and leaves its TF copy untouched).
  # Unrolls 0, 1 acted with version 3. Unroll 2's row 0 is unroll 1's last row
  # (acted before the refresh); its other rows and unroll 3 acted with version 7.
  for c in chunks[:2]:
    np.testing.assert_allclose(c['behaviour_logits'], _logits(learner, c)[0],
                               rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(chunks[2]['behaviour_logits'][:, 1:],
                             _logits(new, chunks[2])[0][:, 1:], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(chunks[3]['behaviour_logits'], _logits(new, chunks[3])[0],
                             rtol=1e-5, atol=1e-6)
  assert not np.allclose(_logits(new, chunks[3])[0], _logits(learner, chunks[3])[0])


def test_tf_feedforward_policy_acts_with_published_weights(monkeypatch):
  # The TF path of a feedforward network (conv torsos act there; the MLP is
  # forced onto it): the traced policy reads the variables each refresh assigns.
  monkeypatch.setattr(actor_lib.numpy_policy.NumpyMLPPolicy, 'supports',
                      staticmethod(lambda network: False))
  first, second = _net(seed=1), _net(seed=2)
  broadcast = actor_lib.ParameterBroadcast()
  broadcast.publish(1, [v.numpy() for v in first.variables])

  def on_chunk(index):
    if index == 0:
      broadcast.publish(2, [v.numpy() for v in second.variables])

  chunks, _, act = _run(_net(seed=0), 3, broadcast=broadcast, on_chunk=on_chunk)
  assert act._numpy_policy is None
  assert [int(c['policy_version'][0]) for c in chunks] == [1, 2, 2]
  np.testing.assert_allclose(chunks[0]['behaviour_logits'], _logits(first, chunks[0])[0],
                             rtol=1e-5, atol=1e-6)
  for c in chunks[1:]:
    rows = slice(1, None) if c is chunks[1] else slice(None)  # Row 0: acted before.
    np.testing.assert_allclose(c['behaviour_logits'][:, rows],
                               _logits(second, c)[0][:, rows], rtol=1e-5, atol=1e-6)
  assert not np.allclose(_logits(first, chunks[2])[0], _logits(second, chunks[2])[0])


@pytest.mark.parametrize('refresh_every_step', [False, True])
def test_weights_published_mid_unroll_act_from_the_next_step_or_unroll(
    refresh_every_step):
  old, new = _net(seed=1), _net(seed=2)
  broadcast = actor_lib.ParameterBroadcast()
  broadcast.publish(1, [v.numpy() for v in old.variables])
  env = environments.make_vector_env(testing.CHAIN_ID, B, seed=0,
                                     vectorization='sync')
  chunks = []
  act = actor_lib.Actor(0, env, _net(seed=0), broadcast, T,
                        lambda chunk: chunks.append(chunk) or len(chunks) < 2,
                        lambda episodes: None, seed=0, stop_event=threading.Event(),
                        refresh_every_step=refresh_every_step)
  env_step = env.step

  def step(action):  # Vector step 2 publishes version 2 (the learner, meanwhile).
    if act._vector_steps == 2:
      broadcast.publish(2, [v.numpy() for v in new.variables])
    return env_step(action)

  env.step = step
  try:
    act.run()
  finally:
    act.close()
  first = 3 if refresh_every_step else T + 1  # First row acted with version 2.
  def rows(per_chunk):  # Global rows 0..2T of the two chunks.
    return np.concatenate([per_chunk(chunks[0])[:, :T], per_chunk(chunks[1])], axis=1)

  acted = rows(lambda c: c['behaviour_logits'])
  by_old, by_new = rows(lambda c: _logits(old, c)[0]), rows(lambda c: _logits(new, c)[0])
  np.testing.assert_allclose(acted[:, :first], by_old[:, :first], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(acted[:, first:], by_new[:, first:], rtol=1e-5, atol=1e-6)
  assert not np.allclose(by_old, by_new)
  # Step mode: the mean version of rows 0..T-1, rounded down: chunk 0 acted with
  # 1, 1, 1, 2, 2 (-> 1), chunk 1 with 2 at every row.
  assert [int(c['policy_version'][0]) for c in chunks] == [1, 2]


def test_lstm_core_state_chains_across_unrolls():
  net = _net(use_lstm=True, seed=4)
  chunks, _, _ = _run(net, 4)
  for c in chunks:
    assert c['core_state_0'].shape == (B, 4) and c['core_state_0'].dtype == np.float32
    assert c['core_state_1'].shape == (B, 4) and c['core_state_1'].dtype == np.float32
  np.testing.assert_array_equal(chunks[0]['core_state_0'], 0)
  np.testing.assert_array_equal(chunks[0]['core_state_1'], 0)
  for k, c in enumerate(chunks):
    state = (c['core_state_0'], c['core_state_1'])
    logits, _ = _logits(net, c, state)
    np.testing.assert_allclose(c['behaviour_logits'], logits, rtol=1e-5, atol=1e-5)
    if k + 1 < len(chunks):
      # State after rows 0..T-1 of unroll k == state before row 0 of unroll k+1.
      rows = {f: v[:, :T] for f, v in c.items() if f in ROW_FIELDS}
      _, (h, cell) = _logits(net, rows, state)
      nxt = chunks[k + 1]
      np.testing.assert_allclose(nxt['core_state_0'], h.numpy(), rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(nxt['core_state_1'], cell.numpy(), rtol=1e-5,
                                 atol=1e-6)
      assert np.abs(nxt['core_state_1']).max() > 0  # Not trivially zero.


def test_stop_event_ends_the_run():
  env = environments.make_vector_env(testing.CHAIN_ID, B, seed=0,
                                     vectorization='sync')
  stop = threading.Event()
  chunks = []

  def emit(chunk):
    chunks.append(chunk)
    stop.set()
    return True

  act = actor_lib.Actor(0, env, _net(), actor_lib.ParameterBroadcast(), T, emit,
                        lambda e: None, seed=0, stop_event=stop)
  act.run()
  act.close()
  assert len(chunks) == 1
  # Stops within one step of the unroll boundary after the emit.
  assert B * T <= act.steps <= B * (T + 1)


def _faulty_actor(fault, vectorization='sync', step_timeout=None):
  env = environments.make_vector_env(testing.faulty_id(fault), B, seed=0,
                                     vectorization=vectorization)
  return actor_lib.Actor(0, env, _net(), actor_lib.ParameterBroadcast(), T,
                         lambda chunk: True, lambda e: None, seed=0,
                         stop_event=threading.Event(),
                         env_id=testing.faulty_id(fault), step_timeout=step_timeout)


@pytest.mark.parametrize('fault,field,value', [
    ('nan_reward', 'reward', 'nan'), ('inf_observation', 'observation', 'inf')])
def test_non_finite_env_data_stops_the_actor_naming_env_field_and_step(
    fault, field, value):
  act = _faulty_actor(fault)
  try:
    with pytest.raises(actor_lib.NonFiniteEnvError) as e:
      act.run()
  finally:
    act.close()
  message = str(e.value)
  # Every env of the chain is at step 3 of its episode at the actor's 3rd step.
  assert message.startswith(
      f'env {testing.faulty_id(fault)} (actor 0, env 0) returned a non-finite '
      f'{field} ({value}) at step 3;'), message
  assert act.steps == B * 2  # The faulty step is not counted.


def test_huge_but_finite_rewards_pass_the_actor():
  act = _faulty_actor('huge_reward')
  chunks = []
  act._emit = lambda chunk: chunks.append(chunk) or len(chunks) < 2
  try:
    act.run()
  finally:
    act.close()
  assert chunks[0]['reward'][0, 1] == np.float32(testing.HUGE_REWARD)


def test_hung_async_env_times_out_and_close_terminates_it():
  # ImpalaHang-v0 hangs at step 3 of an episode (no fault tokens: every time).
  act = _faulty_actor('hang', vectorization='async', step_timeout=1.0)
  processes = list(act._env.processes)
  start = time.monotonic()
  try:
    with pytest.raises(actor_lib.EnvTimeoutError, match=r'did not finish step 3 '
                       r'within 1 s \(--env_step_timeout_secs\)'):
      act.run()
    took = time.monotonic() - start
    # Two good steps, then the 1 s timeout: detected after 1 s, not much later.
    assert 1.0 <= took < 8.0, took
  finally:
    closing = time.monotonic()
    act.close()
  assert time.monotonic() - closing < 10.0  # Terminated, not waited for.
  for p in processes:
    p.join(timeout=5)
    assert not p.is_alive()


def test_episode_tracker_skips_reset_steps_and_reports_ends():
  got = []
  tracker = actor_lib.EpisodeTracker(2, got.extend)
  tracker.update(np.array([1.0, 2.0]), np.array([True, True]),
                 np.array([False, False]))
  tracker.update(np.array([0.5, 3.0]), np.array([True, True]),
                 np.array([False, True]))
  assert got == [types.EpisodeStats(5.0, 2)]
  # Env 1's next step is the NEXT_STEP reset: its reward is not counted.
  tracker.update(np.array([1.0, 9.0]), np.array([True, False]),
                 np.array([True, False]))
  assert got == [types.EpisodeStats(5.0, 2), types.EpisodeStats(2.5, 3)]
  tracker.update(np.array([0.0, 4.0]), np.array([False, True]),
                 np.array([False, True]))
  assert got[-1] == types.EpisodeStats(4.0, 1)
