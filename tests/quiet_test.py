"""Tests of impala_tf.quiet: which lines and records it drops, when it stays out of
the way (the user's TF_CPP_MIN_LOG_LEVEL, `--verbosity=1`, a plain import of an
entry point's module), and reading --verbosity from a command line."""

import json
import logging
import os
import re
import subprocess
import sys
import tempfile

import pytest

from impala_tf import quiet

import helpers

REPO = helpers.REPO


@pytest.mark.parametrize('argv,verbosity', [
    (['prog'], 0),
    (['prog', '--verbosity=1'], 1),
    (['prog', '-v', '2'], 2),
    (['prog', '--v=3'], 3),
    (['prog', '-verbosity', '1'], 1),
    (['prog', '-v=1', '--logdir=x', '--verbosity=0'], 0),  # The last one counts.
    (['prog', '--verbosity=-1'], -1),
    (['prog', '--verbosity=loud'], 0),  # absl reports it when parsing.
    (['prog', '-v'], 0),                # No value: absl reports it.
    (['prog', '--', '--verbosity=1'], 0),  # After `--`: not a flag.
    (['prog', '--verbose_env=1', '--vv=1'], 0),  # Other flags.
])
def test_argv_verbosity(argv, verbosity):
  assert quiet.argv_verbosity(argv) == verbosity


@pytest.mark.parametrize('line', [
    'I0000 00:00:1796075705.554643   13599 cpu_feature_guard.cc:210] This '
    'TensorFlow binary is optimized to use available CPU instructions',
    'E0000 00:00:1796075705.566074   13599 cuda_executor.cc:1228] failed call to '
    'cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)',
    'WARNING: All log messages before absl::InitializeLog() is called are written '
    'to STDERR',
    'To enable the following instructions: AVX2 FMA, in other operations, rebuild '
    'TensorFlow with the appropriate compiler flags.',
    '2024-01-31 12:00:00.123456: I tensorflow/core/util/port.cc:110] oneDNN '
    'custom operations are on.',
])
def test_native_log_lines_are_recognised(line):
  assert quiet.NATIVE_LOG_RE.match(line)


def _absl_python_line(level, message):
  """A line exactly as absl's Python logging prints it (prefix and all)."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  record = logging.LogRecord('absl', level, '/repo/impala_tf/driver.py', 92,
                             message, None, None)
  return absl_logging.get_absl_log_prefix(record) + record.getMessage()


@pytest.mark.parametrize('line', [
    'impala_tf.train: error: --batch_size must be >= 1, got 0',
    'Traceback (most recent call last):',
    # absl's Python lines, in the format absl really prints (same layout as the
    # native ones, but a .py file): ours, never dropped.
    _absl_python_line(logging.INFO, 'frames 4/4,000 (0%) | fps 0'),
    _absl_python_line(logging.WARNING, 'actor(s) 0 did not stop within 8 s'),
    _absl_python_line(logging.ERROR, 'actor 0 died (RuntimeError: boom)'),
    # TensorFlow's FATAL lines say why the process aborts: never dropped.
    'F0000 00:00:1796075705.566074   13599 cpu_feature_guard.cc:81] The TensorFlow '
    'library was compiled to use AVX instructions, but these aren\'t available on '
    'your machine.',
    '2024-01-31 12:00:00.123456: F tensorflow/core/platform/cpu_feature_guard.cc:'
    '37] The TensorFlow library was compiled to use AVX instructions',
], ids=['ours', 'traceback', 'absl_info', 'absl_warning', 'absl_error',
        'tf_fatal', 'tf_fatal_old_format'])  # Fixed ids: the lines hold the time.
def test_other_lines_are_not_native(line):
  assert not quiet.NATIVE_LOG_RE.match(line)


def test_absl_python_lines_have_the_native_layout():
  # What makes the test above meaningful: absl's own format, checked.
  line = _absl_python_line(logging.INFO, 'frames')
  assert re.match(r'^I\d{4} [\d:.]+ +\d+ driver\.py:92\] frames$', line), line


def _record(pathname, level):
  return logging.LogRecord('absl', level, pathname, 1, 'message', None, None)


@pytest.mark.parametrize('pathname,level,kept', [
    ('/venv/lib/tensorflow/python/distribute/mirrored_strategy.py',
     logging.INFO, False),
    ('/venv/lib/tensorflow/python/checkpoint/functional_saver.py',
     logging.WARNING, False),
    ('/venv/lib/tensorflow/python/framework/ops.py', logging.ERROR, True),
    ('/venv/lib/keras/src/backend.py', logging.WARNING, False),
    ('/repo/impala_tf/driver.py', logging.INFO, True),
    ('/repo/impala_tf/checkpoints.py', logging.WARNING, True),
])
def test_tensorflow_records_below_error_are_dropped(pathname, level, kept):
  assert quiet._DropTensorFlowRecords().filter(_record(pathname, level)) == kept


_REMAPPER = ("E0000 00:00:1796614917.940214   11895 meta_optimizer.cc:967] remapper "
             "failed: INVALID_ARGUMENT: Mutation::Apply error: fanout "
             "'while/body/_49/gradient_tape/while/LeakyRelu_1/LeakyReluGrad' exist "
             "for missing node 'while/body/_49/while/BiasAdd_1'.")


@pytest.mark.parametrize('line,benign', [
    (_REMAPPER, True),
    # The same pass failing on anything else is news: shown.
    (_REMAPPER.replace('LeakyReluGrad', 'ReluGrad'), False),
    ('E0000 00:00:1.0   1 meta_optimizer.cc:967] layout failed: INVALID_ARGUMENT: '
     'LeakyReluGrad', False),
    ('E0000 00:00:1796075705.566074   13599 cuda_executor.cc:1228] failed call to '
     'cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)', True),
    ('F0000 00:00:1.0   1 meta_optimizer.cc:967] remapper failed: LeakyReluGrad',
     False),
], ids=['remapper_leaky_relu', 'remapper_other_op', 'other_pass', 'cuinit',
        'fatal'])
def test_is_benign(line, benign):
  assert quiet.is_benign(line) == benign


_BENIGN = (b'I0000 00:00:1796075705.554643   13599 cpu_feature_guard.cc:210] This '
           b'TensorFlow binary is optimized to use available CPU instructions\n')
_CUINIT = (b'E0000 00:00:1796075705.566074   13599 cuda_executor.cc:1228] failed call '
           b'to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR '
           b'(303)\n')


def test_native_lines_dropped_passes_other_lines_on(capfd):
  with quiet._native_lines_dropped():  # pylint: disable=protected-access
    os.write(2, _BENIGN)
    os.write(2, b'a line of ours\n')
    os.write(2, b'E0000 00:00:1.0   1 x.cc:1] an error TensorFlow has not '
                b'printed before\n')
    os.write(2, _CUINIT)
    os.write(2, _absl_python_line(logging.INFO, 'frames').encode() + b'\n')
  err = capfd.readouterr().err.splitlines()
  assert err[:2] == ['a line of ours',
                     'E0000 00:00:1.0   1 x.cc:1] an error TensorFlow has not '
                     'printed before']
  assert len(err) == 3 and err[2].endswith('driver.py:92] frames'), err
  assert quiet.captured_lines() == [_BENIGN.decode().rstrip(),
                                    _CUINIT.decode().rstrip()]


@pytest.mark.e2e
def test_fatal_line_reaches_stderr_when_tensorflow_aborts(tmp_path):
  # TensorFlow aborts while it is imported (e.g. no AVX): its FATAL line must be on
  # the terminal, not in a capture that the abort never writes back.
  code = ('import os\nfrom impala_tf import quiet\n'
          'with quiet._native_lines_dropped():\n'
          f'  os.write(2, {_BENIGN!r})\n'
          "  os.write(2, b'F0000 00:00:1.0   7 cpu_feature_guard.cc:81] The "
          "TensorFlow library was compiled to use AVX instructions, but these "
          "aren\\'t available on your machine.\\n')\n"
          '  os.abort()\n')
  env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep +
             os.environ.get('PYTHONPATH', ''))
  proc = subprocess.run([sys.executable, '-c', code], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode != 0
  assert proc.stderr.splitlines() == [
      'F0000 00:00:1.0   7 cpu_feature_guard.cc:81] The TensorFlow library was '
      "compiled to use AVX instructions, but these aren't available on your "
      'machine.'], proc.stderr


def test_no_temp_file_means_an_unquiet_import_not_a_failure(capfd, monkeypatch):
  def no_temp_file(*unused_args, **unused_kwargs):
    raise OSError(28, 'No space left on device')

  monkeypatch.setattr(tempfile, 'mkstemp', no_temp_file)
  monkeypatch.setattr(tempfile, 'TemporaryFile', no_temp_file)
  with quiet._native_lines_dropped():  # pylint: disable=protected-access
    os.write(2, _BENIGN)
  assert capfd.readouterr().err == _BENIGN.decode()


_PROBE = '''
import json, os, sys
from impala_tf import quiet
result = {}
if sys.argv[1] == 'import_entry_points':
  import impala_tf.evaluate, impala_tf.export
  # They import TensorFlow only once a command's inputs are checked; the user's
  # own code imports it.
  result['imported_by_the_entry_points'] = 'tensorflow' in sys.modules
  import tensorflow
elif sys.argv[1] == 'plain_tensorflow':
  import tensorflow
else:
  result['returned'] = quiet.quiet_tensorflow(int(sys.argv[1]))
result['level'] = os.environ.get('TF_CPP_MIN_LOG_LEVEL')
result['mark'] = os.environ.get('IMPALA_TF_QUIET')
result['tensorflow_imported'] = 'tensorflow' in sys.modules
if result['tensorflow_imported']:
  import tensorflow as tf
  result['tf_logger_level'] = tf.get_logger().level
print(json.dumps(result))
'''


def _probe(arg, **env_overrides):
  env = dict(os.environ)
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)
  env.pop('IMPALA_TF_QUIET', None)
  env.update(env_overrides)
  env['PYTHONPATH'] = str(REPO) + os.pathsep + env.get('PYTHONPATH', '')
  proc = subprocess.run([sys.executable, '-c', _PROBE, arg], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.e2e
def test_quiet_tensorflow_sets_the_level_and_marks_it_as_ours():
  result = _probe('0')
  assert result == {'returned': True, 'level': '2', 'mark': '1',
                    'tensorflow_imported': True, 'tf_logger_level': logging.ERROR}


@pytest.mark.e2e
def test_verbosity_one_leaves_tensorflow_alone():
  assert _probe('1') == {'returned': False, 'level': None, 'mark': None,
                         'tensorflow_imported': False}


@pytest.mark.e2e
def test_level_set_by_the_user_is_left_alone():
  assert _probe('0', TF_CPP_MIN_LOG_LEVEL='0') == {
      'returned': False, 'level': '0', 'mark': None, 'tensorflow_imported': False}


@pytest.mark.e2e
def test_importing_the_entry_points_changes_no_logging():
  result = _probe('import_entry_points')
  plain = _probe('plain_tensorflow')  # TF 2.12 sets TF_CPP_MIN_LOG_LEVEL=1 itself.
  assert result['imported_by_the_entry_points'] is False
  assert result['mark'] is None
  assert result['level'] == plain['level']
  assert result['tf_logger_level'] == plain['tf_logger_level'] != logging.ERROR
