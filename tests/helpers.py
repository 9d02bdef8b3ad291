"""What the test files share: the repository root, running `python` on the package,
TensorFlow's native log lines, a process's descendants and a run's metrics.

A test file imports it by name (pytest puts tests/ on the path): `import helpers`.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from impala_tf import socket_audit

# The repository root (the directory of setup.py).
REPO = pathlib.Path(__file__).resolve().parent.parent

# A line TensorFlow or absl's C++ logging writes to stderr by itself (start-up
# notices, CPU feature lines), in the formats of TF >= 2.16 and of older versions.
NATIVE_LOG_RE = re.compile(
    r'^(WARNING: All log messages before absl::InitializeLog\(\) is called are '
    r'written to STDERR|[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\] .*|To enable the '
    r'following instructions: .*'
    # TensorFlow < 2.16: `2024-01-31 12:00:00.123456: E path/x.cc:123] ...`.
    r'|\d{4}-\d\d-\d\d [\d:.]+: [IWEF] \S+:\d+\] .*)$')


def own_stderr_lines(stderr: str) -> List[str]:
  """The non-empty lines of `stderr` that are not TensorFlow's native logs."""
  return [l for l in stderr.splitlines() if l.strip() and not NATIVE_LOG_RE.match(l)]


def run_python(args: Sequence[str], cwd=REPO, timeout: float = 180,
               extra_path: Optional[str] = None,
               env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
  """`python ARGS` with this checkout first on PYTHONPATH; output captured as text.

  Args:
    args: the interpreter's arguments, e.g. ['-m', 'impala_tf.train', ...].
    cwd: the working directory (the repository root by default).
    timeout: seconds before subprocess.TimeoutExpired.
    extra_path: a directory put before the checkout on PYTHONPATH.
    env: the child's environment before PYTHONPATH is set (default: this one's).
  """
  env = dict(os.environ if env is None else env)
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (extra_path, str(REPO), env.get('PYTHONPATH')) if p)
  return subprocess.run([sys.executable, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=timeout)


_EXIT_PROBE = """
import os, runpy, sys
module = sys.argv[1]
sys.argv = [module] + sys.argv[2:]
try:
  runpy.run_module(module, run_name='__main__', alter_sys=True)
except SystemExit as e:
  print('EXIT', e.code, 'tensorflow' in sys.modules,
        os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset'))
"""


def run_exit_probe(module: str, args: Sequence[str],
                   env: Optional[Dict[str, str]] = None) -> Tuple[int, bool, str, str]:
  """Runs `python -m MODULE ARGS` as a program that is expected to exit.

  Args:
    module: the program's module, e.g. 'impala_tf.train'.
    args: its arguments.
    env: the child's environment (default: this one's).

  Returns:
    (its exit status, whether TensorFlow had been imported when it exited, its
    TF_ENABLE_ONEDNN_OPTS then or 'unset', its stderr).
  """
  proc = run_python(['-c', _EXIT_PROBE, module, *args], timeout=120, env=env)
  last = proc.stdout.strip().splitlines()[-1:] or ['']
  assert last[0].startswith('EXIT '), proc.stdout[-2000:] + proc.stderr[-3000:]
  _, code, imported, onednn = last[0].split()
  return int(code), imported == 'True', onednn, proc.stderr


def exit_without_tensorflow(module: str, args: Sequence[str]) -> Tuple[int, bool, str]:
  """`run_exit_probe` without the variable: (status, TF imported, stderr)."""
  code, imported, _, stderr = run_exit_probe(module, args)
  return code, imported, stderr


def descendants(pid: int) -> List[int]:
  """Pids of every process below `pid`, from /proc (`socket_audit.descendants`)."""
  return socket_audit.descendants(pid)


def read_metrics(logdir) -> List[Dict[str, object]]:
  """The complete lines of `logdir/metrics.jsonl` ([] before the file exists)."""
  try:
    with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
      return [json.loads(l) for l in f if l.endswith('\n') and l.strip()]
  except FileNotFoundError:
    return []


def run_probe(script_path, args: Sequence[str] = (), timeout: float = 240,
              **env_overrides) -> Dict[str, object]:
  """Runs a probe script in a fresh python; returns its `RESULT {json}` line's JSON.

  The probe runs with this checkout first on PYTHONPATH, no GPU and TensorFlow's
  INFO logs off (`env_overrides` adds or replaces variables). A probe that fails or
  prints no RESULT line fails the test with the tails of its output.
  """
  env = dict(os.environ, CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2')
  env['PYTHONPATH'] = os.pathsep.join(
      p for p in (str(REPO), os.environ.get('PYTHONPATH')) if p)
  env.update(env_overrides)
  proc = subprocess.run([sys.executable, str(script_path), *map(str, args)],
                        capture_output=True, text=True, env=env, cwd=REPO,
                        timeout=timeout, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
  assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
  return json.loads(lines[-1][len('RESULT '):])
