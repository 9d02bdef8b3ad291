"""Tests of impala_tf/export.py: the SavedModel policy and `python -m impala_tf.export`.

The SavedModel must load in a Python process that never imports impala_tf: the
loader script below blocks the package (`sys.modules['impala_tf'] = None`, so any
import of it fails) and checks at the end that it stayed blocked.
"""

import concurrent.futures
import json
import os
import shutil
import sys
import textwrap

import pytest

from impala_tf import driver
from impala_tf import export
from impala_tf import flags as flags_lib
from impala_tf import rundir
from impala_tf import testing

import helpers

REPO = helpers.REPO

# TensorFlow's C++ runtime logs a few lines to stderr at import time, before any of
# our code runs (TF_CPP_MIN_LOG_LEVEL does not silence them all); they are not ours.
_NATIVE_LOG_RE = helpers.NATIVE_LOG_RE

_LOADER = textwrap.dedent('''
    import json, sys
    sys.modules['impala_tf'] = None  # Any import of impala_tf now fails.
    import numpy as np
    import tensorflow as tf

    def check(path, kind, other, batch):
      lstm = kind == 'lstm'
      model = tf.saved_model.load(path)
      sig = model.signatures['serving_default']
      _, specs = sig.structured_input_signature
      obs_spec = specs['observation']
      obs = np.random.default_rng(0).normal(
          size=[batch] + obs_spec.shape.as_list()[1:]).astype(np.float32)
      kwargs = {'observation': tf.constant(obs)}
      if lstm:
        state = model.signatures['initial_state'](batch_size=tf.constant(batch))
        kwargs.update(prev_action=tf.zeros([batch], tf.int32),
                      reward=tf.zeros([batch], tf.float32),
                      first=tf.ones([batch], tf.bool), **state)
      out = sig(**kwargs)
      result = {
          'inputs': sorted(specs),
          'outputs': sorted(out),
          'action': out['action'].numpy().tolist(),
          'action_dtype': out['action'].dtype.name,
          'greedy_action': out['greedy_action'].numpy().tolist(),
          'logits_shape': out['policy_logits'].shape.as_list(),
          'baseline_shape': out['baseline'].shape.as_list(),
      }
      if lstm:
        state = {k: v for k, v in out.items() if k.startswith('core_state_')}
        result['state_shapes'] = {k: v.shape.as_list() for k, v in state.items()}
        kwargs.update(first=tf.zeros([batch], tf.bool),
                      prev_action=out['greedy_action'], **state)
        out = sig(**kwargs)  # A second step with the carried state.
        result['state_changed'] = bool(np.any(
            out['core_state_0'].numpy() != state['core_state_0'].numpy()))
      if other:  # Same weights -> same outputs for the same inputs.
        o = tf.saved_model.load(other).signatures['serving_default'](**kwargs)
        result['same_logits'] = bool(np.allclose(
            o['policy_logits'].numpy(), out['policy_logits'].numpy(), atol=1e-6))
      return result

    batch, models = int(sys.argv[1]), json.loads(sys.argv[2])
    results = [check(path, kind, other, batch) for path, kind, other in models]
    for r in results:
      r['impala_tf_blocked'] = sys.modules.get('impala_tf', 'x') is None
      r['impala_modules'] = sorted(
          m for m, v in sys.modules.items() if m.startswith('impala_tf') and v)
    print(json.dumps(results))
''')


def _python(args, cwd, timeout=120):
  return helpers.run_python(args, cwd=cwd, timeout=timeout)


_own_stderr_lines = helpers.own_stderr_lines


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """Two tiny finished runs of the chain env (2 actions): MLP and LSTM."""
  out = {}
  for name, extra in (('mlp', {}), ('lstm', dict(use_lstm=True))):
    logdir = str(tmp_path_factory.mktemp(name))
    cfg = testing.tiny_config(logdir=logdir, total_environment_frames=120, **extra)
    driver.train(cfg)
    out[name] = logdir
  return out


def _load_fresh(cwd, *models, batch=7):
  """Runs _LOADER on each (path, 'mlp'|'lstm'[, path to compare]) in one process."""
  result = _python(['-c', _LOADER, str(batch), json.dumps(models)], cwd=cwd)
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def exported(runs, tmp_path_factory):
  """Runs every export command line at once (TF's import dominates), then loads
  the SavedModels in one fresh process."""
  tmp = tmp_path_factory.mktemp('exported')
  default_logdir = str(tmp / 'copy')
  shutil.copytree(runs['mlp'], default_logdir)
  shutil.rmtree(os.path.join(default_logdir, 'saved_policy'))
  out = str(tmp / 'exported')
  commands = {
      'output': [f'--logdir={runs["lstm"]}', f'--output={out}'],
      'default': [f'--logdir={default_logdir}'],
      'missing': [f'--logdir={tmp / "missing"}'],
      'no_flag': [],
  }
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    futures = {k: pool.submit(_python, ['-m', 'impala_tf.export', *args], REPO)
               for k, args in commands.items()}
    cli = {k: f.result() for k, f in futures.items()}
  assert cli['output'].returncode == 0, cli['output'].stderr[-3000:]
  loaded = _load_fresh(
      tmp,
      (os.path.join(runs['mlp'], 'saved_policy'), 'mlp', None),
      (os.path.join(runs['lstm'], 'saved_policy'), 'lstm', out))
  return dict(cli=cli, loaded=loaded, out=out, default_logdir=default_logdir,
              missing=tmp / 'missing')


@pytest.mark.e2e
@pytest.mark.parametrize('kind', ['mlp', 'lstm'])
def test_saved_policy_loads_without_impala_tf(runs, exported, kind):
  assert os.path.isfile(os.path.join(runs[kind], 'saved_policy', 'saved_model.pb'))
  r = exported['loaded'][0 if kind == 'mlp' else 1]
  assert r['impala_tf_blocked'] and r['impala_modules'] == []
  assert r['action_dtype'] == 'int32'
  assert len(r['action']) == 7 and all(0 <= a < 2 for a in r['action'])
  assert all(0 <= a < 2 for a in r['greedy_action'])
  assert r['logits_shape'] == [7, 2]
  assert r['baseline_shape'] == [7]
  base_outputs = ['action', 'baseline', 'greedy_action', 'policy_logits']
  if kind == 'mlp':
    assert r['inputs'] == ['observation']
    assert r['outputs'] == base_outputs
  else:
    assert r['inputs'] == ['core_state_0', 'core_state_1', 'first', 'observation',
                           'prev_action', 'reward']
    assert r['outputs'] == sorted(base_outputs + ['core_state_0', 'core_state_1'])
    lstm_size = testing.tiny_config().lstm_size
    assert r['state_shapes'] == {'core_state_0': [7, lstm_size],
                                 'core_state_1': [7, lstm_size]}
    assert r['state_changed']


def test_export_cli_writes_the_checkpointed_policy(exported):
  result = exported['cli']['output']
  out = exported['out']
  assert result.stdout.startswith(f'impala_tf.export: wrote {out} from ')
  assert 'Traceback' not in result.stderr
  # The run's own saved_policy and the export come from the same final weights.
  assert exported['loaded'][1]['same_logits'] is True


def test_export_cli_default_output_is_logdir_saved_policy(exported):
  result = exported['cli']['default']
  assert result.returncode == 0, result.stderr[-3000:]
  assert os.path.isfile(os.path.join(exported['default_logdir'], 'saved_policy',
                                     'saved_model.pb'))


@pytest.mark.parametrize('case,message', [
    ('missing', 'no such directory'),
    ('no_flag', '--logdir is required'),
])
def test_export_cli_errors_are_one_line_exit_2(exported, case, message):
  result = exported['cli'][case]
  assert result.returncode == 2, result.stderr[-3000:]
  lines = _own_stderr_lines(result.stderr)
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith('impala_tf.export: error: ')
  assert 'logdir' in lines[0] and message in lines[0], lines[0]
  assert 'Traceback' not in result.stderr
  assert result.stdout == ''
  assert not exported['missing'].exists()


@pytest.mark.e2e
def test_export_run_errors_say_what_is_missing(runs, tmp_path):
  with pytest.raises(rundir.RunDirError, match='has no config.json'):
    export.export_run(str(tmp_path))
  shutil.copy(os.path.join(runs['mlp'], 'config.json'), tmp_path)
  with pytest.raises(rundir.RunDirError, match='has no checkpoint'):
    export.export_run(str(tmp_path))
  assert not (tmp_path / 'saved_policy').exists()


@pytest.mark.e2e
def test_cli_input_errors_come_before_tensorflow_is_imported(runs, tmp_path):
  shutil.copy(os.path.join(runs['mlp'], 'config.json'), tmp_path)
  for args, message in (([], '--logdir is required'),
                        ([f'--logdir={tmp_path / "missing"}'], 'no such directory'),
                        ([f'--logdir={tmp_path}'], 'has no checkpoint')):
    code, tensorflow_imported, stderr = helpers.exit_without_tensorflow(
        'impala_tf.export', args)
    assert code == 2 and message in stderr, (args, stderr[-2000:])
    # TensorFlow < 2.15 is imported before the flags are parsed (flags.py).
    assert tensorflow_imported == flags_lib.imports_tensorflow_before_app(), args


def test_export_defines_no_flags_on_import():
  from absl import flags  # pylint: disable=g-import-not-at-top
  assert 'output' not in flags.FLAGS


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
