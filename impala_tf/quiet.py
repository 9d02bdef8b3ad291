"""Quiet start: TensorFlow's own start-up logs are off unless asked for.

Importing TensorFlow prints native log lines to stderr (`I0000 ... Could not find
cuda drivers`, `This TensorFlow binary is optimized ...`, and on any machine without
a GPU `E0000 ... failed call to cuInit: ... UNKNOWN ERROR (303)`), which read as
errors where there are none. The entry points (`impala_tf.train`, `.evaluate`,
`.export`) call `quiet_tensorflow()` before anything imports TensorFlow:

* unless the user set `TF_CPP_MIN_LOG_LEVEL`, it is set to 2 (TensorFlow's native
  INFO and WARNING lines off; its ERROR lines stay); a user's 2 or 3 is kept, and
  the rest below applies as well (so setting it shows no more than not setting it);
* file descriptor 2 is sent through a filter process, from before TensorFlow is
  imported (and its devices listed) until the process ends: TensorFlow's known
  benign lines (`BENIGN_LINES`: some ignore `TF_CPP_MIN_LOG_LEVEL`, the cuInit
  line is an ERROR, and some come at the first op of a kind, e.g. oneDNN's AVX-512
  notes, or at the first trace of the learner's step, e.g. grappler's ERROR that
  it skipped one remapper fusion) are dropped, and every other line is passed on
  as it arrives, so a TensorFlow abort (no AVX, a failed CUDA check) still shows
  its FATAL line; a FATAL line or a line of absl's Python logging is never
  dropped. If the filter cannot be started (no pipe, no temp file), TensorFlow is
  imported unfiltered.
  The dropped lines are kept (`captured_lines()`): `impala_tf.train` prints them
  when `--num_gpus` asks for GPUs TensorFlow did not find;
* TensorFlow's Python logging below ERROR is dropped (its `tensorflow` logger, and
  the records its modules log through absl, e.g. `functional_saver.py] Sharding
  callback duration`), and Python warnings raised from TensorFlow's modules are
  ignored. Our own absl log lines (the metrics lines) are kept.

To see everything TensorFlow logs, pass absl's `--verbosity=1` (debug; also `-v 1`)
or set `TF_CPP_MIN_LOG_LEVEL` to 0 or 1 yourself, e.g. `TF_CPP_MIN_LOG_LEVEL=0
python -m impala_tf.train ...`: then this module changes nothing. (`impala_tf.train` reads
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
import subprocess
import sys
import tempfile
import time
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


def user_asked_for_logs() -> bool:
  """Whether the user set TF_CPP_MIN_LOG_LEVEL to show INFO or WARNING lines.

  0 or 1 (or a value TensorFlow does not know) asks for TensorFlow's logs; 2 or 3
  is the usual way to quiet TensorFlow and gets the quiet start too (its value
  kept), not more lines than leaving the variable unset would.
  """
  if not user_set_level():
    return False
  try:
    return int(os.environ[LEVEL_VAR]) < 2
  except ValueError:
    return True


# TensorFlow's start-up lines that say nothing is wrong (searched in a line that
# NATIVE_LOG_RE matches, or the whole line for the two without a log prefix).
BENIGN_LINES = (
    r'^WARNING: All log messages before absl::InitializeLog\(\) is called are '
    r'written to STDERR$',
    r'^To enable the following instructions: .* in other operations, rebuild '
    r'TensorFlow with the appropriate compiler flags\.$',
    r'cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized',
    r'port\.cc:\d+\] oneDNN custom operations are on',
    r'cudart_stub\.cc:\d+\] (Could not find cuda drivers|Ignore above cudart '
    r'dlerror)',
    r'\] failed call to cuInit: ',
    r'cuda_diagnostics\.cc:\d+\] ',
    r'dso_loader\.cc:\d+\] Could not load dynamic library',
    r'\] Unable to register cu(DNN|FFT|BLAS) factory',
    r'\] TF-TRT Warning: Could not find TensorRT',
    r'\] could not open file to read NUMA node|Your kernel may have been built '
    r'without NUMA support',
    r'util\.cc:\d+\] oneDNN supports DT_\w+ only on platforms with AVX-512',
    # With oneDNN on, grappler's remapper cannot fuse the leaky ReLU's gradient
    # in the learner's step (`fanout '.../LeakyReluGrad' exist for missing node`)
    # and says so at ERROR level; a failed grappler pass is skipped (the graph
    # runs unfused, RewriterConfig.fail_on_optimizer_errors is off by default),
    # and bench/learner_step.py's step costs what its bare network does.
    r'meta_optimizer\.cc:\d+\] remapper failed: .*LeakyReluGrad',
)
_BENIGN_RE = re.compile('|'.join(f'(?:{p})' for p in BENIGN_LINES))


def is_benign(line: str) -> bool:
  """Whether `line` is one of TensorFlow's known benign start-up lines.

  Never a FATAL line, nor a line that NATIVE_LOG_RE does not match (absl's
  Python lines, ours, anything else).
  """
  return bool(NATIVE_LOG_RE.match(line) and _BENIGN_RE.search(line))


# The filter process (`python -S -E -c`, no site, only builtin modules): reads
# lines on stdin, writes the benign ones (argv[1] and argv[2]: NATIVE_LOG_RE and
# BENIGN_LINES) to the file argv[3], every other line at once to its stdout (the
# real stderr); with argv[4] == '1' it removes argv[3] when its stdin ends. A line
# equal to argv[5] (_SYNC) goes to argv[3] too: it tells that what was written
# before it has been read. It has
# its own session and ignores SIGINT: a Ctrl-C at the terminal is for the run.
_FILTER = r'''
import os, re, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
native, benign = re.compile(sys.argv[1]), re.compile(sys.argv[2])
out = sys.stdout.buffer
try:
  with open(sys.argv[3], 'ab') as kept:
    for raw in sys.stdin.buffer:
      line = raw.decode('utf-8', 'replace').rstrip('\n')
      if line == sys.argv[5] or (native.match(line) and benign.search(line)):
        kept.write(raw)
        kept.flush()
      else:
        out.write(raw if raw.endswith(b'\n') else raw + b'\n')
        out.flush()
finally:
  if sys.argv[4] == '1':
    os.remove(sys.argv[3])
'''

_SYNC = '@@impala_tf.quiet.sync@@'  # No character that splitlines() splits at.
_captured: list = []
# A filter left running: [capture file path, fd of the real stderr].
_lifetime_capture: list = []


def captured_lines() -> list:
  """The benign TensorFlow lines the filter dropped so far (a list of str)."""
  if _lifetime_capture:
    # Wait (a little) until the filter has read what was written before now.
    sys.stderr.flush()
    try:
      os.write(2, (_SYNC + '\n').encode())
    except OSError:
      pass
    deadline = time.monotonic() + 2.0
    while True:
      try:
        with open(_lifetime_capture[0], encoding='utf-8', errors='replace') as f:
          lines = f.read().splitlines()
      except OSError:
        return []
      if _SYNC in lines or time.monotonic() > deadline:
        return [l for l in lines if l != _SYNC]
      time.sleep(0.01)
  return [l for l in _captured if l != _SYNC]


def show_captured_lines() -> None:
  """Writes `captured_lines()` to the real stderr (past the filter, which would
  drop them again)."""
  lines = captured_lines()
  if not lines:
    return
  text = ''.join(l + '\n' for l in lines).encode('utf-8', 'replace')
  sys.stderr.flush()
  try:
    os.write(_lifetime_capture[1] if _lifetime_capture else 2, text)
  except OSError:
    pass


def _start_filter(remove_on_exit: bool):
  """Sends file descriptor 2 through a new filter process.

  Returns:
    (process, dup of the old fd 2, capture file path), or None when it cannot be
    started (no fd 2, no temp file, no process): then nothing changed.
  """
  sys.stderr.flush()
  try:
    saved = os.dup(2)
  except OSError:  # No file descriptor 2: nothing to capture.
    return None
  path = None
  try:
    fd, path = tempfile.mkstemp(prefix='impala_tf_quiet_', suffix='.log')
    os.close(fd)
    proc = subprocess.Popen(
        [sys.executable, '-S', '-E', '-c', _FILTER, NATIVE_LOG_RE.pattern,
         _BENIGN_RE.pattern, path, '1' if remove_on_exit else '0', _SYNC],
        stdin=subprocess.PIPE, stdout=saved, stderr=saved, start_new_session=True)
  except (OSError, ValueError, subprocess.SubprocessError):
    os.close(saved)
    _remove(path)
    return None
  os.dup2(proc.stdin.fileno(), 2)
  proc.stdin.close()  # fd 2 is now the only write end: closing it ends the filter.
  return proc, saved, path


@contextlib.contextmanager
def _native_lines_dropped():
  """Sends file descriptor 2 through the filter process while in the block.

  The filter is a separate process so that the lines it passes on reach the
  terminal even when TensorFlow aborts this one. When it cannot be started,
  nothing is captured (an unquiet import rather than none).
  """
  del _captured[:]
  started = _start_filter(remove_on_exit=False)
  if started is None:
    yield
    return
  proc, saved, path = started
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # A child of TensorFlow holds the pipe.
      proc.kill()
      proc.wait()
    try:
      with open(path, encoding='utf-8', errors='replace') as f:
        _captured.extend(f.read().splitlines())
    except OSError:
      pass
    _remove(path)


def _filter_for_the_process_lifetime() -> bool:
  """Sends fd 2 through the filter until the process ends; False if it cannot.

  TensorFlow prints some benign lines later than its import: e.g. `oneDNN supports
  DT_BOOL only on platforms with AVX-512` at the first op of that type.
  """
  del _captured[:]
  started = _start_filter(remove_on_exit=True)
  if started is None:
    return False
  _, saved, path = started
  _lifetime_capture[:] = [path, saved]
  return True


def _remove(path: Optional[str]) -> None:
  if path:
    try:
      os.remove(path)
    except OSError:
      pass


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
  processes import `impala_tf.ray_actor`): `IMPALA_TF_QUIET=1`, inherited from the
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
    True if it quietened TensorFlow; False when the user set TF_CPP_MIN_LOG_LEVEL
    to 0 or 1, asked for `--verbosity` >= 1, or TensorFlow was already imported
    (then nothing is changed and TensorFlow is not imported).
  """
  if (verbosity >= VERBOSE_FROM or user_asked_for_logs() or
      'tensorflow' in sys.modules):
    return False
  if not user_set_level():
    os.environ[LEVEL_VAR] = '2'
  os.environ[MARK_VAR] = '1'
  _filter_for_the_process_lifetime()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.list_physical_devices()  # Device discovery logs (cuInit) here.
  tf.get_logger().setLevel(logging.ERROR)
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  absl_logging.get_absl_logger().addFilter(_DropTensorFlowRecords())
  warnings.filterwarnings('ignore', module=r'(tensorflow|keras|tf_keras)(\.|$)')
  return True
