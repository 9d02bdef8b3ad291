"""Checks that runs move between the oldest and the newest supported TensorFlow.

    python .ci/cross_version_check.py --old=OLD_VENV/bin/python --new=NEW_VENV/bin/python

Each interpreter must have impala_tf importable (installed, or this repo on
PYTHONPATH: the script puts the repo first on PYTHONPATH of every child). For each
of two tiny setups (the chain env with the default MLP; fake images with the shallow
conv torso and an LSTM core), it checks:

1. Checkpoints written under OLD resume under NEW, and the other way round: a run
   trained under one interpreter is continued by `python -m impala_tf.train` under
   the other, which must print `impala_tf: resuming from ...` and finish at the
   doubled frame budget.
2. The restored weights are the written ones: `python -m impala_tf.export` under
   the other interpreter writes a SavedModel from the checkpoint, and its outputs
   on fixed inputs equal those of the writer's own `saved_policy`.
3. A `saved_policy` written under OLD loads and acts under NEW with the outputs it
   has under OLD (TensorFlow promises SavedModel compatibility in that direction
   only, so NEW -> OLD is not checked).

Prints one line per check and `cross_version_check: all N checks passed`; exits 1
on the first failure, with the child's output. Takes about two minutes on 2 cores.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Tiny runs that train in seconds; the budget is doubled on resume.
_FRAMES = 400
_SETUPS = {
    'mlp': ['--env=impala_tf.testing:ImpalaChain-v0', '--mlp_hidden_sizes=16'],
    'conv_lstm': ['--env=impala_tf.testing:ImpalaFakeImage-v0', '--network=shallow',
                  '--use_lstm', '--lstm_size=8'],
}
_COMMON = ['--num_actors=1', '--num_envs_per_actor=4', '--unroll_length=5',
           '--batch_size=4', '--learner_queue_size=4', '--log_interval_secs=1']

# Run as `python -c` by each interpreter: loads a SavedModel with TensorFlow alone
# and prints its outputs on fixed inputs (two steps, feeding the state back).
_PROBE = r'''
import json, sys
import numpy as np
import tensorflow as tf
policy = tf.saved_model.load(sys.argv[1])
serve = policy.signatures['serving_default']
specs = serve.structured_input_signature[1]
batch = 3
rng = np.random.default_rng(0)
obs_spec = specs['observation']
shape = [batch] + obs_spec.shape.as_list()[1:]
if obs_spec.dtype == tf.uint8:
  obs = rng.integers(0, 256, shape).astype(np.uint8)
else:
  obs = rng.standard_normal(shape).astype(obs_spec.dtype.as_numpy_dtype)
inputs = {'observation': tf.constant(obs)}
if 'initial_state' in policy.signatures:
  inputs.update(policy.signatures['initial_state'](batch_size=tf.constant(batch)))
  inputs.update(prev_action=tf.constant([0, 1, 0], tf.int32),
                reward=tf.constant([0.0, 1.0, -1.0]),
                first=tf.constant([True, False, False]))
result = {'tensorflow': tf.__version__}
for step in range(2):
  out = serve(**inputs)
  for name in sorted(out):
    if name != 'action':  # Sampled: only its range is deterministic.
      result[f'{step}/{name}'] = out[name].numpy().tolist()
  actions = out['action'].numpy()
  num_actions = out['policy_logits'].shape[-1]
  assert ((actions >= 0) & (actions < num_actions)).all(), actions
  inputs.update({k: v for k, v in out.items() if k.startswith('core_state_')})
  if 'prev_action' in inputs:
    inputs.update(prev_action=out['greedy_action'],
                  first=tf.constant([False] * batch))
print('PROBE ' + json.dumps(result))
'''


class CheckFailed(Exception):
  pass


def _run(python, args, what, timeout=600):
  env = dict(os.environ)
  env['PYTHONPATH'] = _REPO + os.pathsep + env.get('PYTHONPATH', '')
  env.setdefault('CUDA_VISIBLE_DEVICES', '')
  env.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  proc = subprocess.run([python] + args, cwd=_REPO, env=env, capture_output=True,
                        text=True, timeout=timeout, check=False)
  if proc.returncode != 0:
    raise CheckFailed(f'{what}: exit status {proc.returncode}\n'
                      f'{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}')
  return proc.stdout


def _train(python, setup, logdir, frames):
  return _run(python, ['-m', 'impala_tf.train', f'--logdir={logdir}',
                       f'--total_environment_frames={frames}'] + _COMMON +
              _SETUPS[setup], f'train {setup} {logdir} with {python}')


def _probe(python, path):
  out = _run(python, ['-c', _PROBE, path], f'probe {path} with {python}')
  lines = [l for l in out.splitlines() if l.startswith('PROBE ')]
  if not lines:
    raise CheckFailed(f'probe {path} with {python}: no PROBE line\n{out[-3000:]}')
  return json.loads(lines[-1][len('PROBE '):])


def _assert_close(a, b, what, tol=1e-5):
  keys = sorted(k for k in a if k != 'tensorflow')
  if keys != sorted(k for k in b if k != 'tensorflow'):
    raise CheckFailed(f'{what}: outputs differ in names: {keys} vs {sorted(b)}')
  for k in keys:
    x, y = _flat(a[k]), _flat(b[k])
    if len(x) != len(y) or any(abs(p - q) > tol * (1 + abs(p)) for p, q in zip(x, y)):
      raise CheckFailed(f'{what}: {k} differs:\n{a[k]}\n{b[k]}')


def _flat(v):
  if isinstance(v, list):
    return [x for item in v for x in _flat(item)]
  return [float(v)]


def _last_metrics(logdir):
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    return json.loads(f.read().splitlines()[-1])


def check_setup(setup, pythons, workdir, report):
  """Runs every check of one setup; `pythons` maps 'old'/'new' to interpreters."""
  probes = {}
  for writer, reader in (('old', 'new'), ('new', 'old')):
    logdir = os.path.join(workdir, f'{setup}_{writer}')
    _train(pythons[writer], setup, logdir, _FRAMES)
    written = os.path.join(workdir, f'{setup}_{writer}_policy')
    shutil.copytree(os.path.join(logdir, 'saved_policy'), written)
    probes[writer] = _probe(pythons[writer], written)

    # 2. The checkpoint restores exactly under the reader.
    exported = os.path.join(workdir, f'{setup}_{writer}_exported_by_{reader}')
    _run(pythons[reader], ['-m', 'impala_tf.export', f'--logdir={logdir}',
                           f'--output={exported}'], f'export {logdir}')
    _assert_close(probes[writer], _probe(pythons[reader], exported),
                  f'{setup}: checkpoint written by {writer} TF, exported by {reader}')
    report(f'{setup}: checkpoint written under {writer} TF restores the same weights '
           f'under {reader} TF')

    # 1. The run resumes under the reader.
    out = _train(pythons[reader], setup, logdir, 2 * _FRAMES)
    if 'impala_tf: resuming from ' not in out:
      raise CheckFailed(f'{setup}: {reader} TF did not resume {logdir}:\n{out[-3000:]}')
    frames = _last_metrics(logdir)['env_frames']
    if frames < 2 * _FRAMES:
      raise CheckFailed(f'{setup}: resumed run ended at env_frames={frames}')
    report(f'{setup}: run started under {writer} TF resumed under {reader} TF '
           f'(env_frames {_FRAMES} -> {frames})')

  # 3. The old saved_policy acts under the new TF as under the old.
  new_probe = _probe(pythons['new'], os.path.join(workdir, f'{setup}_old_policy'))
  _assert_close(probes['old'], new_probe, f'{setup}: old saved_policy under new TF')
  report(f'{setup}: saved_policy written under TF {probes["old"]["tensorflow"]} acts '
         f'under TF {new_probe["tensorflow"]} with the same outputs')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--old', required=True, help='python of the oldest-TF venv')
  parser.add_argument('--new', required=True, help='python of the newest-TF venv')
  parser.add_argument('--setups', default=','.join(_SETUPS),
                      help='comma-separated subset of: ' + ', '.join(_SETUPS))
  args = parser.parse_args(argv)
  pythons = {'old': args.old, 'new': args.new}
  passed = 0

  def report(line):
    nonlocal passed
    passed += 1
    print(f'ok: {line}', flush=True)

  workdir = tempfile.mkdtemp(prefix='impala_cross_version_')
  try:
    for setup in args.setups.split(','):
      check_setup(setup, pythons, workdir, report)
  except (CheckFailed, subprocess.TimeoutExpired) as e:
    print(f'FAILED: {e}', flush=True)
    print(f'cross_version_check: FAILED after {passed} checks passed')
    return 1
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  print(f'cross_version_check: all {passed} checks passed')
  return 0


if __name__ == '__main__':
  sys.exit(main())
