"""Quiet start: TensorFlow's own start-up logs are off unless asked for.

Importing TensorFlow prints native log lines to stderr (`I0000 ... Could not find
cuda drivers`, `This TensorFlow binary is optimized ...`, and on any machine without
a GPU `E0000 ... failed call to cuInit: ... UNKNOWN ERROR (303)`), which read as
errors where there are none. The entry points (`impala_tf.train`, `.evaluate`,
`.export`) call `quiet_tensorflow()` before anything imports TensorFlow:

* unless the user set `TF_CPP_MIN_LOG_LEVEL`, it is set to 2 (TensorFlow's native
  INFO and WARNING lines off; its ERROR lines stay);
* TensorFlow is imported, and its devices listed, with file descriptor 2 captured:
  the native log lines printed then (some ignore `TF_CPP_MIN_LOG_LEVEL`, and the
  cuInit line is an ERROR) are dropped, any other line is passed on;
* TensorFlow's Python logging below ERROR is dropped (its `tensorflow` logger, and
  the records its modules log through absl, e.g. `functional_saver.py] Sharding
  callback duration`), and Python warnings raised from TensorFlow's modules are
  ignored. Our own absl log lines (the metrics lines) are kept.

To see everything TensorFlow logs, pass absl's `--verbosity=1` (debug; also `-v 1`)
or set `TF_CPP_MIN_LOG_LEVEL` yourself, e.g. `TF_CPP_MIN_LOG_LEVEL=0 python -m
impala_tf.train ...`: then this module changes nothing. (`impala_tf.train` reads
`--verbosity` after its flags are parsed, so also from a `--flagfile`; `evaluate`
and `export` import TensorFlow before absl parses their flags and read it from the
command line itself.) Processes started from a quiet one (env subprocesses, tests)
inherit the setting and stay quiet (`IMPALA_TF_QUIET=1` marks it as ours, not the
user's); the Ray actor processes import TensorFlow through `quiet_if_parent_was()`,
so their native lines are dropped as the run's are.

This module imports TensorFlow only inside `quiet_tensorflow()`, and only the entry
points (when run as programs) and processes started by them call it: importing
impala_tf's modules into your own code changes no logging.
"""

import contextlib
import logging
import os
import re
import sys
import tempfile
from typing import Optional, Sequence
import warnings

LEVEL_VAR = 'TF_CPP_MIN_LOG_LEVEL'
MARK_VAR = 'IMPALA_TF_QUIET'
# absl's --verbosity at which TensorFlow's logs are left on (1: absl's DEBUG).
VERBOSE_FROM = 1

_VERBOSITY_ARG_RE = re.compile(r'^--?(verbosity|v)(=(.*))?$')

# A line of TensorFlow's native (absl C++) logging, or one it prints with them.
# Not a FATAL (F) line, which says why the process is about to abort; and not a
# line of absl's Python logging, which has the same layout but names a .py file.
NATIVE_LOG_RE = re.compile(
    r'^(WARNING: All log messages before absl::InitializeLog\(\) is called are '
    r'written to STDERR|[IWE]\d{4} [\d:.]+\s+\d+ \S+(?<!\.py):\d+\] .*|To '
    r'enable the following instructions: .*'
    # TensorFlow < 2.16: `2024-01-31 12:00:00.123456: E path/x.cc:123] ...`.
    r'|\d{4}-\d\d-\d\d [\d:.]+: [IWE] \S+(?<!\.py):\d+\] .*)$')


_TF_PATH_RE = re.compile(r'[\\/](tensorflow|tf_keras|keras|tsl|absl)[\\/]')


class _DropTensorFlowRecords(logging.Filter):
  """Drops log records below ERROR that come from TensorFlow's (or absl's) files."""

  def filter(self, record: logging.LogRecord) -> bool:
    return (record.levelno >= logging.ERROR or
            not _TF_PATH_RE.search(record.pathname or ''))


def user_set_level() -> bool:
  """Whether TF_CPP_MIN_LOG_LEVEL was set by the user (not by this module)."""
  return LEVEL_VAR in os.environ and os.environ.get(MARK_VAR) != '1'


@contextlib.contextmanager
def _native_lines_dropped():
  """Captures file descriptor 2; on exit, writes back the lines that are not
  native TensorFlow log lines."""
  sys.stderr.flush()
  try:
    saved = os.dup(2)
  except OSError:  # No file descriptor 2: nothing to capture.
    yield
    return
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = captured.read().decode('utf-8', errors='replace')
      kept = [l for l in text.splitlines() if not NATIVE_LOG_RE.match(l)]
      if kept:
        sys.stderr.write('\n'.join(kept) + '\n')
        sys.stderr.flush()


def argv_verbosity(argv: Sequence[str]) -> int:
  """absl's `--verbosity` (or `-v`) as given on a command line, before absl parses it.

  Args:
    argv: the command line, e.g. `sys.argv`; the last `--verbosity=N`,
      `--verbosity N`, `-v=N` or `-v N` counts (one or two dashes, as absl accepts).

  Returns:
    N; 0 (absl's INFO, its default) when absent or not an integer, or after `--`.
  """
  verbosity = 0
  args = list(argv[1:])
  for i, arg in enumerate(args):
    if arg == '--':
      break
    match = _VERBOSITY_ARG_RE.match(arg)
    if not match:
      continue
    value: Optional[str] = match.group(3)
    if match.group(2) is None:
      value = args[i + 1] if i + 1 < len(args) else None
    try:
      verbosity = int(value)
    except (TypeError, ValueError):
      pass  # absl reports the bad value when it parses the flags.
  return verbosity


def quiet_if_parent_was() -> bool:
  """In a process started by a quiet entry point, imports TensorFlow quietly too.

  For modules that child processes import before TensorFlow (the Ray actor
  processes import `impala_tf.ray_actors`): `IMPALA_TF_QUIET=1`, inherited from the
  run, says the run was quiet; anywhere else (library use, a user-set
  TF_CPP_MIN_LOG_LEVEL) this does nothing.

  Returns:
    What `quiet_tensorflow()` returned, or False when the parent was not quiet.
  """
  if os.environ.get(MARK_VAR) != '1':
    return False
  return quiet_tensorflow()


def quiet_tensorflow(verbosity: int = 0) -> bool:
  """Imports TensorFlow quietly (see the module docstring).

  Args:
    verbosity: absl's `--verbosity`; at `VERBOSE_FROM` (1) or more TensorFlow's
      logs are left on and nothing is changed.

  Returns:
    True if it quietened TensorFlow; False when the user set TF_CPP_MIN_LOG_LEVEL,
    asked for `--verbosity` >= 1, or TensorFlow was already imported (then nothing
    is changed and TensorFlow is not imported).
  """
  if (verbosity >= VERBOSE_FROM or user_set_level() or
      'tensorflow' in sys.modules):
    return False
  os.environ[LEVEL_VAR] = '2'
  os.environ[MARK_VAR] = '1'
  with _native_lines_dropped():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.list_physical_devices()  # Device discovery logs (cuInit) here.
  tf.get_logger().setLevel(logging.ERROR)
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.get_absl_logger().addFilter(_DropTensorFlowRecords())
  warnings.filterwarnings('ignore', module=r'(tensorflow|keras|tf_keras)(\.|$)')
  return True
