"""What the Ray tests share: a tiny CartPole config, its spaces, weights and RNGs,
and the fixtures `local_ray` (one local Ray of 2 CPUs for a test module) and
`no_ray` (no Ray initialised in this process, before and after the test).

A test module uses a fixture by importing it: `from ray_testing import local_ray`.
"""

import pytest
import ray
import tensorflow as tf

from impala_tf import actor_pool
from impala_tf import environments
from impala_tf import networks
from impala_tf import ray_session
from impala_tf import testing


# Timeouts are generous: a Ray actor process imports TensorFlow, which took up to
# 100 s on a 2-core machine at load 8 (CI shares its 2 cores between 2 test workers).
def ray_config(logdir='/tmp/unused', **overrides):
  """A tiny `--actor_backend=ray` CartPole Config (2 actors, 4 envs, T=5)."""
  base = dict(env='CartPole-v1', actor_backend='ray', num_actors=2,
              num_envs_per_actor=4, unroll_length=5, batch_size=4,
              learner_queue_size=2, learner_queue_timeout=300.0,
              total_environment_frames=2000, log_interval_secs=0.3, logdir=logdir)
  base.update(overrides)
  return testing.tiny_config(**base)


@pytest.fixture(scope='module')
def local_ray():
  """A local Ray of 2 CPUs, started for the test module and shut down after."""
  session = ray_session.RaySession('', num_cpus=2)
  assert session.started
  yield session
  session.close()


def spaces(config):
  """(observation space, action space) of one env of `config`."""
  return environments.env_spaces(config.env)


def weights(config, seed):
  """The initial weights (numpy arrays) of `config`'s network with `seed`."""
  obs_space, action_space = spaces(config)
  net = networks.make_network(config.replace(seed=seed), obs_space, action_space)
  return [v.numpy() for v in net.variables]


def rngs(config):
  """Each actor's sampling tf.random.Generator, as the driver seeds it."""
  return [tf.random.Generator.from_seed(actor_pool.actor_rng_seed(config, i))
          for i in range(config.num_actors)]


@pytest.fixture
def no_ray():
  """No Ray initialised in this process, before and after the test."""
  if ray.is_initialized():
    ray.shutdown()  # The module's local instance (its fixture's close is a no-op).
  yield
  if ray.is_initialized():
    ray.shutdown()
