"""Recorded settings per environment: what `--env=ID` alone gives, as RL-Zoo keeps.

The package's defaults (`config.Config`'s fields) were chosen on CartPole-v1 and
hold there; an env that needs other settings to learn out of the box has an entry in
`ENV_DEFAULTS`, chosen on that env's benchmark (docs/benchmarks.md) and applied
under every flag the user gives:

* the CLI (`python -m impala_tf.train --env=ID`) applies an entry's values to the
  flags that were not given (on the command line or in a `--flagfile`) and says so in
  one line on stderr; what it applied is in the run's `config.json`, so a resume with
  the same command gets the same settings;
* the library: `config_for(env, **fields)` is the Config the CLI would build from
  `--env=ENV` and `fields` (`impala_tf.Config(...)` itself never looks at the table).

A field an entry sets is a field the user may still set: a given flag or field wins.
An env without an entry gets the package's defaults. The table, with the reason for
each entry, is in docs/flags.md ("Settings per environment").

Imports no TensorFlow.
"""

from typing import Container, Dict, Mapping, Tuple

from impala_tf import config as config_lib

# Env id -> {Config field: value}, each entry with the measurement behind it.
ENV_DEFAULTS: Mapping[str, Mapping[str, object]] = {
    # A run learns once its policy first reaches the goal, which random play
    # does rarely; with one update per batch a run could miss those rare goals
    # and stay uniform for the whole budget. Each batch used 4 times under the
    # clipped surrogate learns from them early, before the package's schedules
    # lower the learning rate and the entropy bonus (docs/benchmarks.md).
    'Acrobot-v1': {
        'num_sgd_iter': 4,
        'ppo_clip': 0.2,
    },
}

# Why each entry exists, one line each (docs/flags.md's table).
REASONS: Mapping[str, str] = {
    'Acrobot-v1': ('a run learns from the rare goals random play reaches only '
                   'when each batch is used 4 times (under the clipped surrogate); '
                   'with one use, 1 run in 10-20 stayed at -500 for 1M frames '
                   '(docs/benchmarks.md, "Does Acrobot-v1 learn with the defaults?")'),
}


def defaults_for(env: str) -> Dict[str, object]:
  """The fields `env`'s entry sets ({} for an env without one).

  Args:
    env: a gymnasium (or EnvPool) env id, as `--env` takes it.

  Returns:
    A new dict of Config field name -> value.
  """
  return dict(ENV_DEFAULTS.get(env, {}))


def apply(config: config_lib.Config, given: Container[str] = ()
          ) -> Tuple[config_lib.Config, Dict[str, object]]:
  """`config` with its env's entry applied to the fields not in `given`.

  Args:
    config: a validated Config.
    given: names of the fields the user set (flags given on the command line or in
      a flagfile); these keep `config`'s values.

  Returns:
    (the Config, {field: value} of what was applied; {} when nothing was).

  Raises:
    ConfigError: when the applied values break a cross-field rule with a given
      field (the message names the field).
  """
  applied = {k: v for k, v in defaults_for(config.env).items() if k not in given}
  if not applied:
    return config, {}
  return config.replace(**applied), applied


def config_for(env: str, **fields) -> config_lib.Config:
  """The Config the CLI builds from `--env=ENV` and the flags `fields`.

  Args:
    env: the env id.
    **fields: Config fields the user sets; they win over `env`'s entry.

  Returns:
    A validated Config.

  Raises:
    ConfigError: naming the field, as `Config(...)` does.
  """
  config = config_lib.Config(env=env, **fields)
  return apply(config, given=set(fields))[0]


def describe(env: str, applied: Mapping[str, object]) -> str:
  """The one line the CLI writes when it applied an entry."""
  values = ' '.join(f'--{k}={v}' for k, v in applied.items())
  return (f'{env}: its recorded settings {values} (docs/flags.md, "Settings per '
          'environment"; a flag you give wins)')
