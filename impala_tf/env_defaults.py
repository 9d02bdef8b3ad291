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
    # A run learns once its policy first reaches the goal, which took from ~50k
    # to ~620k frames in the benchmark, by chance (two runs of one seed differ).
    # The package's schedules have cut the learning rate (0.25x at 20% of the
    # run) and the entropy bonus (0 at 20%) by 200k frames, so a late first goal
    # was never learned from; with both constant it is, within the package's 1M
    # frames.
    'Acrobot-v1': {
        'lr_schedule': 'constant',
        'entropy_cost_schedule': 'constant',
    },
}

# Why each entry exists, one line each (docs/flags.md's table).
REASONS: Mapping[str, str] = {
    'Acrobot-v1': ('a run first reaches the goal after 50k-620k frames, by chance: '
                   'the learning rate and entropy bonus must not have fallen by then '
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
