"""Consistency of impala_tf/types.py with the modules that build and read its data.

The field lists in types.py, the tf.data signature (data.unroll_signature), the chunks
an Actor emits and the network's inputs/outputs must agree: a field added in one
place and not in the others breaks the learner only at run time.
"""

import threading

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf

from impala_tf import actor as actor_lib
from impala_tf import data
from impala_tf import networks
from impala_tf import testing
from impala_tf import types

B, T = 2, 9  # T > 8: the chain's first episode (8 steps) ends inside the chunk.
OBS_SHAPE, NUM_ACTIONS, LSTM_SIZE = (3,), 2, 4
PER_STEP = ('observation', 'reward', 'terminated', 'truncated', 'first',
            'prev_action', 'action', 'behaviour_logits')
PER_UNROLL = ('policy_version', 'unroll_id', 'replayed')


def _net(use_lstm):
  return networks.AgentNetwork(OBS_SHAPE, tf.float32, NUM_ACTIONS,
                               mlp_hidden_sizes=(8,), use_lstm=use_lstm,
                               lstm_size=LSTM_SIZE, seed=0)


def _signature(state_sizes):
  return data.unroll_signature(OBS_SHAPE, np.float32, NUM_ACTIONS, T, state_sizes)


def _expected_keys(num_states):
  return ((set(types.Unroll._fields) - {'core_state'}) |
          {f'core_state_{i}' for i in range(num_states)})


def test_field_lists():
  assert types.Unroll._fields == PER_STEP + ('core_state',) + PER_UNROLL
  assert types.AgentInput._fields == ('observation', 'prev_action', 'reward', 'first')
  assert types.AgentOutput._fields == ('policy_logits', 'baseline')
  assert types.EnvOutput._fields == (
      'observation', 'reward', 'terminated', 'truncated', 'first')
  assert types.EpisodeStats._fields == ('episode_return', 'length')


@pytest.mark.parametrize('state_sizes', [(), (LSTM_SIZE, LSTM_SIZE), (5,)])
def test_signature_keys_are_the_unroll_fields(state_sizes):
  sig = _signature(state_sizes)
  assert set(sig) == _expected_keys(len(state_sizes))
  for key in PER_STEP:
    assert sig[key].shape[:2].as_list() == [None, T + 1], key
  assert sig['observation'].shape.as_list() == [None, T + 1, *OBS_SHAPE]
  assert sig['behaviour_logits'].shape.as_list() == [None, T + 1, NUM_ACTIONS]
  for key in PER_UNROLL:
    assert sig[key].shape.as_list() == [None], key
  for i, size in enumerate(state_sizes):
    assert sig[f'core_state_{i}'].shape.as_list() == [None, size]
    assert sig[f'core_state_{i}'].dtype == tf.float32
  # The dtypes of the conventions in types.py.
  dtypes = {k: s.dtype for k, s in sig.items()}
  assert dtypes['observation'] == tf.float32
  assert dtypes['reward'] == dtypes['behaviour_logits'] == tf.float32
  assert dtypes['action'] == dtypes['prev_action'] == tf.int32
  assert (dtypes['terminated'] == dtypes['truncated'] == dtypes['first'] ==
          dtypes['replayed'] == tf.bool)
  assert dtypes['policy_version'] == dtypes['unroll_id'] == tf.int64
  assert _signature(())['observation'].dtype == tf.float32
  assert data.unroll_signature((4, 4), np.uint8, 3, T)['observation'].dtype == tf.uint8


def _one_chunk(net):
  """Runs one Actor on ChainEnv until its first chunk; returns (chunk, episodes)."""
  env = gym.vector.SyncVectorEnv(
      [testing.ChainEnv for _ in range(B)],
      autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
  chunks, episodes = [], []

  def emit(chunk):
    chunks.append(chunk)
    return False  # Stop after the first chunk.

  act = actor_lib.Actor(3, env, net, actor_lib.ParameterBroadcast(), T, emit,
                        episodes.extend, seed=0, stop_event=threading.Event())
  try:
    act.run()
  finally:
    act.close()
  assert len(chunks) == 1
  return chunks[0], episodes


@pytest.mark.parametrize('use_lstm', [False, True], ids=['mlp', 'lstm'])
def test_actor_chunk_matches_the_signature(use_lstm):
  net = _net(use_lstm)
  state_sizes = [int(s.shape[-1]) for s in net.initial_state(1)]
  assert len(state_sizes) == (2 if use_lstm else 0)
  sig = _signature(state_sizes)
  chunk, episodes = _one_chunk(net)

  assert set(chunk) == set(sig) == _expected_keys(len(state_sizes))
  for key, spec in sig.items():
    value = chunk[key]
    assert isinstance(value, np.ndarray), key
    assert tf.as_dtype(value.dtype) == spec.dtype, (key, value.dtype, spec.dtype)
    assert spec.shape.is_compatible_with(value.shape), (key, value.shape, spec.shape)
    assert value.shape[0] == B, key
  for key in PER_STEP:
    assert chunk[key].shape[:2] == (B, T + 1), key
  assert chunk['observation'].shape == (B, T + 1) + OBS_SHAPE
  assert chunk['behaviour_logits'].shape == (B, T + 1, NUM_ACTIONS)
  for key in PER_UNROLL:
    assert chunk[key].shape == (B,), key
  for i, size in enumerate(state_sizes):
    assert chunk[f'core_state_{i}'].shape == (B, size)

  # tf.data accepts the chunk under the signature as is.
  ds = tf.data.Dataset.from_generator(lambda: iter([chunk]), output_signature=sig)
  element = next(iter(ds))
  assert set(element) == set(sig)

  # It can be packed into types.Unroll, core state as a tuple.
  unroll = types.Unroll(
      core_state=tuple(chunk[f'core_state_{i}'] for i in range(len(state_sizes))),
      **{k: chunk[k] for k in PER_STEP + PER_UNROLL})
  assert unroll.unroll_id.tolist() == [3 * 2**40, 3 * 2**40 + 1]
  assert not unroll.replayed.any()

  # The chain's first episodes (8 steps of reward 1) ended at row 8.
  assert chunk['terminated'][:, 8].all() and not chunk['terminated'][:, :8].any()
  assert all(isinstance(e, types.EpisodeStats) for e in episodes)
  assert [(e.episode_return, e.length) for e in episodes] == [(8.0, 8)] * B


@pytest.mark.parametrize('use_lstm', [False, True], ids=['mlp', 'lstm'])
def test_network_takes_agent_input_and_returns_agent_output(use_lstm):
  net = _net(use_lstm)
  step_in = types.AgentInput(
      observation=tf.zeros([B, *OBS_SHAPE]), prev_action=tf.zeros([B], tf.int32),
      reward=tf.zeros([B]), first=tf.ones([B], tf.bool))
  out, state = net.step(step_in, net.initial_state(B))
  assert isinstance(out, types.AgentOutput)
  assert out.policy_logits.shape == (B, NUM_ACTIONS)
  assert out.baseline.shape == (B,)
  assert out.policy_logits.dtype == out.baseline.dtype == tf.float32
  assert len(state) == (2 if use_lstm else 0)

  unroll_in = types.AgentInput(
      observation=tf.zeros([T, B, *OBS_SHAPE]),
      prev_action=tf.zeros([T, B], tf.int32), reward=tf.zeros([T, B]),
      first=tf.zeros([T, B], tf.bool))
  out, _ = net.unroll(unroll_in, net.initial_state(B))
  assert isinstance(out, types.AgentOutput)
  assert out.policy_logits.shape == (T, B, NUM_ACTIONS)
  assert out.baseline.shape == (T, B)
