"""Tests of impala_tf.ray_actor: the body of one Ray actor and its checks.

An `ImpalaActor` built in this process (no actor process), on a local Ray shared
by the module: it hides GPUs unless Ray gave it one, checks the driver's versions
and the weights it is sent; `root_cause` of an exception the driver could not
rebuild.
"""

import os
import sys

import pytest
import ray
import tensorflow as tf

from impala_tf import networks
from impala_tf import ray_actor

# What the Ray tests share; pytest finds a fixture by its name in this module.
import ray_testing
from ray_testing import local_ray  # pylint: disable=unused-import

_config = ray_testing.ray_config
_spaces = ray_testing.spaces
_weights = ray_testing.weights
_rngs = ray_testing.rngs


def _actor_args(config, actor_id=0):
  """The positional arguments RayActorPool gives ImpalaActor."""
  rng = _rngs(config)[actor_id]
  return (config.to_dict(), actor_id, 0, *_spaces(config), rng.state.numpy(),
          rng.algorithm, 1)


@pytest.mark.parametrize('gpu_ids', [[], [0]])
def test_actor_hides_gpus_unless_ray_gave_it_one(monkeypatch, gpu_ids):
  # Ray 2.60 leaves CUDA_VISIBLE_DEVICES as the node's for an actor without a GPU.
  monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0,1')
  monkeypatch.setattr(ray, 'get_gpu_ids', lambda: list(gpu_ids))
  hidden = []
  for setter in ('set_intra_op_parallelism_threads',
                 'set_inter_op_parallelism_threads'):  # TF already started here.
    monkeypatch.setattr(tf.config.threading, setter, lambda n: None)
  monkeypatch.setattr(tf.config, 'set_visible_devices',
                      lambda devices, kind=None: hidden.append((devices, kind)))
  actor = ray_actor.ImpalaActor(*_actor_args(_config()))
  del actor
  if gpu_ids:
    assert hidden == [] and os.environ['CUDA_VISIBLE_DEVICES'] == '0,1'
  else:
    assert hidden == [([], 'GPU')] and os.environ['CUDA_VISIBLE_DEVICES'] == ''


def _unroll_in_process(config, spec_edit=None, **actor_kwargs):
  """One unroll of an ImpalaActor built in this process (no actor process)."""
  actor = ray_actor.ImpalaActor(*_actor_args(config), **actor_kwargs)
  obs_space, action_space = _spaces(config)
  net = networks.make_network(config, obs_space, action_space)
  spec = ray_actor.weight_spec(net.variables)
  if spec_edit:
    spec = spec_edit(spec)
  ref = ray.put((spec, [v.numpy() for v in net.variables]))
  return actor.unroll(0, [ref])


def test_actor_checks_the_driver_versions(local_ray):
  del local_ray
  config = _config()
  mine = ray_actor.local_versions()
  chunk, info = _unroll_in_process(config, driver_versions=dict(mine))
  assert chunk['reward'].shape == (4, 6) and info['steps'] == 20
  with pytest.raises(ray_actor.VersionMismatchError) as e:
    _unroll_in_process(config, driver_versions=dict(mine, impala_tf='0.0.1'))
  message = str(e.value)
  assert '\n' not in message
  assert f"impala_tf {mine['impala_tf']}" in message and 'impala_tf 0.0.1' in message


@pytest.mark.parametrize('edit,says', [
    (lambda spec: spec[::-1], 'agent/baseline/b [1]'),  # Same arrays, other order.
    (lambda spec: [('agent/x/w', s) if i == 0 else (n, s)
                   for i, (n, s) in enumerate(spec)], 'agent/x/w'),
    (lambda spec: spec[:-1], '{n} arrays for {n_1} variables'),
])
def test_actor_checks_weights_by_name_and_shape(local_ray, edit, says):
  del local_ray
  config = _config()
  n = len(_weights(config, seed=0))
  with pytest.raises(ray_actor.WeightsMismatchError) as e:
    _unroll_in_process(config, spec_edit=edit)
  says = says.format(n=n, n_1=n - 1)
  assert says in str(e.value) and '\n' not in str(e.value), str(e.value)


def test_root_cause_of_an_exception_the_driver_could_not_rebuild():
  # What ray.get raised for an env module missing on the actor's node.
  error = ray.exceptions.UnserializableException(
      'ray.exceptions.RayTaskError: ray::ImpalaActor.unroll() (pid=1, ip=127.0.0.1)\n'
      '  File "/x/impala_tf/ray_actor.py", line 594, in unroll\n'
      '    self._build()\n'
      '  File "/x/impala_tf/environments.py", line 214, in check_env_id\n'
      '    raise ConfigError(\'env\', env_id,\n'
      "impala_tf.config.ConfigError: env=m:E-v0: cannot import module 'm' named "
      "before the \":\": No module named 'm'\n")
  assert ray_actor.root_cause(error) == (
      "impala_tf.config.ConfigError: env=m:E-v0: cannot import module 'm' named "
      'before the ":": No module named \'m\' (at /x/impala_tf/environments.py:214 '
      'in check_env_id)')


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
