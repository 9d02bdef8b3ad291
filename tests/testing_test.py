"""The test helpers of impala_tf/testing.py do what their docstring says."""

import os
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest

from impala_tf import config as config_lib
from impala_tf import environments
from impala_tf import testing

import helpers

REPO = helpers.REPO


def _target(obs):
  """The rewarded action: the brightest channel-0 quadrant's index mod 3."""
  quads = [obs[:18, :18, 0].mean(), obs[:18, 18:, 0].mean(),
           obs[18:, :18, 0].mean(), obs[18:, 18:, 0].mean()]
  return int(np.argmax(quads)) % 3


def _run_episode(env, policy=lambda obs: 0, max_steps=1000):
  """Steps one env to the end of an episode; returns (rewards, terminated, truncated)."""
  obs, _ = env.reset(seed=0)
  rewards = []
  for _ in range(max_steps):
    obs, reward, terminated, truncated, _ = env.step(policy(obs))
    rewards.append(reward)
    if terminated or truncated:
      return rewards, terminated, truncated
  raise AssertionError(f'no episode end in {max_steps} steps')


def test_ids():
  assert testing.CHAIN_ID == 'impala_tf.testing:ImpalaChain-v0'
  assert testing.CHAIN_TRUNCATED_ID == 'impala_tf.testing:ImpalaChainTruncated-v0'
  assert testing.FAKE_IMAGE_ID == 'impala_tf.testing:ImpalaFakeImage-v0'
  for env_id in ('ImpalaChain-v0', 'ImpalaChainTruncated-v0', 'ImpalaFakeImage-v0'):
    assert env_id in gym.registry, env_id


def test_register_twice_is_harmless():
  testing._register()  # pylint: disable=protected-access
  assert gym.registry['ImpalaChainTruncated-v0'].max_episode_steps == 5


@pytest.mark.parametrize('make', [testing.ChainEnv,
                                  lambda: gym.make(testing.CHAIN_ID)],
                         ids=['class', 'gym.make'])
def test_chain(make):
  env = make()
  assert env.observation_space.shape == (3,)
  assert env.observation_space.dtype == np.float32
  assert env.action_space == gym.spaces.Discrete(2)
  obs, _ = env.reset(seed=0)
  assert obs.dtype == np.float32
  np.testing.assert_array_equal(obs, [0.0, 1.0, -1.0])
  for episode in range(2):
    rewards, terminated, truncated = _run_episode(env, lambda obs: 1)
    assert rewards == [1.0] * 8, episode  # Return 8; terminated at step 8.
    assert terminated and not truncated
  env.close()


def test_chain_length():
  rewards, terminated, _ = _run_episode(testing.ChainEnv(length=3))
  assert len(rewards) == 3 and terminated


def test_chain_truncated():
  env = gym.make(testing.CHAIN_TRUNCATED_ID)
  for _ in range(2):
    rewards, terminated, truncated = _run_episode(env)
    assert rewards == [1.0] * 5
    assert truncated and not terminated
  env.close()


@pytest.mark.parametrize('make', [testing.FakeImageEnv,
                                  lambda: gym.make(testing.FAKE_IMAGE_ID)],
                         ids=['class', 'gym.make'])
def test_fake_image(make):
  env = make()
  assert env.observation_space == gym.spaces.Box(0, 255, (36, 36, 2), np.uint8)
  assert env.action_space == gym.spaces.Discrete(3)
  obs, _ = env.reset(seed=1)
  assert obs.shape == (36, 36, 2) and obs.dtype == np.uint8
  assert env.observation_space.contains(obs)
  targets = set()
  for step in range(1, 11):
    target = _target(obs)
    targets.add(target)
    action = target if step % 2 else (target + 1) % 3
    obs, reward, terminated, truncated, _ = env.step(action)
    assert obs.shape == (36, 36, 2) and obs.dtype == np.uint8
    assert reward == (1.0 if step % 2 else 0.0), step  # 1 iff action == target.
    assert terminated == (step == 10), step  # 10-step episodes.
    assert not truncated
  # A new episode after reset; observations are random images.
  obs2, _ = env.reset(seed=2)
  assert not np.array_equal(obs, obs2)
  env.close()


def test_fake_image_is_seeded():
  a, b = testing.FakeImageEnv(), testing.FakeImageEnv()
  np.testing.assert_array_equal(a.reset(seed=7)[0], b.reset(seed=7)[0])
  np.testing.assert_array_equal(a.step(0)[0], b.step(0)[0])


@pytest.mark.parametrize('vectorization', ['sync', 'auto'])
def test_make_vector_env_chain(vectorization):
  env = environments.make_vector_env(testing.CHAIN_ID, 3, seed=0,
                                     vectorization=vectorization)
  try:
    assert env.num_envs == 3
    assert env.single_observation_space.shape == (3,)
    actions = np.zeros(3, np.int64)
    for step in range(1, 9):
      _, reward, terminated, truncated, _ = env.step(actions)
      np.testing.assert_array_equal(reward, [1.0] * 3)
      assert terminated.all() == (step == 8) and not truncated.any()
    # NEXT_STEP autoreset: the next step starts a new episode with reward 0.
    obs, reward, terminated, _, _ = env.step(actions)
    np.testing.assert_array_equal(reward, [0.0] * 3)
    np.testing.assert_array_equal(obs[:, 0], [0.0] * 3)
    assert not terminated.any()
  finally:
    env.close()


def test_make_vector_env_chain_truncated():
  env = environments.make_vector_env(testing.CHAIN_TRUNCATED_ID, 2, seed=0,
                                     vectorization='sync')
  try:
    for step in range(1, 6):
      _, _, terminated, truncated, _ = env.step(np.zeros(2, np.int64))
      assert truncated.all() == (step == 5) and not terminated.any()
  finally:
    env.close()


def test_make_vector_env_fake_image():
  env = environments.make_vector_env(testing.FAKE_IMAGE_ID, 2, seed=0,
                                     vectorization='sync')
  try:
    assert env.single_observation_space.shape == (36, 36, 2)
    assert env.single_action_space == gym.spaces.Discrete(3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 36, 36, 2) and obs.dtype == np.uint8
    actions = np.array([_target(o) for o in obs])
    _, reward, _, _, _ = env.step(actions)
    np.testing.assert_array_equal(reward, [1.0, 1.0])
  finally:
    env.close()


@pytest.mark.e2e
def test_ids_work_in_a_fresh_process():
  """gymnasium imports impala_tf.testing itself, as with `--env=` on the CLI."""
  code = ('import gymnasium as gym\n'
          f'env = gym.make({testing.CHAIN_ID!r})\n'
          'env.reset(seed=0)\n'
          'print(env.step(0)[1])\n')
  env = dict(os.environ)
  env['PYTHONPATH'] = str(REPO) + os.pathsep + env.get('PYTHONPATH', '')
  result = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == '1.0'


def test_tiny_config():
  cfg = testing.tiny_config()
  assert isinstance(cfg, config_lib.Config)
  assert cfg.env == testing.CHAIN_ID
  assert cfg.num_actors == 1 and cfg.batch_size == 4 and cfg.unroll_length == 5
  assert cfg.total_environment_frames <= 1000
  assert cfg.mlp_hidden_sizes == (16,)


def test_tiny_config_overrides():
  cfg = testing.tiny_config(batch_size=8, use_lstm=True, env=testing.FAKE_IMAGE_ID)
  assert (cfg.batch_size, cfg.use_lstm, cfg.env) == (8, True, testing.FAKE_IMAGE_ID)
  assert cfg.unroll_length == testing.tiny_config().unroll_length  # Others kept.
  assert cfg == testing.tiny_config().replace(
      batch_size=8, use_lstm=True, env=testing.FAKE_IMAGE_ID)
  with pytest.raises(config_lib.ConfigError) as info:
    testing.tiny_config(batch_size=0)
  assert info.value.field == 'batch_size'


@pytest.mark.e2e
def test_processes_mentioning_finds_a_live_child_until_it_exits(tmp_path):
  token = str(tmp_path / 'marker')
  child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)',
                            token])
  try:
    # Popen returns once exec started; the kernel sets the new command line a
    # moment later.
    deadline = time.time() + 10
    while not testing.processes_mentioning(token) and time.time() < deadline:
      time.sleep(0.01)
    assert testing.processes_mentioning(token) == [child.pid]
    assert testing.process_alive(child.pid)
    child.kill()
    # Killed but not reaped: a zombie is not alive.
    for _ in range(100):
      if not testing.process_alive(child.pid):
        break
      time.sleep(0.05)
    assert not testing.process_alive(child.pid)
    assert testing.processes_mentioning(token) == []
  finally:
    child.kill()
    child.wait()
  assert not testing.process_alive(child.pid)
  assert os.getpid() not in testing.processes_mentioning(sys.executable)
