"""Tests for impala_tf.environments (fast: CartPole, fake envs, a few Pong steps)."""

import importlib.util
import os
import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode
import numpy as np
import pytest

from impala_tf import environments
from impala_tf import testing
from impala_tf.config import ConfigError

_HAS_ALE = importlib.util.find_spec('ale_py') is not None
_HAS_CV2 = importlib.util.find_spec('cv2') is not None
needs_atari = pytest.mark.skipif(
    not (_HAS_ALE and _HAS_CV2),
    reason="Atari tests need ale-py and opencv: pip install 'impala_tf[atari]'")


def _close(*envs):
  for env in envs:
    env.close()


# --- ids ---------------------------------------------------------------------


def test_is_atari_and_action_repeat():
  assert environments.is_atari('ALE/Pong-v5')
  assert environments.is_atari('PongNoFrameskip-v4')
  assert not environments.is_atari('CartPole-v1')
  assert environments.action_repeat('ALE/Pong-v5') == 4
  assert environments.action_repeat('BreakoutNoFrameskip-v4') == 4
  assert environments.action_repeat('CartPole-v1') == 1
  assert environments.action_repeat('Acrobot-v1') == 1


@needs_atari
def test_is_atari_from_entry_point():
  assert environments.is_atari('Pong-v4')


def test_check_env_id_accepts_registered_ids_fast():
  start = time.perf_counter()
  environments.check_env_id('CartPole-v1')
  environments.check_env_id('Acrobot-v1')
  assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize('bad', ['CartPole-v2', 'cartpole-v1', 'CartPol-v1'])
def test_check_env_id_suggests_close_id(bad):
  with pytest.raises(ConfigError) as e:
    environments.check_env_id(bad)
  assert e.value.field == 'env'
  assert e.value.value == bad
  assert 'did you mean CartPole-v1?' in str(e.value)


def test_check_env_id_without_suggestion():
  with pytest.raises(ConfigError) as e:
    environments.check_env_id('TotallyUnknownThing-v0')
  assert 'did you mean' not in str(e.value)
  assert str(e.value).startswith('env=TotallyUnknownThing-v0: ')


def test_check_env_id_rejects_empty():
  with pytest.raises(ConfigError):
    environments.check_env_id('  ')


def test_check_env_id_atari_without_ale_says_install_extra(monkeypatch):
  monkeypatch.setattr(environments, '_register_ale', lambda: False)
  with pytest.raises(ConfigError) as e:
    environments.check_env_id('ALE/NotAGame-v5')
  assert "pip install 'impala_tf[atari]'" in str(e.value)


@needs_atari
def test_check_env_id_atari():
  environments.check_env_id('ALE/Pong-v5')
  environments.check_env_id('PongNoFrameskip-v4')
  with pytest.raises(ConfigError, match='did you mean ALE/Pong-v5'):
    environments.check_env_id('ALE/pong-v5')


def test_unknown_vectorization():
  with pytest.raises(ConfigError, match='env_vectorization'):
    environments.make_vector_env('CartPole-v1', 2, 0, vectorization='threads')


# --- CartPole: vectorization, seeds, autoreset, time limit --------------------


def test_cartpole_auto_uses_vector_entry_point():
  env = environments.make_vector_env('CartPole-v1', 4, seed=0)
  assert isinstance(env.unwrapped, CartPoleVectorEnv)
  assert env.metadata['autoreset_mode'] == AutoresetMode.NEXT_STEP
  sync = environments.make_vector_env('CartPole-v1', 4, seed=0, vectorization='sync')
  assert isinstance(sync, gym.vector.SyncVectorEnv)
  assert sync.metadata['autoreset_mode'] == AutoresetMode.NEXT_STEP
  _close(env, sync)


def test_cartpole_auto_and_sync_have_equal_dynamics():
  """From the same states and actions, both give the same observations."""
  n = 8
  auto = environments.make_vector_env('CartPole-v1', n, seed=5)
  sync = environments.make_vector_env('CartPole-v1', n, seed=5, vectorization='sync')
  obs_sync, _ = sync.reset(seed=5)
  auto.reset(seed=5)
  # The vector env draws its start states from one generator; copy the sync
  # envs' states in so both start from the same place.
  auto.unwrapped.state = np.stack(
      [np.asarray(e.unwrapped.state, np.float64) for e in sync.envs], axis=1)
  rng = np.random.default_rng(0)
  for _ in range(8):  # CartPole cannot fail in fewer than ~9 steps.
    actions = rng.integers(0, 2, size=n)
    o_a, r_a, te_a, tr_a, _ = auto.step(actions)
    o_s, r_s, te_s, tr_s, _ = sync.step(actions)
    np.testing.assert_allclose(o_a, o_s, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(r_a, r_s)
    np.testing.assert_array_equal(te_a, te_s)
    np.testing.assert_array_equal(tr_a, tr_s)
    assert o_a.dtype == o_s.dtype == np.float32
  _close(auto, sync)


@pytest.mark.parametrize('mode', ['auto', 'sync'])
def test_distinct_envs_get_distinct_initial_observations(mode):
  env = environments.make_vector_env('CartPole-v1', 16, seed=3, vectorization=mode)
  obs, _ = env.reset(seed=3)
  assert obs.shape == (16, 4)
  assert len({row.tobytes() for row in obs}) == 16
  env.close()


@pytest.mark.parametrize('mode', ['auto', 'sync'])
def test_same_seed_reproduces(mode):
  def run(seed):
    env = environments.make_vector_env('CartPole-v1', 4, seed=seed,
                                       vectorization=mode)
    obs, _ = env.reset()  # No seed: continues the streams seeded at creation.
    out = [obs]
    rng = np.random.default_rng(1)
    for _ in range(40):
      out.append(env.step(rng.integers(0, 2, size=4))[0])
    env.close()
    return np.stack(out)

  np.testing.assert_array_equal(run(7), run(7))
  assert not np.array_equal(run(7), run(8))


def test_sync_env_i_is_seeded_with_seed_plus_i():
  env = environments.make_vector_env('CartPole-v1', 3, seed=100, vectorization='sync')
  obs, _ = environments.reset(env, 100)
  for i in range(3):
    single = gym.make('CartPole-v1')
    np.testing.assert_array_equal(obs[i], single.reset(seed=100 + i)[0])
    single.close()
  env.close()


@pytest.mark.parametrize('mode', ['auto', 'sync'])
def test_next_step_autoreset_after_terminated(mode):
  env = environments.make_vector_env('CartPole-v1', 1, seed=0, vectorization=mode)
  obs, _ = env.reset(seed=0)
  push_right = np.ones(1, np.int64)
  for _ in range(100):
    last = obs
    obs, reward, terminated, truncated, _ = env.step(push_right)
    if terminated[0]:
      break
  assert terminated[0] and not truncated[0]
  assert reward[0] == 1.0
  assert abs(obs[0, 0] - last[0, 0]) < 0.1  # The last obs continues the episode.
  obs2, reward2, terminated2, truncated2, _ = env.step(push_right)
  assert reward2[0] == 0.0  # The action was ignored; a new episode starts.
  assert not terminated2[0] and not truncated2[0]
  assert np.all(np.abs(obs2) <= 0.05)  # A fresh start state.
  obs3, reward3, _, _, _ = env.step(push_right)
  assert reward3[0] == 1.0
  env.close()


@pytest.mark.parametrize('mode', ['auto', 'sync'])
def test_time_limit_is_truncated_not_terminated(mode):
  env = environments.make_vector_env('CartPole-v1', 3, seed=0, vectorization=mode,
                                     max_episode_frames=5)
  env.reset(seed=0)
  actions = np.array([0, 1, 0])
  for t in range(5):
    _, reward, terminated, truncated, _ = env.step(actions)
    actions = 1 - actions  # Wiggle: never falls over in 5 steps.
    assert not terminated.any()
    assert truncated.all() == (t == 4)
  _, reward, terminated, truncated, _ = env.step(actions)
  np.testing.assert_array_equal(reward, 0.0)
  assert not (terminated | truncated).any()
  env.close()


def test_registered_limit_still_applies():
  env = environments.make_vector_env('CartPole-v1', 1, seed=0, vectorization='sync')
  assert env.envs[0].spec.max_episode_steps == 500
  env.close()


def test_env_spaces_classic():
  obs_space, act_space = environments.env_spaces('CartPole-v1')
  assert obs_space.shape == (4,) and obs_space.dtype == np.float32
  assert act_space == gym.spaces.Discrete(2)


def test_async_with_tensorflow_imported_in_parent():
  tf = pytest.importorskip('tensorflow')
  assert float(tf.reduce_sum(tf.ones([4]))) == 4.0  # TF runtime threads running.
  env = environments.make_vector_env('CartPole-v1', 2, seed=11, vectorization='async')
  sync = environments.make_vector_env('CartPole-v1', 2, seed=11, vectorization='sync')
  try:
    assert isinstance(env, gym.vector.AsyncVectorEnv)
    assert env.metadata['autoreset_mode'] == AutoresetMode.NEXT_STEP
    obs_a, _ = env.reset(seed=11)
    obs_s, _ = sync.reset(seed=11)
    np.testing.assert_array_equal(obs_a, obs_s)
    for a in ([0, 1], [1, 1], [0, 0]):
      np.testing.assert_array_equal(env.step(np.array(a))[0],
                                    sync.step(np.array(a))[0])
    # The env processes did not load TensorFlow (they never import __main__).
    for process in env.processes:
      maps = f'/proc/{process.pid}/maps'
      if os.path.exists(maps):
        with open(maps) as f:
          assert 'tensorflow' not in f.read()
  finally:
    _close(env, sync)


# --- game_over and episodic life (fake env with lives) -------------------------


class _LivesEnv(gym.Env):
  """Loses a life every 3 steps; 2 lives. obs = steps since the game started."""

  observation_space = gym.spaces.Box(0, 1000, (1,), np.float32)
  action_space = gym.spaces.Discrete(2)

  def __init__(self):
    self.resets = 0
    self._t = 0
    self._lives = 2

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self.resets += 1
    self._t, self._lives = 0, 2
    return np.array([0.0], np.float32), {'lives': self._lives}

  def step(self, action):
    self._t += 1
    if self._t % 3 == 0:
      self._lives -= 1
    return (np.array([self._t], np.float32), 1.0, self._lives == 0, False,
            {'lives': self._lives})


def test_episodic_life_single_env():
  inner = _LivesEnv()
  env = environments.EpisodicLifeEnv(inner)
  obs, info = env.reset(seed=0)
  assert info['game_over'] is False and inner.resets == 1
  steps = [env.step(0) for _ in range(3)]
  assert [s[2] for s in steps] == [False, False, True]  # Life lost: terminated.
  assert [s[4]['game_over'] for s in steps] == [False, False, False]
  obs, info = env.reset()
  assert inner.resets == 1  # Not a new game: one no-op step instead.
  assert obs[0] == 4 and info['game_over'] is False
  steps = [env.step(0) for _ in range(2)]
  assert steps[-1][2] and steps[-1][4]['game_over']  # Last life: the game ends.
  obs, _ = env.reset()
  assert inner.resets == 2 and obs[0] == 0


def test_episodic_life_in_vector_env_and_game_over():
  env = gym.vector.SyncVectorEnv([lambda: environments.EpisodicLifeEnv(_LivesEnv())])
  env.reset(seed=0)
  ends = []
  for _ in range(7):
    _, _, terminated, truncated, infos = env.step(np.zeros(1, np.int64))
    assert infos['_game_over'].all()
    ends.append((bool(terminated[0]),
                 bool(environments.game_over(terminated, truncated, infos)[0])))
  # t=3 life lost; t=4 NEXT_STEP reset (the no-op step); t=6 last life lost.
  assert ends == [(False, False), (False, False), (True, False), (False, False),
                  (False, False), (True, True), (False, False)]
  env.close()


def test_episodic_life_game_end_during_the_noop_step_is_reported():
  # FakeLivesEnv: a life is lost at step 2, and the game ends at step 3, which is
  # the no-op step EpisodicLifeEnv's reset takes after the lost life.
  inner = testing.FakeLivesEnv()
  env = environments.EpisodicLifeEnv(inner)
  env.reset(seed=0)
  steps = [env.step(1) for _ in range(2)]
  assert [s[2] for s in steps] == [False, True]  # The lost life: terminated.
  assert [s[4]['game_over'] for s in steps] == [False, False]
  obs, info = env.reset()
  # The no-op ended the game: a new game started, and the reset says so.
  assert inner.games == 2 and obs[0] == 0
  assert info['game_over'] is True
  _, _, terminated, _, info = env.step(1)
  assert not terminated and info['game_over'] is False


def test_episodic_life_noop_game_end_splits_episodes_in_a_vector_env():
  env = gym.vector.SyncVectorEnv(
      [lambda: environments.EpisodicLifeEnv(testing.FakeLivesEnv())],
      autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
  env.reset(seed=0)
  returns, current = [], 0.0
  prev_done = False
  ends = []
  for _ in range(6):
    _, reward, terminated, truncated, infos = env.step(np.ones(1, np.int64))
    ended = bool(environments.game_over(terminated, truncated, infos)[0])
    if not prev_done:
      current += float(reward[0])
    ends.append(ended)
    if ended:
      returns.append(current)
      current = 0.0
    prev_done = bool(terminated[0] or truncated[0])
  # t=2 life lost; t=3 NEXT_STEP reset whose no-op ends the game: reported there;
  # t=5 the second game loses a life, t=6 ends the second game the same way.
  assert ends == [False, False, True, False, False, True]
  assert returns == [2.0, 2.0]  # Two games of 2 rewarded steps, never merged.
  env.close()


def test_game_over_without_episodic_life():
  terminated = np.array([True, False, False])
  truncated = np.array([False, True, False])
  np.testing.assert_array_equal(
      environments.game_over(terminated, truncated, {}), [True, True, False])


# --- Atari --------------------------------------------------------------------


@needs_atari
def test_pong_observations_stacked_channels_last():
  env = environments.make_vector_env('ALE/Pong-v5', 2, seed=0)
  try:
    assert isinstance(env, gym.vector.SyncVectorEnv)
    assert env.single_observation_space.shape == (84, 84, 4)
    assert env.single_action_space == gym.spaces.Discrete(6)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.uint8
    for c in range(1, 4):  # Reset pads the stack with the first frame.
      np.testing.assert_array_equal(obs[..., c], obs[..., 0])
    prev = obs
    for _ in range(3):
      obs, reward, terminated, truncated, _ = env.step(np.array([2, 3]))
      np.testing.assert_array_equal(obs[..., :3], prev[..., 1:])  # Oldest first.
      prev = obs
    assert reward.dtype in (np.float32, np.float64)
  finally:
    env.close()


@needs_atari
def test_pong_lstm_has_one_channel():
  obs_space, act_space = environments.env_spaces('ALE/Pong-v5', use_lstm=True)
  assert obs_space.shape == (84, 84, 1) and obs_space.dtype == np.uint8
  assert act_space.n == 6
  env = environments.make_env('ALE/Pong-v5', use_lstm=True)
  obs, _ = env.reset(seed=0)
  assert obs.shape == (84, 84, 1)
  assert env.step(0)[0].shape == (84, 84, 1)
  env.close()


@needs_atari
def test_atari_time_limit_in_frames_is_truncation():
  env = environments.make_env('ALE/Pong-v5', max_episode_frames=100, noop_max=0)
  env.reset(seed=0)
  for t in range(100):
    _, _, terminated, truncated, _ = env.step(0)
    assert not terminated
    if truncated:
      break
  assert truncated and t + 1 == 25  # 100 frames / 4 frames per step.
  env.close()


@needs_atari
def test_sticky_actions_follow_the_id():
  v5 = environments.make_env('ALE/Pong-v5')
  v4 = environments.make_env('PongNoFrameskip-v4')
  assert v5.unwrapped.ale.getFloat('repeat_action_probability') == pytest.approx(0.25)
  assert v4.unwrapped.ale.getFloat('repeat_action_probability') == 0.0
  _close(v5, v4)


@needs_atari
def test_atari_episodic_life_reports_game_over():
  env = environments.make_vector_env('ALE/Breakout-v5', 1, seed=0, episodic_life=True,
                                     frame_stack=1)
  try:
    lives_lost = 0
    for _ in range(2000):  # FIRE then noops: each life is lost in ~50 steps.
      _, _, terminated, truncated, infos = env.step(np.array([1]))
      over = environments.game_over(terminated, truncated, infos)
      if terminated[0] and not over[0]:
        lives_lost += 1
        if lives_lost == 2:
          break
      assert not over[0]
    assert lives_lost == 2
  finally:
    env.close()
