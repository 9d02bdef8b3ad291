"""Every `Config` field as an absl flag, and the command-line error handling.

Usage in an entry point:

    from impala_tf import flags as impala_flags

    impala_flags.define_flags()

    def main(argv):
      cfg = impala_flags.exit_on_config_error(
          'impala_tf.train', impala_flags.config_from_flags)
      ...

    if __name__ == '__main__':
      impala_flags.run_program(main)

Each flag has the name and the default of the `Config` field it sets (the defaults
are read from `Config`, never repeated here). Spelling on the command line:

* booleans: `--use_lstm`, `--nouse_lstm`, `--use_lstm=false`;
* optional numbers (`target_return`, `clip_rho_threshold`, `clip_pg_rho_threshold`):
  a number, or `none` (any case, or empty) for None;
* `mlp_hidden_sizes`: comma-separated integers, `--mlp_hidden_sizes=256,256`;
* integers also accept `1_000_000` and integral exponent forms such as `2e8`;
* `--flagfile=configs/cartpole.cfg` reads flags from a file; later flags override it.

A value that cannot be parsed ends the program with status 2 and one line on stderr,
`<prog>: error: <message naming the flag>`; so does a value that `Config` rejects
(`exit_on_config_error`). `python -m impala_tf.flags` prints docs/flags.md.
`parse_flags` first checks the installed TensorFlow (`tensorflow_version_error`):
one older than `MIN_TENSORFLOW` ends the program the same way, saying what it needs.
"""

import collections
import dataclasses
import importlib.metadata
import math
import os
import re
import sys
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import app
from absl import flags as absl_flags

from impala_tf import config as config_lib
from impala_tf import cpu_kernels
from impala_tf import env_defaults
from impala_tf import errors
from impala_tf import quiet

FLAGS = absl_flags.FLAGS

# The error exit status, as argparse uses for usage errors.
EXIT_USAGE = 2

_NONE_SPELLINGS = ('none', '')

# One flag: the Config field it sets, its kind and its help text (from the field's
# `config.option`).
_Flag = collections.namedtuple('_Flag', ['name', 'kind', 'help'])

# Kinds: 'string', 'int', 'float', 'bool', 'enum', 'optional_float', 'int_list',
# 'network' (a string: one of NETWORKS or MODULE:FUNCTION, checked by Config).
_KINDS = {
    int: 'int',
    float: 'float',
    bool: 'bool',
    Optional[bool]: 'bool',
    str: 'string',
    Optional[float]: 'optional_float',
    Tuple[int, ...]: 'int_list',
}


def _kind(field: dataclasses.Field) -> str:
  if field.metadata['kind']:
    return field.metadata['kind']
  if field.metadata['choices']:
    return 'enum'
  return _KINDS[field.type]


_FIELDS = dataclasses.fields(config_lib.Config)

# The values of enum flags (and, for the docs, of --network).
_ENUM_VALUES = {f.name: f.metadata['choices'] for f in _FIELDS
                if f.metadata['choices']}
_ENUM_VALUES['network'] = config_lib.NETWORKS + ('MODULE:FUNCTION',)

# (key, title, flags), built from Config's fields. The order is the order of
# --helpfull and docs/flags.md.
SECTIONS = tuple(
    (key, title, tuple(_Flag(f.name, _kind(f), f.metadata['help'])
                       for f in _FIELDS if f.metadata['section'] == key))
    for key, title in config_lib.SECTIONS)

_DEFAULTS = {f.name: f.default for f in dataclasses.fields(config_lib.Config)}


class _IntParser(absl_flags.IntegerParser):
  """An integer; also accepts `1_000_000` and integral exponent forms like `2e8`."""

  def __init__(self):
    super().__init__()

  def convert(self, argument):
    if isinstance(argument, int) and not isinstance(argument, bool):
      return argument
    if not isinstance(argument, str):
      raise TypeError(f'expected an integer, got {argument!r}')
    text = argument.strip()
    try:
      return int(text, 10)
    except ValueError:
      pass
    try:
      number = float(text)
    except ValueError:
      number = math.nan
    if math.isfinite(number) and number.is_integer():
      return int(number)
    raise ValueError(f'expected an integer, got {argument!r}')


class _FloatParser(absl_flags.FloatParser):
  """A float, with a short error message."""

  def __init__(self):
    super().__init__()

  def convert(self, argument):
    try:
      return super().convert(argument)
    except ValueError:
      raise ValueError(f'expected a number, got {argument!r}') from None


class _OptionalFloatParser(absl_flags.ArgumentParser):
  """A float, or None spelt `none` (any case) or the empty string."""

  syntactic_help = "a number, or 'none'"

  def parse(self, argument):
    if argument is None:
      return None
    if isinstance(argument, str):
      text = argument.strip()
      if text.lower() in _NONE_SPELLINGS:
        return None
      try:
        return float(text)
      except ValueError:
        raise ValueError(
            f"expected a number or 'none', got {argument!r}") from None
    if isinstance(argument, (int, float)) and not isinstance(argument, bool):
      return float(argument)
    raise TypeError(f"expected a number or 'none', got {argument!r}")

  def flag_type(self):
    return 'float or none'


class _OptionalFloatSerializer(absl_flags.ArgumentSerializer):

  def serialize(self, value):
    return 'none' if value is None else repr(float(value))


class _IntListParser(absl_flags.ArgumentParser):
  """Comma-separated integers, e.g. `64,64`, into a list of ints."""

  syntactic_help = 'a comma-separated list of integers'

  def parse(self, argument):
    if isinstance(argument, (list, tuple)):
      items = list(argument)
    elif isinstance(argument, str):
      text = argument.strip()
      items = [s.strip() for s in text.split(',')] if text else []
    else:
      raise TypeError(f'expected comma-separated integers, got {argument!r}')
    values = []
    for item in items:
      if isinstance(item, int) and not isinstance(item, bool):
        values.append(item)
        continue
      try:
        values.append(int(item, 10))
      except (TypeError, ValueError):
        raise ValueError(
            f'expected comma-separated integers, got {argument!r}') from None
    return values

  def flag_type(self):
    return 'int list'


class _IntListSerializer(absl_flags.ArgumentSerializer):

  def serialize(self, value):
    return ','.join(str(v) for v in value)


def _iter_flags():
  for _, _, section_flags in SECTIONS:
    yield from section_flags


def define_flags(flag_values: absl_flags.FlagValues = FLAGS) -> None:
  """Defines one flag per `Config` field in `flag_values`.

  Safe to call more than once: flags already defined in `flag_values` are kept.

  Args:
    flag_values: where to define the flags; absl's global FLAGS by default.
  """
  for key, _, section_flags in SECTIONS:
    for spec in section_flags:
      if spec.name in flag_values:
        continue
      default = _DEFAULTS[spec.name]
      help_text = f'[{key}] {spec.help}'
      kwargs = dict(flag_values=flag_values)
      if spec.kind in ('string', 'network'):
        absl_flags.DEFINE_string(spec.name, default, help_text, **kwargs)
      elif spec.kind == 'bool':
        absl_flags.DEFINE_bool(spec.name, default, help_text, **kwargs)
      elif spec.kind == 'enum':
        absl_flags.DEFINE_enum(spec.name, default, list(_ENUM_VALUES[spec.name]),
                               help_text, **kwargs)
      elif spec.kind == 'int':
        absl_flags.DEFINE(_IntParser(), spec.name, default, help_text,
                          serializer=absl_flags.ArgumentSerializer(), **kwargs)
      elif spec.kind == 'float':
        absl_flags.DEFINE(_FloatParser(), spec.name, default, help_text,
                          serializer=absl_flags.ArgumentSerializer(), **kwargs)
      elif spec.kind == 'optional_float':
        absl_flags.DEFINE(_OptionalFloatParser(), spec.name, default, help_text,
                          serializer=_OptionalFloatSerializer(), **kwargs)
      elif spec.kind == 'int_list':
        absl_flags.DEFINE(_IntListParser(), spec.name, default, help_text,
                          serializer=_IntListSerializer(), **kwargs)
      else:
        raise AssertionError(f'unknown flag kind {spec.kind!r} of {spec.name}')


def config_from_flags(
    flag_values: absl_flags.FlagValues = FLAGS) -> config_lib.Config:
  """Builds the validated Config from the flags' values.

  Args:
    flag_values: FlagValues on which `define_flags` was called (parsed or not; an
      unparsed one gives the defaults).

  Returns:
    The Config.

  Raises:
    ConfigError: from Config validation, naming the field (= the flag).
  """
  values = {}
  for spec in _iter_flags():
    value = flag_values[spec.name].value
    if spec.kind == 'int_list':
      value = tuple(value)
    values[spec.name] = value
  return config_lib.Config(**values)


def config_for_env_from_flags(
    flag_values: absl_flags.FlagValues = FLAGS
) -> Tuple[config_lib.Config, Dict[str, object]]:
  """The Config of `config_from_flags` with its env's recorded settings applied.

  `env_defaults.ENV_DEFAULTS`' entry for `--env` sets each field whose flag was not
  given (on the command line or in a flagfile: absl's `present`).

  Args:
    flag_values: parsed FlagValues on which `define_flags` was called.

  Returns:
    (the Config, {field: value} of the settings applied; {} when none were).

  Raises:
    ConfigError: from Config validation, naming the field (= the flag).
  """
  config = config_from_flags(flag_values)
  given = {name for name in env_defaults.defaults_for(config.env)
           if flag_values[name].present}
  return env_defaults.apply(config, given)


def prog_name(argv: Optional[Sequence[str]] = None) -> str:
  """The program name for error lines: `impala_tf.train` under `python -m`.

  Args:
    argv: the command line; sys.argv by default.

  Returns:
    The module name when the program runs with `python -m`, else the base name of
    argv[0].
  """
  argv = sys.argv if argv is None else argv
  main = sys.modules.get('__main__')
  spec = getattr(main, '__spec__', None)
  main_file = getattr(main, '__file__', None)
  if (spec is not None and spec.name and argv and main_file and
      os.path.abspath(argv[0]) == os.path.abspath(main_file)):
    name = spec.name
    return name[:-len('.__main__')] if name.endswith('.__main__') else name
  if argv and argv[0]:
    return os.path.basename(argv[0])
  return 'impala_tf'


# The oldest TensorFlow impala_tf runs on: setup.py's lower bound, tested by CI.
MIN_TENSORFLOW = (2, 12)
_TENSORFLOW_DISTRIBUTIONS = ('tensorflow', 'tensorflow-cpu', 'tensorflow-gpu',
                             'tensorflow-macos', 'tf-nightly')


def _installed_tensorflow_version() -> Optional[str]:
  """The loaded TensorFlow's version, else the installed distribution's, else None."""
  if 'tensorflow' in sys.modules:
    return getattr(sys.modules['tensorflow'], '__version__', None)
  for dist in _TENSORFLOW_DISTRIBUTIONS:
    try:
      return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
      pass
  return None


def tensorflow_version_error(version: Optional[str] = None) -> Optional[str]:
  """Says what TensorFlow impala_tf needs if `version` is older; else None.

  Args:
    version: a TensorFlow version string; by default the installed one, read from
      the loaded module or the package metadata (importing TensorFlow takes
      seconds). None when neither is found: the import will say so.
  """
  if version is None:
    version = _installed_tensorflow_version()
  match = re.match(r'(\d+)\.(\d+)', version or '')
  if match and tuple(int(g) for g in match.groups()) < MIN_TENSORFLOW:
    need = '.'.join(map(str, MIN_TENSORFLOW))
    return (f'impala_tf needs TensorFlow >= {need}, found {version}: '
            f'pip install "tensorflow>={need}"')
  return None


# Older TensorFlow fails to start a tf.data `from_generator` pipeline under
# MirroredStrategy ("Unable to find FunctionDef for __inference_Dataset_from_generator_
# ... in the registry") when TensorFlow is first imported inside an absl app's main;
# imported before `app.run`, it works. Seen on 2.12, not on 2.15 (2.13-2.14 untried).
_IMPORT_BEFORE_APP_BELOW = (2, 15)


def imports_tensorflow_before_app() -> bool:
  """Whether the installed TensorFlow is older than 2.15 (`import_tensorflow_if_old`)."""
  match = re.match(r'(\d+)\.(\d+)', _installed_tensorflow_version() or '')
  return bool(match) and (
      tuple(int(g) for g in match.groups()) < _IMPORT_BEFORE_APP_BELOW)


def import_tensorflow_if_old(import_fn: Optional[Callable[[], object]] = None
                             ) -> None:
  """Imports TensorFlow now if it is older than 2.15; call before `app.run`.

  Newer TensorFlow is left to the first module that needs it, so that flag errors
  come without the import's seconds.

  Args:
    import_fn: called first to import it (e.g. `impala_tf.quiet.quiet_tensorflow`,
      so that the early import is as quiet as the usual one); TensorFlow is
      imported afterwards in any case, since `import_fn` may decline to.
  """
  if imports_tensorflow_before_app():
    if import_fn is not None:
      import_fn()  # May import nothing (e.g. the user set TF_CPP_MIN_LOG_LEVEL).
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import


def run_program(main: Callable[[List[str]], object],
                prog: Optional[str] = None,
                define: Optional[Callable[[], None]] = None) -> None:
  """Runs an entry point's `main(argv)` as `python -m impala_tf.<program>` does.

  In order: oneDNN's kernels chosen (`cpu_kernels.prefer_onednn`, before
  anything imports TensorFlow), `define()` (the program's flags, if not defined
  at import), TensorFlow imported quietly if it is older than 2.15
  (`import_tensorflow_if_old`), then absl's `app.run(main)` with `parse_flags`.

  Args:
    main: the program's `main(argv)`, called with the arguments left once the
      flags are parsed.
    prog: the name that starts its one-line errors (`<prog>: error: ...`);
      None: `prog_name(argv)`, e.g. `impala_tf.train` under `python -m`.
    define: defines the program's flags; None where they are defined at import.
  """
  cpu_kernels.prefer_onednn()
  if define is not None:
    define()
  import_tensorflow_if_old(
      lambda: quiet.quiet_tensorflow(quiet.argv_verbosity(sys.argv)))
  app.run(main, flags_parser=lambda argv: parse_flags(argv, prog=prog))


def exit_with_error(message: str, prog: Optional[str] = None) -> None:
  """Prints `<prog>: error: <message>` as one line on stderr and exits with 2."""
  prog = prog or prog_name()
  sys.stderr.write(f'{prog}: error: {errors.one_line(message, limit=None)}\n')
  sys.stderr.flush()
  sys.exit(EXIT_USAGE)


_NON_BOOLEAN_RE = re.compile(
    r"^flag --(\w+)=(.*): \('Non-boolean argument to boolean flag', .*\)$")


def _flag_error_message(error: Exception) -> str:
  """A readable one-line message for a flag parsing error."""
  if isinstance(error, absl_flags.UnrecognizedFlagError):
    message = f'unknown flag --{error.flagname}'
    match = re.search(r'Did you mean: (.*) \?$', str(error))
    if match:
      names = ', '.join(f'--{n.strip()}' for n in match.group(1).split(','))
      message += f' (did you mean {names}?)'
    return message
  message = errors.one_line(error, limit=None)
  if message.startswith('ERROR:: '):
    message = message[len('ERROR:: '):]
  match = _NON_BOOLEAN_RE.match(message)
  if match:
    name, value = match.groups()
    message = (f'flag --{name}={value}: expected true or false '
               f'(or --{name} / --no{name})')
  return message


def parse_flags(argv: Sequence[str],
                flag_values: absl_flags.FlagValues = FLAGS,
                prog: Optional[str] = None,
                allow_positional: bool = False) -> List[str]:
  """Parses the command line; a flag error exits with status 2 and one line.

  Use as `app.run(main, flags_parser=parse_flags)`. `--flagfile` and the help flags
  (`--help`, `--helpfull`) work as in absl.

  Args:
    argv: the command line, program name first.
    flag_values: the flags to parse into; absl's global FLAGS by default.
    prog: the program name for the error line; derived from argv[0] if None.
    allow_positional: accept arguments that are not flags. If False (the entry
      points take none) a positional argument is an error, which catches
      `--use_lstm false`.

  Returns:
    argv[0] and the arguments that are not flags.
  """
  prog = prog or prog_name(argv)
  version_error = tensorflow_version_error()
  if version_error:
    exit_with_error(version_error, prog)
  try:
    remaining = flag_values(list(argv))
  except absl_flags.Error as e:
    exit_with_error(_flag_error_message(e), prog)
  except ValueError as e:  # absl raises it for `--noflag=value`.
    exit_with_error(str(e), prog)
  if not allow_positional and len(remaining) > 1:
    exit_with_error(
        f'unexpected argument {remaining[1]!r}: options are flags, written '
        '--name=value', prog)
  return remaining


def exit_on_config_error(prog: Optional[str], fn: Callable, *args, **kwargs):
  """Returns fn(*args, **kwargs); a ConfigError exits with status 2 and one line.

  The line is `<prog>: error: --<field>=<value>: <allowed>`.

  Args:
    prog: the program name; derived from sys.argv if None.
    fn: the function to run, e.g. `config_from_flags`.
    *args: positional arguments of fn.
    **kwargs: keyword arguments of fn.

  Returns:
    What fn returns.
  """
  try:
    return fn(*args, **kwargs)
  except config_lib.ConfigError as e:
    exit_with_error(f'--{e}', prog)


def _format_default(spec: _Flag) -> str:
  value = _DEFAULTS[spec.name]
  if value is None and spec.kind == 'bool':
    return 'unset (auto)'
  if value is None:
    return 'none'
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (tuple, list)):
    return ','.join(str(v) for v in value)
  return str(value)


def _format_type(spec: _Flag) -> str:
  if spec.kind in ('enum', 'network'):
    return ' \\| '.join(_ENUM_VALUES[spec.name])
  return {
      'string': 'string',
      'int': 'int',
      'float': 'float',
      'bool': 'bool',
      'optional_float': 'float or none',
      'int_list': 'int list',
  }[spec.kind]


def _md_cell(text: str) -> str:
  return text.replace('|', '\\|')


def generate_docs() -> str:
  """Returns the markdown of docs/flags.md: one table per section."""
  lines = [
      '# Flags',
      '',
      '<!-- Generated by `python -m impala_tf.flags > docs/flags.md`; do not edit. -->',
      '',
      'Every option of `python -m impala_tf.train` (and `impala_tf.evaluate`) is an '
      'absl flag with the name of the `impala_tf.config.Config` field it sets. '
      'Write `--name=value`; booleans also as `--name` / `--noname`; optional '
      'numbers take `none` for None (`--clip_rho_threshold=none`); lists are '
      'comma-separated (`--mlp_hidden_sizes=256,256`); integers accept `2e8` and '
      '`200_000_000`. `--flagfile=configs/atari_paper.cfg` reads flags from a file '
      '(flags after it override it); `--helpfull` lists every flag. A value out of '
      'range stops the program before it starts, with exit status 2 and one line '
      'on stderr naming the flag.',
      '',
  ]
  for _, title, section_flags in SECTIONS:
    lines += [f'## {title}', '', '| Flag | Type | Default | Description |',
              '|---|---|---|---|']
    for spec in section_flags:
      lines.append(
          f'| `--{spec.name}` | {_format_type(spec)} | '
          f'`{_md_cell(_format_default(spec))}` | {_md_cell(spec.help)} |')
    lines.append('')
  lines += _env_defaults_table()
  lines += _LOSS_REDUCTION_NOTES
  return '\n'.join(lines)


def _env_defaults_table() -> List[str]:
  """docs/flags.md's "Settings per environment", from env_defaults."""
  lines = [
      '## Settings per environment',
      '',
      'The defaults above were chosen on CartPole-v1. An env listed here gets these '
      'values instead when `python -m impala_tf.train --env=ID` is given no flag '
      'for them (a flag given, also in a `--flagfile`, wins); the trainer says so '
      'in one line, and `config.json` records what the run used. From Python, '
      '`impala_tf.env_defaults.config_for(env, **fields)` builds the same Config '
      '(`impala_tf.Config` itself does not look at this table).',
      '',
      '| Env | Settings | Why |',
      '|---|---|---|',
  ]
  for env, settings in env_defaults.ENV_DEFAULTS.items():
    values = ' '.join(f'`--{k}={v}`' for k, v in settings.items())
    lines.append(f'| `{env}` | {values} | '
                 f'{_md_cell(env_defaults.REASONS[env])} |')
  return lines + ['']


_LOSS_REDUCTION_NOTES = [
    '## Sum or mean: translating `--loss_reduction`',
    '',
    'With `--loss_reduction=sum` (the default, as in the paper and scalable_agent) '
    'every loss term is a sum over the valid steps of the batch, N of them (about '
    '`batch_size x unroll_length`); with `mean` it is divided by N, counted over the '
    'whole batch on every replica, so any number of replicas still gives the same '
    'update. The gradient of the mean is the gradient of the sum divided by N. To '
    'keep an update the same when switching from sum to mean:',
    '',
    '* `--learning_rate`: unchanged for Adam and RMSProp, which divide the gradient '
    'by its own running scale (exactly unchanged where epsilon is negligible).',
    '* `--adam_epsilon`: divide by N (it is added to sqrt(v), which scales with the '
    'gradient).',
    '* `--rmsprop_epsilon`: divide by N^2 (it is added to the mean square, under the '
    'root).',
    '* `--grad_clip`: divide by N (it bounds the global norm of the gradient).',
    '',
    '## RMSProp: tf1 or torch',
    '',
    'Both keep `ms <- decay * ms + (1 - decay) * g^2` per weight. `--rmsprop_style=tf1` '
    '(the default; the IMPALA paper, scalable_agent, TF1) steps `lr * g / sqrt(ms + '
    'eps)` with `ms` starting at 1; `torch` (PyTorch, TorchBeast) steps `lr * g / '
    '(sqrt(ms) + eps)` with `ms` starting at 0. Where `ms` is far above `eps^2` '
    '(torch) and `eps` (tf1) the two agree. Where gradients are small, tf1 steps '
    'about `lr * g / sqrt(eps)` (no per-weight scaling: plain SGD at `lr / '
    'sqrt(eps)`) and torch about `lr * g / eps`: TorchBeast\'s eps 0.01 at lr '
    '4.8e-4 takes steps up to 10x those of the same numbers under tf1. To carry a '
    'TorchBeast setting over, use `--rmsprop_style=torch` with its numbers; a tf1 '
    'epsilon E behaves like a torch epsilon of about sqrt(E) where the mean square '
    'is small. The first steps differ too: tf1 starts at `ms = 1` (small first '
    'steps), torch at 0 (the first step is about `lr / sqrt(1 - decay)` per '
    'weight, 10x lr at decay 0.99).',
    '',
    'With `--popart` the value errors and the advantages are divided by sigma, so '
    'these settings no longer depend on the scale of the rewards either; '
    '`--reward_scale` multiplies the rewards (before `--reward_clipping`) instead.',
    '',
]


def main(argv):
  del argv  # Unused.
  sys.stdout.write(generate_docs())


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=parse_flags)
