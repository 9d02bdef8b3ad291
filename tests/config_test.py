"""Tests of impala_tf/config.py: validation, schedules, serialisation."""

import dataclasses
import json

import numpy as np
import pytest

from impala_tf import config as config_lib

Config = config_lib.Config
ConfigError = config_lib.ConfigError

# Bad Config fields: (changes to Config(), field named, value as the message writes
# it). Each raises ConfigError with the one-line message `field=value: allowed`.
CONFIG_ERRORS = [
    # Ranges of single fields.
    (dict(env=' '), 'env', ' '),
    (dict(env_vectorization='threads'), 'env_vectorization', 'threads'),
    (dict(env_backend='pool'), 'env_backend', 'pool'),
    (dict(envpool_num_threads=-1), 'envpool_num_threads', '-1'),
    (dict(learner_steps_per_call=0), 'learner_steps_per_call', '0'),
    (dict(learner_jit='xla'), 'learner_jit', 'xla'),
    # XLA cannot compile a sum over replicas before the gradient (PopArt's).
    (dict(learner_jit='on', num_virtual_cpu_devices=2, popart=True),
     'learner_jit', 'on'),
    (dict(noop_max=-1), 'noop_max', '-1'),
    (dict(frame_stack=0), 'frame_stack', '0'),
    (dict(max_episode_frames=0), 'max_episode_frames', '0'),
    (dict(env_step_timeout_secs=0), 'env_step_timeout_secs', '0'),
    (dict(num_actors=0), 'num_actors', '0'),
    (dict(num_envs_per_actor=2.5), 'num_envs_per_actor', '2.5'),
    (dict(unroll_length=True), 'unroll_length', 'True'),
    (dict(broadcast_interval=0), 'broadcast_interval', '0'),
    (dict(actor_backend='procs'), 'actor_backend', 'procs'),
    (dict(actor_refresh='always'), 'actor_refresh', 'always'),
    (dict(ray_address='10.0.0.1: 6379'), 'ray_address', '10.0.0.1: 6379'),
    (dict(ray_connect_timeout_secs=0), 'ray_connect_timeout_secs', '0'),
    (dict(ray_actor_resources='{"CPU": -1}'), 'ray_actor_resources', '{"CPU": -1}'),
    (dict(max_actor_restarts=-1), 'max_actor_restarts', '-1'),
    (dict(actor_unroll_timeout_secs=0), 'actor_unroll_timeout_secs', '0'),
    (dict(ray_placement_timeout_secs=-1), 'ray_placement_timeout_secs', '-1'),
    (dict(ray_runtime_env='working_dir=.'), 'ray_runtime_env', 'working_dir=.'),
    (dict(ray_runtime_env='["."]'), 'ray_runtime_env', '["."]'),
    (dict(ray_runtime_env='{"conda": "x"}'), 'ray_runtime_env', '{"conda": "x"}'),
    (dict(ray_runtime_env='{"py_modules": "m"}'), 'ray_runtime_env',
     '{"py_modules": "m"}'),
    (dict(ray_actor_resources='CPU=1'), 'ray_actor_resources', 'CPU=1'),
    (dict(ray_actor_resources='[1]'), 'ray_actor_resources', '[1]'),
    (dict(ray_actor_resources='{"CPU": "1"}'), 'ray_actor_resources',
     '{"CPU": "1"}'),
    (dict(batch_size=0), 'batch_size', '0'),
    (dict(num_data_loader_buffers=0), 'num_data_loader_buffers', '0'),
    (dict(minibatch_buffer_size=0), 'minibatch_buffer_size', '0'),
    (dict(num_sgd_iter=0), 'num_sgd_iter', '0'),
    (dict(learner_queue_size=0), 'learner_queue_size', '0'),
    (dict(stall_timeout_secs=-1.0), 'stall_timeout_secs', '-1.0'),
    (dict(replay_proportion=float('inf')), 'replay_proportion', 'inf'),
    (dict(replay_proportion=-0.5), 'replay_proportion', '-0.5'),
    (dict(replay_buffer_num_slots=-1), 'replay_buffer_num_slots', '-1'),
    (dict(learner_queue_timeout=-1.0), 'learner_queue_timeout', '-1.0'),
    (dict(num_gpus=-1), 'num_gpus', '-1'),
    (dict(num_virtual_cpu_devices=-2), 'num_virtual_cpu_devices', '-2'),
    (dict(tf_inter_op_threads=-2), 'tf_inter_op_threads', '-2'),
    (dict(num_learner_workers=0), 'num_learner_workers', '0'),
    (dict(learner_worker_timeout_secs=0), 'learner_worker_timeout_secs', '0'),
    (dict(learner_backend='k8s'), 'learner_backend', 'k8s'),
    (dict(ray_learner_resources='{"GPU": -1}'), 'ray_learner_resources',
     '{"GPU": -1}'),
    (dict(learner_backend='ray', num_learner_workers=2, num_gpus=2,
          batch_size=8, ray_learner_resources='{"CPU": 1, "GPU": 1}'),
     'ray_learner_resources', '{"CPU": 1, "GPU": 1}'),
    (dict(discounting=-0.1), 'discounting', '-0.1'),
    (dict(discounting=1.5), 'discounting', '1.5'),
    (dict(baseline_cost=-1.0), 'baseline_cost', '-1.0'),
    (dict(entropy_cost=float('nan')), 'entropy_cost', 'nan'),
    (dict(entropy_cost_schedule='linear,'), 'entropy_cost_schedule', 'linear,'),
    (dict(entropy_cost_schedule='0:0.01,1e6:-0.001'), 'entropy_cost_schedule',
     '0:0.01,1e6:-0.001'),
    (dict(clip_rho_threshold=0.0), 'clip_rho_threshold', '0.0'),
    (dict(clip_pg_rho_threshold=float('nan')), 'clip_pg_rho_threshold', 'nan'),
    (dict(vtrace_lambda=1.01), 'vtrace_lambda', '1.01'),
    (dict(reward_clipping='clip'), 'reward_clipping', 'clip'),
    (dict(reward_scale=0.0), 'reward_scale', '0.0'),
    (dict(loss_reduction='avg'), 'loss_reduction', 'avg'),
    (dict(popart=1), 'popart', '1'),
    (dict(popart_beta=0.0), 'popart_beta', '0.0'),
    (dict(popart_sigma_floor=-0.1), 'popart_sigma_floor', '-0.1'),
    (dict(normalize_advantages=0), 'normalize_advantages', '0'),
    (dict(ppo_clip=1.0), 'ppo_clip', '1.0'),
    (dict(ppo_clip=-0.1), 'ppo_clip', '-0.1'),
    (dict(rmsprop_style='keras'), 'rmsprop_style', 'keras'),
    (dict(weight_init='he'), 'weight_init', 'he'),
    (dict(torso_activation='gelu'), 'torso_activation', 'gelu'),
    (dict(compute_dtype='float16'), 'compute_dtype', 'float16'),
    (dict(compute_dtype='bfloat16', network='my_mod:torso'), 'compute_dtype',
     'bfloat16'),
    (dict(shared_torso='yes'), 'shared_torso', 'yes'),
    (dict(eval_interval_frames=-1), 'eval_interval_frames', '-1'),
    (dict(eval_episodes=0), 'eval_episodes', '0'),
    (dict(eval_greedy=None), 'eval_greedy', 'None'),
    (dict(popart_beta=1.5), 'popart_beta', '1.5'),
    (dict(loss_term_grad_norms='yes'), 'loss_term_grad_norms', 'yes'),
    (dict(shared_torso=False, network='deep'), 'shared_torso', 'False'),
    (dict(shared_torso=False, use_lstm=True), 'shared_torso', 'False'),
    (dict(optimizer='sgd'), 'optimizer', 'sgd'),
    (dict(learning_rate=-0.001), 'learning_rate', '-0.001'),
    (dict(learning_rate=0), 'learning_rate', '0'),
    (dict(lr_schedule='exponential'), 'lr_schedule', 'exponential'),
    (dict(lr_schedule='0:1,0:0.5'), 'lr_schedule', '0:1,0:0.5'),
    (dict(lr_schedule='1000:0.1,500:0.01'), 'lr_schedule', '1000:0.1,500:0.01'),
    (dict(lr_schedule='0:-0.1'), 'lr_schedule', '0:-0.1'),
    (dict(lr_schedule='-1:0.1'), 'lr_schedule', '-1:0.1'),
    (dict(lr_schedule='0:inf'), 'lr_schedule', '0:inf'),
    (dict(lr_schedule='0:nan'), 'lr_schedule', '0:nan'),
    (dict(lr_schedule='1e999:0.1'), 'lr_schedule', '1e999:0.1'),
    (dict(lr_schedule='0:0.1,1e6'), 'lr_schedule', '0:0.1,1e6'),
    (dict(lr_schedule='0:0.1:1'), 'lr_schedule', '0:0.1:1'),
    (dict(lr_schedule='0:0.1,,1e6:0'), 'lr_schedule', '0:0.1,,1e6:0'),
    (dict(lr_schedule=''), 'lr_schedule', ''),
    (dict(lr_schedule='a:b'), 'lr_schedule', 'a:b'),
    (dict(rmsprop_decay=1), 'rmsprop_decay', '1'),
    (dict(rmsprop_momentum=1.0), 'rmsprop_momentum', '1.0'),
    (dict(rmsprop_epsilon=0.0), 'rmsprop_epsilon', '0.0'),
    (dict(adam_beta1=-0.1), 'adam_beta1', '-0.1'),
    (dict(adam_beta2=1.0), 'adam_beta2', '1.0'),
    (dict(adam_epsilon=0), 'adam_epsilon', '0'),
    (dict(grad_clip=-1.0), 'grad_clip', '-1.0'),
    (dict(max_nonfinite_updates=0), 'max_nonfinite_updates', '0'),
    (dict(network='resnet'), 'network', 'resnet'),
    (dict(network='my_mod:'), 'network', 'my_mod:'),
    (dict(network=':torso'), 'network', ':torso'),
    (dict(network='a:b:c'), 'network', 'a:b:c'),
    (dict(network='my-mod:torso'), 'network', 'my-mod:torso'),
    (dict(network='my_mod.torso'), 'network', 'my_mod.torso'),
    (dict(mlp_hidden_sizes=()), 'mlp_hidden_sizes', ''),
    (dict(mlp_hidden_sizes=(64, -1)), 'mlp_hidden_sizes', '64,-1'),
    (dict(mlp_hidden_sizes=[64, 0]), 'mlp_hidden_sizes', '64,0'),
    (dict(lstm_size=0), 'lstm_size', '0'),
    (dict(total_environment_frames=0), 'total_environment_frames', '0'),
    (dict(target_return=float('inf')), 'target_return', 'inf'),
    (dict(seed=2**31), 'seed', str(2**31)),
    (dict(seed=-1), 'seed', '-1'),
    (dict(logdir=''), 'logdir', ''),
    (dict(checkpoint_interval_secs=0), 'checkpoint_interval_secs', '0'),
    (dict(log_interval_secs=0), 'log_interval_secs', '0'),
    (dict(keep_checkpoints=0), 'keep_checkpoints', '0'),
    # Wrong Python types.
    (dict(batch_size='32'), 'batch_size', '32'),
    (dict(batch_size=32.0), 'batch_size', '32.0'),
    (dict(total_environment_frames=1e6), 'total_environment_frames', '1000000.0'),
    (dict(mlp_hidden_sizes=64), 'mlp_hidden_sizes', '64'),
    (dict(mlp_hidden_sizes='64,64'), 'mlp_hidden_sizes', '64,64'),
    (dict(mlp_hidden_sizes=(64, 32.0)), 'mlp_hidden_sizes', '64,32.0'),
    (dict(mlp_hidden_sizes=(64, True)), 'mlp_hidden_sizes', '64,True'),
    (dict(use_lstm='false'), 'use_lstm', 'false'),
    (dict(vtrace=1), 'vtrace', '1'),
    (dict(episodic_life=None), 'episodic_life', 'None'),
    (dict(claim_queue_slots='yes'), 'claim_queue_slots', 'yes'),
    (dict(learning_rate='0.001'), 'learning_rate', '0.001'),
    (dict(discounting=True), 'discounting', 'True'),
    (dict(clip_rho_threshold='none'), 'clip_rho_threshold', 'none'),
    (dict(target_return='200'), 'target_return', '200'),
    (dict(env=None), 'env', 'None'),
    (dict(optimizer=None), 'optimizer', 'None'),
    (dict(network=['mlp']), 'network', "'mlp'"),
    (dict(lr_schedule=0.1), 'lr_schedule', '0.1'),
    (dict(entropy_cost_schedule=None), 'entropy_cost_schedule', 'None'),
    (dict(logdir=pytest), 'logdir', str(pytest)),
    # Cross-field rules.
    (dict(num_gpus=2, batch_size=33), 'batch_size', '33'),
    (dict(num_gpus=4, batch_size=30), 'batch_size', '30'),
    (dict(num_virtual_cpu_devices=5, batch_size=32), 'batch_size', '32'),
    (dict(num_gpus=2, num_virtual_cpu_devices=2), 'num_virtual_cpu_devices', '2'),
    (dict(num_learner_workers=2, batch_size=9), 'batch_size', '9'),
    (dict(num_learner_workers=2, num_gpus=2, batch_size=6), 'batch_size', '6'),
    (dict(num_learner_workers=2, num_virtual_cpu_devices=2), 'num_virtual_cpu_devices',
     '2'),
    (dict(replay_proportion=1.0), 'replay_buffer_num_slots', '0'),
    (dict(replay_proportion=0.01), 'replay_buffer_num_slots', '0'),
    (dict(replay_proportion=4.5, replay_buffer_num_slots=3),
     'replay_buffer_num_slots', '3'),
    (dict(batch_size=64, unroll_length=100, total_environment_frames=6399),
     'total_environment_frames', '6399'),
    (dict(actor_refresh='step', actor_backend='ray'), 'actor_refresh', 'step'),
]

# Good values, each accepted (changes to Config(), and what the field then holds).
GOOD_VALUES = [
    dict(actor_refresh='step'),
    dict(actor_refresh='step', actor_backend='processes'),
    dict(actor_backend='ray', ray_address='auto'),
    dict(actor_backend='ray', ray_address='10.0.0.1:6379',
         ray_actor_resources='{"CPU": 0.5, "actor_node": 1}'),
    dict(ray_actor_resources='{}'),
    dict(clip_rho_threshold=None, clip_pg_rho_threshold=None),
    dict(clip_rho_threshold=100, clip_pg_rho_threshold=0.5),
    dict(target_return=None),
    dict(target_return=-21),
    dict(target_return=475.0),
    dict(lr_schedule='linear', entropy_cost_schedule='linear'),
    dict(lr_schedule='0:0.001,1e6:0.0001', entropy_cost_schedule='0:0.01'),
    dict(lr_schedule='0:0.001,1E6:0.0005,1e+7:0'),
    dict(lr_schedule=' 0 : 1 , 1_000 : 0.5 '),
    dict(entropy_cost_schedule='0:0,5e5:0.01'),
    dict(mlp_hidden_sizes=(7,)),
    dict(network='my_torsos:keras_mlp'),  # MODULE:FUNCTION, imported at run time.
    dict(network='pkg.sub_2.nets:Torso_1', use_lstm=True),
    dict(mlp_hidden_sizes=[256, 128, 32]),
    dict(learning_rate=1, discounting=0, vtrace_lambda=0, grad_clip=0,
         entropy_cost=0, baseline_cost=0),
    dict(discounting=1.0, vtrace_lambda=1),
    dict(replay_proportion=0.5, replay_buffer_num_slots=1),
    dict(replay_proportion=3, replay_buffer_num_slots=3),
    dict(replay_proportion=0.0, replay_buffer_num_slots=10),
    dict(num_gpus=2, batch_size=32),
    dict(num_virtual_cpu_devices=4, batch_size=8),
    dict(num_virtual_cpu_devices=1, batch_size=7),
    dict(learner_jit='on', popart=True),  # One replica: the sums are identities.
    dict(learner_jit='on', num_virtual_cpu_devices=2, popart=False),
    dict(learner_steps_per_call=16),
    dict(batch_size=8, unroll_length=10, total_environment_frames=80),
    dict(seed=2**31 - 1, noop_max=0, use_lstm=True, vtrace=False, episodic_life=True),
    dict(env='impala_tf.testing:ImpalaChain-v0', env_vectorization='async',
         network='deep', optimizer='rmsprop', reward_clipping='soft_asymmetric'),
]


@pytest.mark.parametrize('changes,field,value', CONFIG_ERRORS)
def test_config_errors(changes, field, value):
  with pytest.raises(ConfigError) as info:
    Config(**changes)
  message = str(info.value)
  assert info.value.field == field
  assert message.startswith(f'{field}={value}: '), message
  assert '\n' not in message
  assert len(message) > len(f'{field}={value}: ') + 5  # Says what is allowed.
  assert isinstance(info.value, ValueError)


def test_the_table_is_large_and_covers_most_fields():
  assert len(CONFIG_ERRORS) >= 25
  named = {field for _, field, _ in CONFIG_ERRORS}
  bools = {'episodic_life', 'vtrace', 'use_lstm'}
  assert {f.name for f in dataclasses.fields(Config)} - named <= bools


@pytest.mark.parametrize('field', [f.name for f in dataclasses.fields(Config)])
def test_every_field_rejects_a_wrong_type(field):
  with pytest.raises(ConfigError) as info:
    Config(**{field: object()})
  assert info.value.field == field
  assert str(info.value).startswith(f'{field}=<object object at ')
  assert str(info.value).endswith('(got object)')


@pytest.mark.parametrize('changes', GOOD_VALUES)
def test_good_values(changes):
  cfg = Config(**changes)
  for field, value in changes.items():
    if isinstance(value, list):
      value = tuple(value)
    assert getattr(cfg, field) == value, field


def test_ray_actor_resources_dict():
  assert Config().ray_actor_resources_dict == {'CPU': 1.0}
  cfg = Config(ray_actor_resources='{"CPU": 2, "GPU": 0.25, "node_a": 1}')
  assert cfg.ray_actor_resources_dict == {'CPU': 2.0, 'GPU': 0.25, 'node_a': 1.0}
  assert Config(ray_actor_resources='{}').ray_actor_resources_dict == {}


def test_defaults_are_valid():
  cfg = Config()
  assert cfg.mlp_hidden_sizes == (64, 64)
  # The learning rate falls to a quarter of --learning_rate by 20% of the run, a
  # twentieth by half, 0 at the end; the entropy cost to 0 by 20%.
  np.testing.assert_allclose(
      cfg.lr_schedule_points,
      ((0.0, 2e-3), (2e5, 5e-4), (5e5, 1e-4), (1e6, 0.0)))
  np.testing.assert_allclose(cfg.entropy_cost_schedule_points,
                             ((0.0, 0.01), (2e5, 0.0)))
  assert cfg.popart and cfg.popart_beta == 0.01


def test_list_becomes_tuple_and_config_is_hashable():
  cfg = Config(mlp_hidden_sizes=[8, 4])
  assert cfg.mlp_hidden_sizes == (8, 4)
  assert isinstance(cfg.mlp_hidden_sizes, tuple)
  assert hash(cfg) == hash(Config(mlp_hidden_sizes=(8, 4)))


def test_frozen():
  with pytest.raises(dataclasses.FrozenInstanceError):
    Config().batch_size = 4  # pytype: disable=not-writable


def test_json_round_trip():
  cfg = Config(env='ALE/Pong-v5', clip_rho_threshold=None, target_return=20.5,
               mlp_hidden_sizes=(32, 16), use_lstm=True, lr_schedule='0:1e-3,1e6:0',
               replay_proportion=1.5, replay_buffer_num_slots=8, num_gpus=2)
  text = cfg.to_json()
  d = json.loads(text)
  assert d['mlp_hidden_sizes'] == [32, 16]
  assert d['clip_rho_threshold'] is None
  assert list(d) == sorted(d)
  assert set(d) == {f.name for f in dataclasses.fields(Config)}
  assert Config.from_dict(d) == cfg
  assert Config.from_dict(cfg.to_dict()) == cfg
  assert Config.from_dict(json.loads(Config().to_json())) == Config()


def test_from_dict_missing_keys_take_defaults():
  assert Config.from_dict({'batch_size': 8}) == Config(batch_size=8)
  assert Config.from_dict({}) == Config()


def test_from_dict_unknown_key_is_named():
  with pytest.raises(ConfigError) as info:
    Config.from_dict({'batch_size': 8, 'batchsize': 8})
  assert info.value.field == 'batchsize'
  assert str(info.value).startswith('batchsize=8: is not a Config field')
  assert 'did you mean batch_size?' in str(info.value)
  with pytest.raises(ConfigError, match='^zzz=1: is not a Config field$'):
    Config.from_dict({'zzz': 1})


def test_from_dict_validates():
  with pytest.raises(ConfigError) as info:
    Config.from_dict({'batch_size': 0})
  assert info.value.field == 'batch_size'


@pytest.mark.parametrize('changes,replicas', [
    (dict(), 1),
    (dict(num_gpus=1), 1),
    (dict(num_gpus=2), 2),
    (dict(num_gpus=8), 8),
    (dict(num_virtual_cpu_devices=1), 1),
    (dict(num_virtual_cpu_devices=4), 4),
])
def test_num_replicas(changes, replicas):
  assert Config(**changes).num_replicas == replicas


def test_replace_revalidates():
  cfg = Config(batch_size=32)
  new = cfg.replace(batch_size=64, num_gpus=2)
  assert (new.batch_size, new.num_gpus) == (64, 2)
  assert cfg.batch_size == 32  # Unchanged.
  with pytest.raises(ConfigError) as info:
    cfg.replace(batch_size=0)
  assert info.value.field == 'batch_size'
  with pytest.raises(ConfigError) as info:
    cfg.replace(num_gpus=3)  # 32 unrolls over 3 replicas: a cross-field rule.
  assert info.value.field == 'batch_size'
  with pytest.raises(ConfigError) as info:
    cfg.replace(mlp_hidden_sizes=64)
  assert info.value.field == 'mlp_hidden_sizes'
  assert cfg.replace(mlp_hidden_sizes=[3]).mlp_hidden_sizes == (3,)


def test_replace_unknown_field_is_named():
  with pytest.raises(ConfigError) as info:
    Config().replace(learningrate=0.1)
  assert info.value.field == 'learningrate'
  assert 'did you mean learning_rate?' in str(info.value)


@pytest.mark.parametrize('spec,expected', [
    ('constant', 'constant'),
    ('linear', 'linear'),
    ('0:0.01', ((0.0, 0.01),)),
    ('0:0.01,1e6:0.001', ((0.0, 0.01), (1e6, 0.001))),
    ('0:1,1E6:0.5,1e+7:0', ((0.0, 1.0), (1e6, 0.5), (1e7, 0.0))),
    ('100:2, 2_000 : 1.5e-1', ((100.0, 2.0), (2000.0, 0.15))),
    ('-0:-0', ((0.0, 0.0),)),
    # Unresolved (no total frames, no base value): the numbers as written.
    ('0%:1x,30%:0.15x,100%:0x', ((0.0, 1.0), (30.0, 0.15), (100.0, 0.0))),
    ('0:2e-3, 1e6 : 0.5x', ((0.0, 2e-3), (1e6, 0.5))),
])
def test_parse_schedule(spec, expected):
  points = config_lib.parse_schedule(spec, 'lr_schedule')
  assert points == expected
  if isinstance(points, tuple):
    for frames, value in points:
      assert isinstance(frames, float) and isinstance(value, float)
      assert str(frames)[0] != '-' and str(value)[0] != '-'


@pytest.mark.parametrize('spec', [
    'Linear', 'cosine', '', ',', '0:1,', '0', '0:', ':1', '0:1:2', 'a:1', '1:b',
    '0:-1', '-5:1', '0:inf', 'inf:1', 'nan:1', '0:nan', '1e6:1,1e6:2', '2:1,1:1',
    '0%:1,1e6:0', '50%:1x,10%:0', '0:1xx', '%:1', '0:x', '-1%:1',
    None, 0.1, ('0', '1'),
])
def test_parse_schedule_errors(spec):
  with pytest.raises(ConfigError) as info:
    config_lib.parse_schedule(spec, 'entropy_cost_schedule')
  assert info.value.field == 'entropy_cost_schedule'
  assert info.value.value == spec
  message = str(info.value)
  assert message.startswith('entropy_cost_schedule=')
  assert "must be 'constant', 'linear' or piecewise-linear points" in message
  assert '\n' not in message


def test_relative_schedules_follow_the_base_value_and_the_run_length():
  cfg = Config(learning_rate=4e-3, total_environment_frames=2_000_000,
               lr_schedule='0%:1x,30%:0.15x,100%:0x', entropy_cost=0.02,
               entropy_cost_schedule='0%:1x,25%:0')
  np.testing.assert_allclose(cfg.lr_schedule_points,
                             ((0.0, 4e-3), (6e5, 6e-4), (2e6, 0.0)))
  np.testing.assert_allclose(cfg.entropy_cost_schedule_points,
                             ((0.0, 0.02), (5e5, 0.0)))
  with pytest.raises(ConfigError, match='all percentages'):
    Config(lr_schedule='0%:1x,1e6:0')


def test_schedule_points_properties():
  cfg = Config(lr_schedule='0:1e-3,1e6:0', entropy_cost_schedule='linear')
  assert cfg.lr_schedule_points == ((0.0, 1e-3), (1e6, 0.0))
  assert cfg.entropy_cost_schedule_points == 'linear'


def test_config_error_attributes():
  error = ConfigError('batch_size', 30, 'must be even')
  assert (error.field, error.value, error.allowed) == ('batch_size', 30, 'must be even')
  assert str(error) == 'batch_size=30: must be even'
  assert str(ConfigError('mlp_hidden_sizes', (8, 4), 'x')) == 'mlp_hidden_sizes=8,4: x'


def test_user_network_spelling():
  assert config_lib.is_user_network('pkg.nets:torso')
  for value in ('mlp', 'auto', 'pkg.nets', 'pkg:', 'a:b:c', None, 3):
    assert not config_lib.is_user_network(value), value
  with pytest.raises(ConfigError, match='MODULE:FUNCTION naming your own torso'):
    Config(network='deep_torso')


# --- one place per field: config.option ----------------------------------------


def _option_problems(field: dataclasses.Field):
  """What a field defined without a complete `config.option` lacks."""
  meta = field.metadata
  problems = []
  if not (isinstance(meta.get('help'), str) and meta['help'].strip()):
    problems.append(f'{field.name}: no help')
  if meta.get('section') not in [key for key, _ in config_lib.SECTIONS]:
    problems.append(f'{field.name}: section {meta.get("section")!r} is not in '
                    'config.SECTIONS')
  if meta.get('resume') not in config_lib.RESUME_POLICIES:
    problems.append(f'{field.name}: resume policy {meta.get("resume")!r} is not '
                    f'one of {config_lib.RESUME_POLICIES}')
  rule = meta.get('rule')
  if not (isinstance(rule, tuple) and len(rule) == 2 and
          (rule[0] is None or callable(rule[0])) and
          str(rule[1]).startswith('must be')):
    problems.append(f'{field.name}: no rule (predicate, "must be ...")')
  return problems


@pytest.mark.parametrize('field', dataclasses.fields(config_lib.Config),
                         ids=lambda f: f.name)
def test_every_field_has_help_section_rule_and_resume_policy(field):
  assert not _option_problems(field)


def test_a_field_without_an_option_is_reported():

  @dataclasses.dataclass(frozen=True)
  class Bare:
    seed: int = 0
    env: str = config_lib.option('x', 'nowhere', help='', rule=None,
                                 resume='sometimes')

  seed, env = dataclasses.fields(Bare)
  assert _option_problems(seed) == [
      'seed: no help', "seed: section None is not in config.SECTIONS",
      f"seed: resume policy None is not one of {config_lib.RESUME_POLICIES}",
      'seed: no rule (predicate, "must be ...")']
  assert _option_problems(env) == [
      'env: no help', "env: section 'nowhere' is not in config.SECTIONS",
      f"env: resume policy 'sometimes' is not one of {config_lib.RESUME_POLICIES}",
      'env: no rule (predicate, "must be ...")']


def test_enum_rules_agree_with_their_choices():
  for f in dataclasses.fields(config_lib.Config):
    choices = f.metadata['choices']
    if not choices:
      continue
    for value in choices:
      config_lib.Config(**{f.name: value})  # Each choice is valid...
    with pytest.raises(config_lib.ConfigError, match=f'^{f.name}=not_a_choice'):
      config_lib.Config(**{f.name: 'not_a_choice'})  # ...and only those.
