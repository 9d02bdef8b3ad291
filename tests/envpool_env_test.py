"""Tests for impala_tf.envpool_env: the EnvPool backend agrees with gymnasium's.

The cross-backend tests use BreakoutNoFrameskip-v4 with `noop_max=1`: no sticky
actions and exactly one no-op frame after each reset make both backends
deterministic given the actions, so a scripted (seeded random) action sequence
gives the same emulator trajectory on both, although EnvPool and ale-py seed the
ALE differently. Breakout has lives, so episodic life is exercised.

EnvPool is in the `test` extra; without it these tests are skipped (except the
ones that check the error a user gets without it).
"""

import importlib.util
import sys

from absl import logging as absl_logging
import gymnasium as gym
import numpy as np
import pytest

from impala_tf import envpool_env
from impala_tf import environments
from impala_tf.config import ConfigError

_HAS_ATARI = (importlib.util.find_spec('ale_py') is not None and
              importlib.util.find_spec('cv2') is not None)
needs_envpool = pytest.mark.skipif(
    not (_HAS_ATARI and envpool_env.available()),
    reason='EnvPool tests need envpool, ale-py and opencv: '
    'pip install -e ".[atari]" (or ".[test]")')
needs_atari = pytest.mark.skipif(
    not _HAS_ATARI, reason="Atari tests need ale-py and opencv: pip install -e '.[atari]'")

GAME = 'BreakoutNoFrameskip-v4'


def _both(num_envs=2, **kwargs):
  """(gymnasium vector env, EnvPool vector env), same flags, reset with seed 0."""
  kwargs.setdefault('noop_max', 1)
  gym_env = environments.make_vector_env(GAME, num_envs, 0, vectorization='sync',
                                         backend='gymnasium', **kwargs)
  pool_env = environments.make_vector_env(GAME, num_envs, 0, backend='envpool',
                                          **kwargs)
  assert isinstance(pool_env, envpool_env.EnvPoolVectorEnv)
  return gym_env, pool_env


# --- choosing the backend -------------------------------------------------------


def test_gymnasium_backend_needs_nothing():
  assert envpool_env.resolve_backend('gymnasium', 'ALE/Pong-v5') == 'gymnasium'


def test_envpool_missing_is_a_one_line_error_naming_the_install(monkeypatch):
  monkeypatch.setattr(envpool_env, 'available', lambda: False)
  with pytest.raises(ConfigError, match='env_backend') as e:
    envpool_env.resolve_backend('envpool', 'ALE/Pong-v5')
  message = str(e.value)
  assert '\n' not in message
  assert 'pip install -e ".[atari]"' in message and 'pip install envpool' in message
  assert envpool_env.resolve_backend('auto', 'ALE/Pong-v5') == 'gymnasium'


def _broken_envpool(monkeypatch):
  """envpool installed, but its import raises (a build for another numpy)."""
  def fail():
    raise ImportError('numpy.core.multiarray failed to import\n(details)')
  monkeypatch.setattr(envpool_env, 'available', lambda: True)
  monkeypatch.setattr(envpool_env, '_import_envpool', fail)
  monkeypatch.setattr(envpool_env, '_import_error', envpool_env._UNSET)
  monkeypatch.setattr(envpool_env, '_warned', set())


@needs_atari
def test_auto_falls_back_with_one_line_when_envpool_does_not_import(
    monkeypatch, capsys):
  _broken_envpool(monkeypatch)
  assert envpool_env.resolve_backend('auto', 'ALE/Pong-v5') == 'gymnasium'
  assert envpool_env.resolve_backend('auto', 'ALE/Pong-v5') == 'gymnasium'
  err = capsys.readouterr().err
  assert err == ('impala_tf: --env_backend=auto: envpool is installed but does not '
                 'import (ImportError: numpy.core.multiarray failed to import '
                 '(details)); using gymnasium\n')  # Once per process.
  with pytest.raises(ConfigError, match='env_backend') as e:
    envpool_env.resolve_backend('envpool', 'ALE/Pong-v5')
  assert '\n' not in str(e.value)
  assert 'does not import (ImportError' in str(e.value)
  assert '--env_backend=gymnasium' in str(e.value)
  # Non-Atari envs never try the import.
  monkeypatch.setattr(envpool_env, '_import_error', envpool_env._UNSET)
  assert envpool_env.resolve_backend('auto', 'CartPole-v1') == 'gymnasium'
  assert envpool_env._import_error is envpool_env._UNSET
  assert capsys.readouterr().err == ''


@needs_envpool
@pytest.mark.parametrize('field,value', [('env_vectorization', 'async'),
                                         ('env_vectorization', 'sync'),
                                         ('env_step_timeout_secs', 5.0)])
@pytest.mark.parametrize('backend', ['envpool', 'auto'])
def test_flags_envpool_ignores_are_refused(field, value, backend):
  from impala_tf import config as config_lib  # pylint: disable=g-import-not-at-top
  cfg = config_lib.Config(env='ALE/Pong-v5', env_backend=backend, **{field: value})
  with pytest.raises(ConfigError, match=f'^{field}={value}: has no effect on '
                     'EnvPool') as e:
    envpool_env.check_config(cfg)
  assert '--env_backend=gymnasium' in str(e.value) and '\n' not in str(e.value)
  # The gymnasium backend uses them; EnvPool with the defaults is fine.
  assert envpool_env.check_config(cfg.replace(env_backend='gymnasium')) == 'gymnasium'
  assert envpool_env.check_config(config_lib.Config(
      env='ALE/Pong-v5', env_backend=backend)) == 'envpool'
  # A classic env never uses EnvPool under 'auto': nothing is refused.
  assert envpool_env.check_config(cfg.replace(env='CartPole-v1', env_backend='auto')
                                  ) == 'gymnasium'


@needs_envpool
def test_num_threads_reaches_the_pool():
  for threads in (0, 1, 3):
    env = environments.make_vector_env('ALE/Pong-v5', 4, 0, backend='envpool',
                                       envpool_num_threads=threads)
    try:
      assert env._pool.config['num_threads'] == threads
    finally:
      env.close()


def test_auto_uses_gymnasium_for_classic_envs():
  assert envpool_env.resolve_backend('auto', 'CartPole-v1') == 'gymnasium'
  env = environments.make_vector_env('CartPole-v1', 2, 0, backend='auto')
  assert not isinstance(env, envpool_env.EnvPoolVectorEnv)
  env.close()


@needs_envpool
def test_envpool_rejects_classic_envs_and_zero_noops():
  with pytest.raises(ConfigError, match='no Atari game'):
    envpool_env.resolve_backend('envpool', 'CartPole-v1')
  with pytest.raises(ConfigError, match='noop_max=0'):
    envpool_env.resolve_backend('envpool', 'ALE/Pong-v5', noop_max=0)
  # 'auto' falls back to gymnasium where EnvPool cannot carry the flags.
  assert envpool_env.resolve_backend('auto', 'ALE/Pong-v5', noop_max=0) == 'gymnasium'
  env = environments.make_vector_env('ALE/Pong-v5', 1, 0, backend='auto', noop_max=0)
  assert isinstance(env, gym.vector.SyncVectorEnv)
  env.close()


@needs_envpool
def test_auto_uses_envpool_for_atari():
  assert envpool_env.resolve_backend('auto', 'ALE/Pong-v5') == 'envpool'
  env = environments.make_vector_env('ALE/Pong-v5', 2, 0, backend='auto')
  assert isinstance(env, envpool_env.EnvPoolVectorEnv)
  assert env.metadata['autoreset_mode'] == gym.vector.AutoresetMode.NEXT_STEP
  env.close()


@needs_envpool
def test_task_ids():
  assert envpool_env.task_id('ALE/Pong-v5') == 'Pong-v5'
  assert envpool_env.task_id('PongNoFrameskip-v4') == 'Pong-v5'
  assert envpool_env.task_id('ALE/MontezumaRevenge-v5') == 'MontezumaRevenge-v5'
  assert envpool_env.task_id('CartPole-v1') is None


@needs_envpool
def test_options_carry_our_flags():
  v5 = envpool_env.make_kwargs('ALE/Pong-v5', noop_max=30, max_episode_frames=108_000)
  assert v5['repeat_action_probability'] == 0.25  # Sticky, as the id implies.
  assert v5['reward_clip'] is False and v5['use_fire_reset'] is False
  assert v5['episodic_life'] is False  # Done by the adapter.
  assert v5['noop_max'] == 30 and v5['frame_skip'] == 4
  assert v5['max_episode_steps'] == 27_000
  assert (v5['img_height'], v5['img_width'], v5['gray_scale']) == (84, 84, True)
  v4 = envpool_env.make_kwargs('PongNoFrameskip-v4')
  assert v4['repeat_action_probability'] == 0.0
  forced = envpool_env.make_kwargs('ALE/Pong-v5', repeat_action_probability=0.1)
  assert forced['repeat_action_probability'] == 0.1
  env = envpool_env.make_vector_env('ALE/Pong-v5', 1, 0)
  try:  # EnvPool's own default is 0.0: the pool really got 0.25.
    assert env._pool.spec.config.repeat_action_probability == pytest.approx(0.25)  # pylint: disable=protected-access
  finally:
    env.close()


# --- the two backends agree ---------------------------------------------------------


@needs_envpool
@pytest.mark.parametrize('use_lstm', [False, True], ids=['stack4', 'lstm'])
def test_spaces_and_dtypes_agree(use_lstm):
  gym_env, pool_env = _both(use_lstm=use_lstm)
  try:
    assert pool_env.single_observation_space == gym_env.single_observation_space
    assert pool_env.single_action_space == gym_env.single_action_space
    assert pool_env.observation_space == gym_env.observation_space
    obs_g, _ = environments.reset(gym_env, 0)
    obs_p, _ = environments.reset(pool_env, 0)
    assert obs_p.dtype == obs_g.dtype == np.uint8
    assert obs_p.shape == obs_g.shape == (2, 84, 84, 1 if use_lstm else 4)
    np.testing.assert_array_equal(obs_p, obs_g)
    _, r_g, te_g, tr_g, _ = gym_env.step(np.array([1, 1], np.int32))
    _, r_p, te_p, tr_p, _ = pool_env.step(np.array([1, 1], np.int32))
    assert r_p.dtype == np.float32 and te_p.dtype == tr_p.dtype == bool
    assert r_p.shape == te_p.shape == tr_p.shape == r_g.shape == (2,)
  finally:
    gym_env.close()
    pool_env.close()


def _game_returns(rewards, stepped, over):
  """Per-game returns (the actor's EpisodeTracker rule) from per-step arrays."""
  returns, running = [], np.zeros(rewards.shape[1])
  for r, s, o in zip(rewards, stepped, over):
    running += np.where(s, r, 0.0)
    for i in np.flatnonzero(o):
      returns.append((i, running[i]))
      running[i] = 0.0
  return returns


@needs_envpool
@pytest.mark.parametrize('episodic_life', [False, True], ids=['games', 'lives'])
def test_scripted_actions_give_the_same_steps(episodic_life):
  # 605 frames: truncated at the last frame of agent step 151 (1 no-op frame +
  # 151 * 4), so both backends emulate the same frames up to the limit. (With a
  # limit inside a step, gymnasium stops the ALE there, EnvPool runs the whole
  # step: a life lost in its last frames is seen by EnvPool only.)
  steps = 450
  gym_env, pool_env = _both(episodic_life=episodic_life, max_episode_frames=605)
  rng = np.random.default_rng(1)
  record = {'gym': [], 'pool': []}
  elapsed = []  # EnvPool's agent steps since the game started.
  try:
    environments.reset(gym_env, 0)
    environments.reset(pool_env, 0)
    for t in range(steps):
      action = rng.integers(0, 4, 2).astype(np.int32)
      outs = {'gym': gym_env.step(action), 'pool': pool_env.step(action)}
      for name, (obs, reward, terminated, truncated, infos) in outs.items():
        over = environments.game_over(terminated, truncated, infos)
        record[name].append((obs, np.asarray(reward, np.float64), terminated,
                             truncated, over))
      elapsed.append(outs['pool'][4]['elapsed_step'])
      (obs_g, r_g, te_g, tr_g, over_g), (obs_p, r_p, te_p, tr_p, over_p) = (
          record['gym'][-1], record['pool'][-1])
      np.testing.assert_array_equal(r_p, r_g, err_msg=f'step {t}')
      np.testing.assert_array_equal(te_p, te_g, err_msg=f'step {t}')
      np.testing.assert_array_equal(tr_p, tr_g, err_msg=f'step {t}')
      np.testing.assert_array_equal(over_p, over_g, err_msg=f'step {t}')
      # Frames agree except the last of an episode: at a game over or the time
      # limit the ALE stops inside the 4-frame step, and the backends max-pool
      # different leftover frames there (the learner gives that frame no weight
      # beyond the bootstrap of a truncation).
      live = ~(te_g | tr_g) | (te_g & ~over_g)
      np.testing.assert_array_equal(obs_p[live], obs_g[live], err_msg=f'step {t}')
  finally:
    gym_env.close()
    pool_env.close()
  te = np.array([x[2] for x in record['gym']])
  tr = np.array([x[3] for x in record['gym']])
  over = np.array([x[4] for x in record['gym']])
  assert tr.any()  # The time limit was reached, at agent step 151 of a game ...
  np.testing.assert_array_equal(np.array(elapsed)[tr], 151)
  assert (te & ~over).any() == episodic_life  # ... and lives were lost.
  assert over.sum() >= 3
  ended = te | tr
  stepped = np.concatenate([np.ones((1, 2), bool), ~ended[:-1]])
  game_returns = {
      name: _game_returns(np.array([x[1] for x in rec]), stepped,
                          np.array([x[4] for x in rec]))
      for name, rec in record.items()}
  assert game_returns['pool'] == game_returns['gym']
  assert any(r > 0 for _, r in game_returns['gym'])


@needs_envpool
@pytest.mark.parametrize('game,fire,end_step,episodic_life', [
    ('PongNoFrameskip-v4', False, 764, False),  # Lost 0-21 standing still.
    ('BreakoutNoFrameskip-v4', True, 25, True),  # The first ball is missed.
], ids=['game_over_on_the_limit', 'life_lost_on_the_limit'])
def test_an_end_on_the_time_limit_step_is_terminated_on_both(
    game, fire, end_step, episodic_life):
  # Scripted (FIRE once, then no-ops), no randomness: the game ends (Pong) or a
  # life is lost (Breakout) at agent step `end_step`; the time limit falls on
  # that same step (its last frame but one: gymnasium then reports both). EnvPool
  # reports such a step as truncated only; both backends must say terminated
  # (no bootstrap) and truncated, a game over, and start a new game next.
  kwargs = dict(noop_max=1, episodic_life=episodic_life,
                max_episode_frames=4 * end_step)
  envs = {
      'gym': environments.make_vector_env(game, 1, 0, vectorization='sync',
                                          backend='gymnasium', **kwargs),
      'pool': environments.make_vector_env(game, 1, 0, backend='envpool', **kwargs)}
  try:
    for name, env in envs.items():
      environments.reset(env, 0)
      for t in range(end_step + 1):
        action = np.array([1 if fire and t == 0 else 0], np.int32)
        obs, reward, terminated, truncated, infos = env.step(action)
        over = environments.game_over(terminated, truncated, infos)
        if t < end_step - 1:
          assert not (terminated[0] or truncated[0]), (name, t)
        elif t == end_step - 1:
          assert terminated[0] and truncated[0] and over[0], name
          lives = infos['lives'][0] if 'lives' in infos else None
        else:  # The step after: the first of a new game, whole lives.
          assert not (terminated[0] or truncated[0]) and reward[0] == 0, name
          if episodic_life:
            assert infos['lives'][0] == lives + 1, name
            for c in range(3):  # A fresh stack: the new game's first frame.
              np.testing.assert_array_equal(obs[0, ..., c], obs[0, ..., 3])
  finally:
    for env in envs.values():
      env.close()


@needs_envpool
def test_episodic_life_restarts_the_stack_and_drops_the_noop_reward():
  _, env = _both(num_envs=1, episodic_life=True)
  try:
    env.reset(seed=0)
    rng = np.random.default_rng(1)
    for _ in range(500):
      obs, reward, terminated, truncated, infos = env.step(
          rng.integers(0, 4, 1).astype(np.int32))
      if terminated[0] and not infos['game_over'][0]:
        break
    assert terminated[0] and not truncated[0]  # A life was lost, not the game.
    lives = infos['lives'][0]
    obs, reward, terminated, truncated, infos = env.step(np.array([1], np.int32))
    # The no-op step starts the next episode: the stack holds its frame 4 times.
    for c in range(3):
      np.testing.assert_array_equal(obs[0, ..., c], obs[0, ..., 3])
    assert reward[0] == 0 and not terminated[0] and not truncated[0]
    assert infos['lives'][0] == lives and not infos['game_over'][0]
  finally:
    env.close()


@needs_envpool
def test_seeded_reset_reproduces_and_seeds_differ():
  env = envpool_env.make_vector_env('ALE/Pong-v5', 2, 7)  # noop_max=30, sticky.

  def rollout(seed):
    first, _ = env.reset(seed=seed)
    obs = [first]
    for _ in range(40):
      obs.append(env.step(np.full(2, 2, np.int32))[0])
    return np.stack(obs)

  try:
    a = rollout(7)
    b = rollout(7)
    c = rollout(8)
  finally:
    env.close()
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


@needs_envpool
def test_next_step_autoreset_after_game_over():
  env = envpool_env.make_vector_env(GAME, 1, 0, noop_max=1, max_episode_frames=42)
  try:
    env.reset(seed=0)
    for t in range(20):
      _, _, terminated, truncated, infos = env.step(np.array([3], np.int32))
      if truncated[0]:
        break
    assert truncated[0] and not terminated[0] and t + 1 == 11
    obs, reward, terminated, truncated, infos = env.step(np.array([3], np.int32))
    assert reward[0] == 0 and not terminated[0] and not truncated[0]
    assert infos['elapsed_step'][0] == 0  # A new game.
    for c in range(3):
      np.testing.assert_array_equal(obs[0, ..., c], obs[0, ..., 3])
  finally:
    env.close()


class _Recording:
  """A policy that records what it is given (the observation, the action taken
  on the previous one, `first`) and the logits it returns."""

  def __init__(self, policy):
    self._policy = policy
    self.observations, self.actions, self.firsts, self.logits = [], [], [], []

  def initial_state(self, batch_size):
    return self._policy.initial_state(batch_size)

  def __call__(self, observation, prev_action, reward, first, state):
    logits, state = self._policy(observation, prev_action, reward, first, state)
    self.observations.append(np.array(observation))
    self.actions.append(np.array(prev_action))
    self.firsts.append(np.array(first))
    self.logits.append(np.array(logits))
    return logits, state


@pytest.mark.e2e
@needs_envpool
def test_checkpoint_from_one_backend_evaluates_on_the_other(tmp_path, caplog):
  # pylint: disable=g-import-not-at-top
  from impala_tf import checkpoints
  from impala_tf import driver
  from impala_tf import episodes
  from impala_tf import policies
  from impala_tf import testing
  logdir = str(tmp_path / 'run')
  caplog.set_level('INFO')
  verbosity = absl_logging.get_verbosity()  # Earlier tests may have lowered it.
  absl_logging.set_verbosity(absl_logging.INFO)
  try:
    driver.train(testing.tiny_config(
        logdir=logdir, env='PongNoFrameskip-v4', env_backend='auto',
        network='shallow', noop_max=1, max_episode_frames=200, num_envs_per_actor=2,
        batch_size=2, unroll_length=5, total_environment_frames=80))
  finally:
    absl_logging.set_verbosity(verbosity)
  # The backend 'auto' chose is what the run records and logs first.
  config, network, _ = checkpoints.restore_network(logdir)
  assert config.env_backend == 'envpool'
  logged = [r.getMessage() for r in caplog.records if r.name == 'absl']
  assert logged[0].startswith('Training PongNoFrameskip-v4 on envpool: '), logged[:3]
  games = {}
  for backend in ('gymnasium', 'envpool'):
    policy = _Recording(policies.NetworkPolicy(network))
    # Sampled actions (seeded: the same draws on both) exercise more of the game
    # than this barely trained net's greedy action.
    result = episodes.run_episodes(config.replace(env_backend=backend), policy,
                                   num_episodes=2, seed=3)
    games[backend] = (result, policy)
  (gym_result, gym_seen), (pool_result, pool_seen) = (games['gymnasium'],
                                                      games['envpool'])
  # Deterministic game, the same policy and draws: the same games, step by step.
  assert pool_result['episode_lengths'] == [50, 50]  # 200 frames / 4.
  for key in ('episode_returns', 'episode_lengths'):
    assert pool_result[key] == gym_result[key]
  # The policy saw each episode's 50 observations before its last (both games
  # end at once; the last, where the backends max-pool different leftover
  # frames as the time limit stops the ALE inside its 4-frame step, is not
  # acted on): the same observations, logits and actions taken on them.
  assert len(pool_seen.observations) == len(gym_seen.observations) == 50
  np.testing.assert_array_equal(np.stack(pool_seen.firsts),
                                np.stack(gym_seen.firsts))
  for t in range(50):
    np.testing.assert_array_equal(pool_seen.observations[t],
                                  gym_seen.observations[t], err_msg=f'step {t}')
    np.testing.assert_array_equal(pool_seen.logits[t], gym_seen.logits[t],
                                  err_msg=f'step {t}')
    np.testing.assert_array_equal(pool_seen.actions[t], gym_seen.actions[t],
                                  err_msg=f'step {t}')
  assert len(np.unique(np.stack(gym_seen.actions[1:]))) > 2
  # And not a game that stood still: its frames changed along the way.
  assert not np.array_equal(gym_seen.observations[10], gym_seen.observations[40])


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
