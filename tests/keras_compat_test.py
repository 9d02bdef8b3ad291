"""impala_tf does not depend on which Keras is installed.

A short training run in a subprocess with Keras 2 as `tf.keras` passes as it does with
the default Keras 3: on TensorFlow >= 2.16 that is `TF_USE_LEGACY_KERAS=1` + tf-keras
(skipped, saying what to install, when tf-keras is absent); on older TensorFlow
`tf.keras` is Keras 2 already (the variable is ignored). impala_tf imports no Keras
module: TensorFlow
itself imports (tf_)keras on `import tensorflow`, so the subprocess records the Keras
modules loaded after `import tensorflow` and asserts that importing impala_tf and
training adds none. A source check backs this up.
"""

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


@pytest.mark.parametrize('legacy', ['1'])
def test_training_with_legacy_keras(tmp_path, legacy):
  if _tf_minor() >= (2, 16) and not _tf_keras_installed():
    major, minor = _tf_minor()
    pytest.skip(f'needs tf-keras matching TensorFlow {tf.__version__}: '
                f'pip install "tf-keras~={major}.{minor}.0"')
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
    # The run really used Keras 2 as tf.keras: tf-keras (TF >= 2.16 honoured the
    # switch), or the keras 2.x package that older TensorFlow ships as tf.keras.
    if _tf_minor() >= (2, 16):
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
