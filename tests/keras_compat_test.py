"""impala_tf does not depend on which Keras is installed.

A short training run in a subprocess with Keras 2 as `tf.keras` passes as it does with
the default Keras 3: where TensorFlow honours `TF_USE_LEGACY_KERAS=1` (its lazy Keras
loader reads the variable: 2.16+, and also the 2.13-2.15 releases) that is the
variable + tf-keras (skipped, saying what to install, when tf-keras is absent); on
older TensorFlow `tf.keras` is Keras 2 already (the variable is ignored). impala_tf
imports no Keras
module: TensorFlow
itself imports (tf_)keras on `import tensorflow`, so the subprocess records the Keras
modules loaded after `import tensorflow` and asserts that importing impala_tf and
training adds none. A source check backs this up.
"""

import ast
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import helpers

_REPO = str(helpers.REPO)
_PACKAGE = os.path.join(_REPO, 'impala_tf')
_KERAS_ROOTS = ('keras', 'tf_keras')


def _keras_imports(source, name):
  """`name:line: module` for every Keras import or `tf.keras` use in `source`."""
  found = []
  for node in ast.walk(ast.parse(source, name)):
    if isinstance(node, ast.Import):
      mods = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      mods = [node.module or ''] + [f'{node.module}.{a.name}' for a in node.names]
    elif (isinstance(node, ast.Attribute) and node.attr == 'keras' and
          isinstance(node.value, ast.Name) and node.value.id == 'tf'):
      mods = ['tf.keras']  # Attribute access imports Keras lazily.
    else:
      continue
    if any('keras' in m.split('.') or m.split('.')[0] in _KERAS_ROOTS for m in mods):
      found.append(f'{name}:{node.lineno}: {mods[0]}')
  return found


def test_keras_import_checker_finds_every_form():
  for source in ('import keras', 'import tf_keras as k', 'from keras import layers',
                 'from tensorflow import keras', 'import tensorflow.keras',
                 'from tensorflow.keras import layers',
                 'import tensorflow as tf\nx = tf.keras.layers.Dense'):
    assert _keras_imports(source, 'x.py'), source
  assert not _keras_imports('import tensorflow as tf\nx = tf.nn.relu', 'x.py')


def test_package_source_imports_no_keras():
  offenders = []
  for name in sorted(os.listdir(_PACKAGE)):
    if name.endswith('.py'):
      with open(os.path.join(_PACKAGE, name), encoding='utf-8') as f:
        offenders += _keras_imports(f.read(), name)
  assert not offenders, offenders


_SCRIPT = textwrap.dedent(r"""
    import json, os, sys
    def keras_modules():
      return {m for m in sys.modules if m.split('.')[0] in ('keras', 'tf_keras')}
    import tensorflow as tf
    before = keras_modules()
    from impala_tf import driver
    from impala_tf import testing
    logdir = sys.argv[1]
    result = driver.train(testing.tiny_config(
        logdir=logdir, total_environment_frames=200, num_sgd_iter=2,
        replay_proportion=0.5, replay_buffer_num_slots=4))
    policy = tf.saved_model.load(os.path.join(logdir, 'saved_policy'))
    out = policy.signatures['serving_default'](
        observation=tf.constant([[0.0, 1.0, -1.0]], tf.float32))
    print('RESULT ' + json.dumps(dict(
        metrics=result.metrics,
        legacy=os.environ.get('TF_USE_LEGACY_KERAS'),
        tf_keras_loaded='tf_keras' in sys.modules,
        new_keras_modules=sorted(keras_modules() - before),
        # Which Keras TensorFlow uses as tf.keras (read last: it imports Keras).
        tf_keras_root=tf.keras.__name__.split('.')[0],
        keras_version=getattr(sys.modules.get('keras'), '__version__', None),
        action=int(out['action'].numpy()[0]))))
""")


def _tf_minor():
  return tuple(int(p) for p in tf.__version__.split('.')[:2])


def _tf_keras_installed():
  return importlib.util.find_spec('tf_keras') is not None


def _tf_honours_legacy_keras_switch():
  """Whether this TensorFlow routes `tf.keras` to tf-keras on TF_USE_LEGACY_KERAS=1.

  Read from TensorFlow's lazy Keras loader, not guessed from the version: 2.15.1
  reads the variable (and fails without tf-keras) although it ships Keras 2.
  """
  try:
    from tensorflow.python.util import lazy_loader  # pylint: disable=g-import-not-at-top
    return 'TF_USE_LEGACY_KERAS' in inspect.getsource(lazy_loader)
  except (ImportError, OSError, TypeError):
    return _tf_minor() >= (2, 16)


def legacy_keras_skip_reason(tf_version, honours_switch, tf_keras_installed):
  """Why the TF_USE_LEGACY_KERAS=1 run cannot run here, or None when it can."""
  if honours_switch and not tf_keras_installed:
    major, minor = tf_version.split('.')[:2]
    return (f'needs tf-keras matching TensorFlow {tf_version}: pip install '
            f'"tf-keras~={major}.{minor}.0"')
  return None


@pytest.mark.parametrize('version,honours,installed,skips', [
    ('2.21.0', True, False, True),
    ('2.16.2', True, False, True),
    ('2.15.1', True, False, True),  # Failed 'Keras cannot be imported' before.
    ('2.15.1', True, True, False),
    ('2.12.1', False, False, False),  # tf.keras is Keras 2; the variable ignored.
])
def test_legacy_keras_skip_reason(version, honours, installed, skips):
  reason = legacy_keras_skip_reason(version, honours, installed)
  assert (reason is not None) == skips
  if skips:
    minor = '.'.join(version.split('.')[:2])
    assert reason.endswith(f'pip install "tf-keras~={minor}.0"'), reason


@pytest.mark.e2e
def test_legacy_keras_run_skips_with_its_reason_without_tf_keras(tmp_path):
  # tf-keras hidden from the test process and its children: sys.modules['tf_keras']
  # = None makes find_spec return None and `import tf_keras` fail, as when it is
  # not installed.
  if not _tf_honours_legacy_keras_switch():
    pytest.skip(f'TensorFlow {tf.__version__} ignores TF_USE_LEGACY_KERAS')
  hide = tmp_path / 'hide_tf_keras'
  hide.mkdir()
  (hide / 'sitecustomize.py').write_text(
      "import sys\nsys.modules['tf_keras'] = None\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(hide), _REPO, os.environ.get('PYTHONPATH', '')]),
             CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2')
  proc = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-rs', '-p', 'no:cacheprovider',
       f'{__file__}::test_training_with_legacy_keras'], capture_output=True,
      text=True, env=env, cwd=_REPO, timeout=300, check=False)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out[-5000:]
  assert '1 skipped' in out and 'needs tf-keras matching TensorFlow' in out, out[-3000:]


@pytest.mark.e2e
@pytest.mark.parametrize('legacy', ['1'])
def test_training_with_legacy_keras(tmp_path, legacy):
  reason = legacy_keras_skip_reason(tf.__version__, _tf_honours_legacy_keras_switch(),
                                    _tf_keras_installed())
  if reason:
    pytest.skip(reason)
  script = tmp_path / 'keras_check.py'
  script.write_text(_SCRIPT)
  logdir = tmp_path / 'run'
  env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2',
             TF_USE_LEGACY_KERAS=legacy)
  proc = subprocess.run([sys.executable, str(script), str(logdir)],
                        capture_output=True, text=True, env=env, cwd=_REPO,
                        timeout=300, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
  assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
  out = json.loads(lines[-1][len('RESULT '):])
  assert out['legacy'] == legacy
  if legacy == '1':
    # The run really used Keras 2 as tf.keras: tf-keras (TensorFlow honoured the
    # switch), or the keras 2.x package that older TensorFlow ships as tf.keras.
    if _tf_honours_legacy_keras_switch():
      assert out['tf_keras_loaded']
      assert out['tf_keras_root'] == 'tf_keras', out
    else:
      assert out['tf_keras_root'] == 'keras', out
      assert out['keras_version'].startswith('2.'), out
  assert out['new_keras_modules'] == [], out['new_keras_modules']
  m = out['metrics']
  assert m['env_frames'] >= 200 and m['learner_steps'] >= 2
  assert m['trained_frames'] == (m['consumed_frames'] + m['replayed_frames']) * 2
  assert m['episode_return_mean'] == 8.0
  assert out['action'] in (0, 1)
  for name in ('config.json', 'metrics.jsonl', 'checkpoints', 'saved_policy'):
    assert (logdir / name).exists(), name


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
