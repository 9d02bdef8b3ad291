"""Tests of impala_tf/flags.py, configs/*.cfg and docs/flags.md."""

import dataclasses
import importlib.metadata

from absl import flags as absl_flags
import pytest

from impala_tf import config as config_lib
from impala_tf import flags as impala_flags

import helpers

REPO = helpers.REPO
PROG = 'impala_tf.train'

# Flags users and the other modules rely on (a renamed flag breaks scripts).
REQUIRED_FLAGS = """
    env num_actors num_envs_per_actor env_vectorization env_backend unroll_length
    batch_size
    total_environment_frames target_return seed num_gpus num_virtual_cpu_devices
    num_data_loader_buffers minibatch_buffer_size num_sgd_iter replay_proportion
    replay_buffer_num_slots learner_queue_size learner_queue_timeout
    broadcast_interval optimizer learning_rate lr_schedule rmsprop_decay
    rmsprop_momentum rmsprop_epsilon adam_beta1 adam_beta2 adam_epsilon grad_clip
    discounting baseline_cost entropy_cost entropy_cost_schedule clip_rho_threshold
    clip_pg_rho_threshold vtrace_lambda vtrace reward_clipping network
    mlp_hidden_sizes use_lstm lstm_size logdir checkpoint_interval_secs
    keep_checkpoints log_interval_secs
""".split()

# Bad command lines: (flags after the program name, the flag the one error line must
# name). Each must end the program with status 2 and one stderr line
# `impala_tf.train: error: ...` containing that name, before anything runs. The
# first group fails in flag parsing, the rest in Config validation.
BAD_INPUTS = [
    # Flag parsing.
    (['--batchsize=32'], 'batchsize'),
    (['--batch_size=abc'], 'batch_size'),
    (['--batch_size=1.5'], 'batch_size'),
    (['--batch_size'], 'batch_size'),
    (['--learning_rate=fast'], 'learning_rate'),
    (['--optimizer=sgd'], 'optimizer'),
    (['--network=resnet'], 'network'),
    (['--reward_clipping=clip'], 'reward_clipping'),
    (['--env_vectorization=threads'], 'env_vectorization'),
    (['--env_backend=pool'], 'env_backend'),
    (['--use_lstm=maybe'], 'use_lstm'),
    (['--nouse_lstm=1'], 'use_lstm'),
    (['--use_lstm', 'false'], 'false'),
    (['--clip_rho_threshold=inf_please'], 'clip_rho_threshold'),
    (['--target_return=high'], 'target_return'),
    (['--mlp_hidden_sizes=64,x'], 'mlp_hidden_sizes'),
    (['--flagfile=/nonexistent/impala.cfg'], 'flagfile'),
    # Config validation: single fields.
    (['--env='], 'env'),
    (['--num_actors=0'], 'num_actors'),
    (['--num_envs_per_actor=-1'], 'num_envs_per_actor'),
    (['--unroll_length=0'], 'unroll_length'),
    (['--batch_size=0'], 'batch_size'),
    (['--num_sgd_iter=0'], 'num_sgd_iter'),
    (['--replay_proportion=-0.5'], 'replay_proportion'),
    (['--learner_queue_timeout=0'], 'learner_queue_timeout'),
    (['--num_gpus=-1'], 'num_gpus'),
    (['--discounting=1.5'], 'discounting'),
    (['--entropy_cost=-0.01'], 'entropy_cost'),
    (['--entropy_cost_schedule=cosine'], 'entropy_cost_schedule'),
    (['--clip_rho_threshold=0'], 'clip_rho_threshold'),
    (['--clip_pg_rho_threshold=-1'], 'clip_pg_rho_threshold'),
    (['--vtrace_lambda=2'], 'vtrace_lambda'),
    (['--learning_rate=0'], 'learning_rate'),
    (['--lr_schedule=1000:0.1,500:0.01'], 'lr_schedule'),
    (['--rmsprop_decay=1'], 'rmsprop_decay'),
    (['--adam_epsilon=0'], 'adam_epsilon'),
    (['--grad_clip=-40'], 'grad_clip'),
    (['--mlp_hidden_sizes=64,0'], 'mlp_hidden_sizes'),
    (['--mlp_hidden_sizes='], 'mlp_hidden_sizes'),
    (['--target_return=nan'], 'target_return'),
    (['--seed=-1'], 'seed'),
    (['--checkpoint_interval_secs=0'], 'checkpoint_interval_secs'),
    (['--keep_checkpoints=0'], 'keep_checkpoints'),
    # Config validation: cross-field rules.
    (['--num_gpus=4', '--batch_size=30'], 'batch_size'),
    (['--num_virtual_cpu_devices=3'], 'batch_size'),
    (['--num_gpus=1', '--num_virtual_cpu_devices=2'], 'num_virtual_cpu_devices'),
    (['--replay_proportion=0.5'], 'replay_buffer_num_slots'),
    (['--replay_proportion=3', '--replay_buffer_num_slots=2'],
     'replay_buffer_num_slots'),
    (['--total_environment_frames=50'], 'total_environment_frames'),
]

# Config-only errors (no flags involved) are tested in config_test.py.


def _fresh_flags():
  flag_values = absl_flags.FlagValues()
  impala_flags.define_flags(flag_values)
  return flag_values


def _config(argv):
  flag_values = _fresh_flags()
  impala_flags.parse_flags([PROG] + list(argv), flag_values, prog=PROG)
  return impala_flags.config_from_flags(flag_values)


def test_every_config_field_is_a_flag_with_help():
  flag_values = _fresh_flags()
  fields = [f.name for f in dataclasses.fields(config_lib.Config)]
  ours = [f.name for f in flag_values.get_flags_for_module(impala_flags)]
  assert sorted(ours) == sorted(fields)
  for name in fields:
    assert flag_values[name].help.strip(), name
    assert '] ' in flag_values[name].help, name  # The [section] prefix.
  for name in REQUIRED_FLAGS:
    assert name in flag_values, name


def test_sections_cover_every_field_once_in_config_order():
  names = [spec.name for _, _, specs in impala_flags.SECTIONS for spec in specs]
  assert names == [f.name for f in dataclasses.fields(config_lib.Config)]


def test_define_flags_twice_is_harmless():
  flag_values = _fresh_flags()
  impala_flags.define_flags(flag_values)
  flag_values([PROG, '--batch_size=64'])
  assert impala_flags.config_from_flags(flag_values).batch_size == 64


def test_defaults_give_default_config():
  assert _config([]) == config_lib.Config()
  # Without parsing, too.
  assert impala_flags.config_from_flags(_fresh_flags()) == config_lib.Config()


def test_flag_defaults_equal_config_defaults():
  flag_values = _fresh_flags()
  for field in dataclasses.fields(config_lib.Config):
    value = flag_values[field.name].default
    if field.name == 'mlp_hidden_sizes':
      value = tuple(value)
    assert value == field.default, field.name


@pytest.mark.parametrize('spelling', ['none', 'None', 'NONE', ''])
def test_none_spellings(spelling):
  cfg = _config([f'--clip_rho_threshold={spelling}',
                 f'--clip_pg_rho_threshold={spelling}'])
  assert cfg.clip_rho_threshold is None
  assert cfg.clip_pg_rho_threshold is None
  assert _config([f'--target_return={spelling}']).target_return is None


def test_parsed_values():
  cfg = _config([
      '--env=ALE/Pong-v5', '--num_actors=8', '--num_envs_per_actor=4',
      '--unroll_length=50', '--batch_size=64', '--num_gpus=2',
      '--total_environment_frames=2e8', '--seed=1_234',
      '--clip_rho_threshold=2.5', '--clip_pg_rho_threshold=none',
      '--target_return=475', '--mlp_hidden_sizes=256, 128,32', '--use_lstm',
      '--novtrace', '--optimizer=rmsprop', '--learning_rate=6e-4',
      '--lr_schedule=linear', '--entropy_cost_schedule=0:0.01,1e6:0.001',
      '--replay_proportion=1.5', '--replay_buffer_num_slots=100',
      '--reward_clipping=abs_one', '--network=deep', '--episodic_life=true',
      '--env_vectorization=async', '--logdir=/tmp/x y',
  ])
  assert cfg == config_lib.Config().replace(
      env='ALE/Pong-v5', num_actors=8, num_envs_per_actor=4, unroll_length=50,
      batch_size=64, num_gpus=2, total_environment_frames=200_000_000, seed=1234,
      clip_rho_threshold=2.5, clip_pg_rho_threshold=None, target_return=475.0,
      mlp_hidden_sizes=(256, 128, 32), use_lstm=True, vtrace=False,
      optimizer='rmsprop', learning_rate=6e-4, lr_schedule='linear',
      entropy_cost_schedule='0:0.01,1e6:0.001', replay_proportion=1.5,
      replay_buffer_num_slots=100, reward_clipping='abs_one', network='deep',
      episodic_life=True, env_vectorization='async', logdir='/tmp/x y')
  assert isinstance(cfg.total_environment_frames, int)
  assert isinstance(cfg.mlp_hidden_sizes, tuple)
  assert cfg.entropy_cost_schedule_points == ((0.0, 0.01), (1e6, 0.001))


def test_flagfile(tmp_path):
  flagfile = tmp_path / 'run.cfg'
  batch_size = 2 * config_lib.Config().batch_size  # Not the default.
  flagfile.write_text(f'# A comment.\n--batch_size={batch_size}\n\n'
                      '--clip_rho_threshold=none\n'
                      '--mlp_hidden_sizes=32,32\n--nouse_lstm\n')
  cfg = _config([f'--flagfile={flagfile}', '--num_actors=3'])
  assert cfg == config_lib.Config().replace(
      batch_size=batch_size, clip_rho_threshold=None, mlp_hidden_sizes=(32, 32),
      num_actors=3)
  # A later flag overrides the file.
  assert _config([f'--flagfile={flagfile}', '--batch_size=8']).batch_size == 8


def test_flags_round_trip_through_a_flagfile(tmp_path):
  flag_values = _fresh_flags()
  flag_values([PROG, '--target_return=none', '--clip_rho_threshold=2',
               '--mlp_hidden_sizes=8,4', '--use_lstm'])
  names = [f.name for f in dataclasses.fields(config_lib.Config)]
  flagfile = tmp_path / 'saved.cfg'
  flagfile.write_text(
      ''.join(flag_values[n].serialize() + '\n' for n in names))
  assert (_config([f'--flagfile={flagfile}']) ==
          impala_flags.config_from_flags(flag_values))


def test_cartpole_cfg():
  cfg = _config([f'--flagfile={REPO / "configs" / "cartpole.cfg"}'])
  # The defaults, with network='auto' and shared_torso unset resolved as they
  # are for CartPole's vector observations.
  assert cfg == config_lib.Config().replace(
      network='mlp', shared_torso=False, logdir='/tmp/impala_tf/cartpole')


def test_atari_paper_cfg():
  cfg = _config([f'--flagfile={REPO / "configs" / "atari_paper.cfg"}'])
  # Table G.1 of the IMPALA paper.
  assert cfg.env == 'ALE/Pong-v5'
  assert (cfg.unroll_length, cfg.batch_size) == (20, 32)
  assert cfg.num_actors * cfg.num_envs_per_actor == 48
  assert (cfg.optimizer, cfg.learning_rate, cfg.lr_schedule) == (
      'rmsprop', 0.0006, 'linear')
  assert (cfg.rmsprop_decay, cfg.rmsprop_momentum, cfg.rmsprop_epsilon) == (
      0.99, 0.0, 0.01)
  assert (cfg.entropy_cost, cfg.baseline_cost, cfg.discounting) == (0.01, 0.5, 0.99)
  assert cfg.grad_clip == 40.0
  assert cfg.reward_clipping == 'abs_one'
  assert cfg.network == 'deep'
  assert cfg.total_environment_frames == 200_000_000
  assert cfg.frame_stack == 4 and cfg.episodic_life
  assert cfg.num_gpus == 1
  assert cfg.vtrace and cfg.clip_rho_threshold == cfg.clip_pg_rho_threshold == 1.0


def test_every_cfg_parses_into_a_valid_config():
  cfgs = sorted((REPO / 'configs').glob('*.cfg'))
  assert len(cfgs) >= 2
  for path in cfgs:
    assert isinstance(_config([f'--flagfile={path}']), config_lib.Config), path


# The flags a recorded setup in configs/ must state: everything that changes what
# is learned (a new default must not change what a config means).
LEARNING_SECTIONS = ('data', 'loss', 'optimizer', 'network')
LEARNING_FLAGS_ELSEWHERE = ('env', 'num_actors', 'num_envs_per_actor',
                            'unroll_length', 'broadcast_interval',
                            'total_environment_frames')


# In those sections but not about learning.
NOT_LEARNING = ('learner_queue_timeout', 'loss_term_grad_norms',
                'max_nonfinite_updates')


def _learning_flags(optimizer):
  """The flags a config of `optimizer` must state (not the other one's)."""
  other = 'adam_' if optimizer == 'rmsprop' else 'rmsprop_'
  names = [spec.name for key, _, specs in impala_flags.SECTIONS
           if key in LEARNING_SECTIONS for spec in specs
           if spec.name not in NOT_LEARNING and not spec.name.startswith(other)]
  return names + list(LEARNING_FLAGS_ELSEWHERE)


def _flags_set_in(path):
  names = set()
  for line in path.read_text().splitlines():
    line = line.strip()
    if line.startswith('--'):
      name = line[2:].split('=')[0]
      names.add(name)
      if name.startswith('no'):
        names.add(name[2:])
  return names


def _missing_learning_flags(path):
  optimizer = _config([f'--flagfile={path}']).optimizer
  return [n for n in _learning_flags(optimizer) if n not in _flags_set_in(path)]


def test_every_cfg_states_every_learning_flag(tmp_path):
  cfgs = sorted((REPO / 'configs').glob('*.cfg'))
  assert len(cfgs) >= 3
  for path in cfgs:
    assert not _missing_learning_flags(path), (path.name,
                                               _missing_learning_flags(path))
  # The check itself: a config without --popart (Pong's old file) fails it.
  pong = (REPO / 'configs' / 'pong.cfg').read_text()
  bad = tmp_path / 'bad.cfg'
  bad.write_text('\n'.join(l for l in pong.splitlines()
                           if l.strip() not in ('--popart', '--nopopart')))
  assert _missing_learning_flags(bad) == ['popart']


def test_docs_are_up_to_date():
  docs = REPO / 'docs' / 'flags.md'
  expected = impala_flags.generate_docs()
  actual = docs.read_text() if docs.exists() else ''
  assert actual == expected, (
      'docs/flags.md is out of date; regenerate it with: '
      '.venv/bin/python -m impala_tf.flags > docs/flags.md')


def test_docs_list_every_flag_with_its_default():
  docs = impala_flags.generate_docs()
  for field in dataclasses.fields(config_lib.Config):
    assert f'`--{field.name}`' in docs, field.name
  for _, title, _ in impala_flags.SECTIONS:
    assert f'## {title}\n' in docs


def _run_cli(argv, capsys):
  """Parses and validates as an entry point does; returns (status, stderr)."""
  flag_values = _fresh_flags()
  with pytest.raises(SystemExit) as info:
    impala_flags.parse_flags([PROG] + list(argv), flag_values, prog=PROG)
    impala_flags.exit_on_config_error(PROG, impala_flags.config_from_flags,
                                      flag_values)
  return info.value.code, capsys.readouterr()


@pytest.mark.parametrize('argv,name', BAD_INPUTS)
def test_bad_inputs_exit_2_with_one_line(argv, name, capsys):
  status, captured = _run_cli(argv, capsys)
  assert status == 2
  assert captured.out == ''
  lines = captured.err.splitlines()
  assert len(lines) == 1, captured.err
  assert lines[0].startswith(f'{PROG}: error: '), lines[0]
  assert name in lines[0], lines[0]
  assert 'Traceback' not in captured.err


def test_config_error_line_names_the_flag(capsys):
  status, captured = _run_cli(['--num_gpus=4', '--batch_size=30'], capsys)
  assert status == 2
  assert captured.err.startswith(
      f'{PROG}: error: --batch_size=30: must be divisible by the 4 ')


def test_exit_on_config_error_passes_results_through():
  assert impala_flags.exit_on_config_error(PROG, lambda x: x + 1, 1) == 2


def test_unknown_flag_suggests_the_right_one(capsys):
  _, captured = _run_cli(['--batchsize=32'], capsys)
  assert captured.err == (
      f'{PROG}: error: unknown flag --batchsize (did you mean --batch_size?)\n')


@pytest.mark.parametrize('version,too_old', [
    ('2.11.1', True), ('2.9.0rc1', True), ('1.15.5', True), ('2.12.0', False),
    ('2.12.1', False), ('2.21.0', False), ('2.22.0.dev20260101', False)])
def test_tensorflow_version_error(version, too_old):
  error = impala_flags.tensorflow_version_error(version)
  if too_old:
    assert error == (f'impala_tf needs TensorFlow >= 2.12, found {version}: '
                     'pip install "tensorflow>=2.12"')
  else:
    assert error is None


def test_installed_tensorflow_is_new_enough():
  installed = impala_flags._installed_tensorflow_version()
  assert installed == importlib.metadata.version('tensorflow')
  assert impala_flags.tensorflow_version_error() is None


def test_min_tensorflow_is_setup_py_lower_bound():
  setup_py = (REPO / 'setup.py').read_text(encoding='utf-8')
  need = '.'.join(map(str, impala_flags.MIN_TENSORFLOW))
  assert f"'tensorflow>={need},<" in setup_py


def test_too_old_tensorflow_exits_2_with_one_line(monkeypatch, capsys):
  monkeypatch.setattr(impala_flags, '_installed_tensorflow_version',
                      lambda: '2.11.1')
  status, captured = _run_cli(['--batch_size=8'], capsys)
  assert status == 2
  assert captured.err == (
      f'{PROG}: error: impala_tf needs TensorFlow >= 2.12, found 2.11.1: '
      'pip install "tensorflow>=2.12"\n')


def test_prog_name_of_a_script():
  assert impala_flags.prog_name(['/usr/bin/impala-train']) == 'impala-train'


def _python(*args):
  return helpers.run_python(args, timeout=60)


@pytest.mark.e2e
def test_cli_prints_docs():
  result = _python('-m', 'impala_tf.flags')
  assert result.returncode == 0, result.stderr
  assert result.stdout == impala_flags.generate_docs()


@pytest.mark.e2e
def test_cli_flag_error_is_one_line_with_status_2():
  result = _python('-m', 'impala_tf.flags', '--batch_size=abc')
  assert result.returncode == 2
  assert result.stdout == ''
  assert result.stderr == (
      "impala_tf.flags: error: flag --batch_size=abc: expected an integer, "
      "got 'abc'\n")


@pytest.mark.e2e
def test_cli_helpfull_lists_the_flags():
  result = _python('-m', 'impala_tf.flags', '--helpfull')
  assert 'Traceback' not in result.stderr
  for name in ('batch_size', 'clip_rho_threshold', 'mlp_hidden_sizes'):
    assert f'--{name}:' in result.stdout, name


def test_network_takes_module_function():
  cfg = _config(['--network=testdata.torsos:keras_mlp', '--use_lstm'])
  assert cfg.network == 'testdata.torsos:keras_mlp' and cfg.use_lstm
  assert 'MODULE:FUNCTION' in impala_flags.generate_docs()


_EARLY_IMPORT_PROBE = '''
import sys
from impala_tf import flags
flags._installed_tensorflow_version = lambda: sys.argv[1]
calls = []
flags.import_tensorflow_if_old(lambda: calls.append(1))  # Declines to import.
print(len(calls), 'tensorflow' in sys.modules)
'''


@pytest.mark.e2e
@pytest.mark.parametrize('version,imported', [('2.12.1', True),
                                              ('2.21.0', False)])
def test_old_tensorflow_is_imported_early_even_when_import_fn_declines(
    version, imported):
  # quiet.quiet_tensorflow imports nothing when the user set TF_CPP_MIN_LOG_LEVEL;
  # on TF < 2.15 the run then failed inside tf.data (CI, stop 14).
  result = _python('-c', _EARLY_IMPORT_PROBE, version)
  assert result.returncode == 0, result.stderr
  assert result.stdout.split() == ['1' if imported else '0', str(imported)]
