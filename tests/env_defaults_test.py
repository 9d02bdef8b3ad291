"""Tests for impala_tf.env_defaults: the settings an env id brings, under the user's."""

from absl import flags as absl_flags
import pytest

from impala_tf import config as config_lib
from impala_tf import env_defaults
from impala_tf import flags as flags_lib

_FIELDS = {f.name for f in config_lib.Config.__dataclass_fields__.values()}


def _parsed(*args):
  flag_values = absl_flags.FlagValues()
  flags_lib.define_flags(flag_values)
  flag_values(['prog', *args])
  return flag_values


@pytest.mark.parametrize('env', sorted(env_defaults.ENV_DEFAULTS))
def test_each_entry_is_valid_config_fields_with_a_reason(env):
  settings = env_defaults.defaults_for(env)
  assert settings and set(settings) <= _FIELDS, set(settings) - _FIELDS
  config = env_defaults.config_for(env)  # Validates every value.
  for field, value in settings.items():
    assert getattr(config, field) == value, field
    # An entry sets only what differs from the package's default.
    assert getattr(config_lib.Config(), field) != value, field
  assert env_defaults.REASONS[env]
  assert set(env_defaults.REASONS) == set(env_defaults.ENV_DEFAULTS)


def test_acrobot_gets_its_settings_and_a_given_field_wins():
  config = env_defaults.config_for('Acrobot-v1', ppo_clip=0.1, seed=3)
  assert config.ppo_clip == 0.1  # Given: kept.
  assert config.num_sgd_iter == 4
  assert config.seed == 3
  assert config.total_environment_frames == 1_000_000  # Not in the entry.


def test_an_env_without_an_entry_keeps_the_package_defaults():
  config = config_lib.Config(env='CartPole-v1', seed=1)
  same, applied = env_defaults.apply(config)
  assert same is config and applied == {}
  assert env_defaults.config_for('CartPole-v1', seed=1) == config


def test_flags_given_win_also_when_they_equal_the_package_default():
  # --num_sgd_iter=1 is the package's default, given on purpose.
  assert config_lib.Config().num_sgd_iter == 1
  config, applied = flags_lib.config_for_env_from_flags(_parsed(
      '--env=Acrobot-v1', '--num_sgd_iter=1'))
  assert config.num_sgd_iter == 1
  assert config.ppo_clip == 0.2
  assert applied == {'ppo_clip': 0.2}


def test_flags_not_given_take_the_entry():
  config, applied = flags_lib.config_for_env_from_flags(_parsed('--env=Acrobot-v1'))
  assert applied == env_defaults.defaults_for('Acrobot-v1')
  assert config == env_defaults.config_for('Acrobot-v1')
  line = env_defaults.describe('Acrobot-v1', applied)
  assert line.startswith('Acrobot-v1: its recorded settings --num_sgd_iter=4 '
                         '--ppo_clip=0.2 (')
  assert '\n' not in line


def test_a_flag_in_a_flagfile_counts_as_given(tmp_path):
  flagfile = tmp_path / 'acrobot.cfg'
  flagfile.write_text('--env=Acrobot-v1\n--ppo_clip=0\n')
  config, applied = flags_lib.config_for_env_from_flags(
      _parsed(f'--flagfile={flagfile}'))
  assert config.ppo_clip == 0.0
  assert applied == {'num_sgd_iter': 4}
