"""End-to-end tests of `--network=MODULE:FUNCTION`, the user's own torso.

A Keras 3 torso and a tf-keras torso (`TF_USE_LEGACY_KERAS=1`) each, in a fresh
process with two virtual CPU devices (towers): train a short CartPole run with and
without `--use_lstm`, resume it from its checkpoint, export the `saved_policy`,
evaluate it from the checkpoint and from the SavedModel, and check that the exported
policy's logits and greedy actions equal the restored network's (the LSTM state
carried over several steps). The torsos live in `testdata/torsos.py`.

Bad `--network` values end `python -m impala_tf.train` with exit status 2 and one
line naming `--network`: a module that is missing, a function that is missing, a
function returning something that is not a torso, a torso of the wrong output rank.
"""

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

import helpers

_REPO = str(helpers.REPO)
_TORSOS_FILE = os.path.join(_REPO, 'testdata/torsos.py')

_SCRIPT = textwrap.dedent(r"""
    import json, os, sys
    import numpy as np
    import tensorflow as tf
    import impala_tf
    from impala_tf import checkpoints, evaluate, export, networks, types
    from testdata import torsos

    root = sys.argv[1]
    report = {'legacy': os.environ.get('TF_USE_LEGACY_KERAS'), 'runs': {}}
    for use_lstm in (False, True):
      logdir = os.path.join(root, f'lstm{int(use_lstm)}')
      cfg = impala_tf.Config(
          env='CartPole-v1', network='testdata.torsos:keras_mlp', use_lstm=use_lstm,
          lstm_size=8, num_virtual_cpu_devices=2, num_actors=1, num_envs_per_actor=4,
          unroll_length=5, batch_size=4, total_environment_frames=200,
          learner_queue_size=4, learner_queue_timeout=60.0, log_interval_secs=0.5,
          logdir=logdir, seed=3)
      first = impala_tf.train(cfg).metrics
      resumed = impala_tf.train(cfg.replace(total_environment_frames=400)).metrics
      out_dir, _ = export.export_run(logdir, os.path.join(logdir, 'exported'))
      ev_ckpt = evaluate.evaluate(logdir, num_episodes=2, source='checkpoint')
      ev_saved = evaluate.evaluate(logdir, num_episodes=2, source='saved_model')
      # The exported policy acts as the restored network does, state carried.
      _, net, _ = checkpoints.restore_network(logdir)
      serve = tf.saved_model.load(out_dir).signatures['serving_default']
      rng = np.random.default_rng(0)
      b = 5
      state = net.initial_state(b)
      saved_state = {k: v for k, v in zip(
          [f'core_state_{i}' for i in range(len(state))], state)}
      max_diff, same_actions = 0.0, True
      for t in range(4):
        obs = rng.normal(size=(b, 4)).astype(np.float32)
        prev = rng.integers(0, 2, b).astype(np.int32)
        rew = rng.normal(size=b).astype(np.float32)
        first_ = np.full(b, t == 0)
        out, state = net.step(types.AgentInput(obs, prev, rew, first_), state)
        kwargs = dict(observation=tf.constant(obs))
        if use_lstm:
          kwargs.update(prev_action=tf.constant(prev), reward=tf.constant(rew),
                        first=tf.constant(first_), **saved_state)
        got = serve(**kwargs)
        saved_state = {k: got[k] for k in saved_state}
        max_diff = max(max_diff, float(np.abs(
            got['policy_logits'].numpy() - out.policy_logits.numpy()).max()))
        same_actions &= bool(np.array_equal(
            got['greedy_action'].numpy(),
            np.argmax(out.policy_logits.numpy(), -1)))
      report['runs'][str(use_lstm)] = dict(
          first=first, resumed=resumed, ev_ckpt=ev_ckpt['episodes'],
          ev_saved=ev_saved['episodes'], max_logit_diff=max_diff,
          same_actions=same_actions, torso_type=type(net.torso).__name__,
          num_torso_variables=len(net.torso.torso_variables),
          numpy_policy=networks.NumpyMLPPolicy.supports(net))
    report['torso_kinds'] = sorted(set(torsos.TORSO_KINDS))
    print('RESULT ' + json.dumps(report))
""")


def _env(**extra):
  path = _REPO + os.pathsep + os.environ.get('PYTHONPATH', '')
  return dict(os.environ, PYTHONPATH=path, CUDA_VISIBLE_DEVICES='',
              TF_CPP_MIN_LOG_LEVEL='2', **extra)


@pytest.mark.e2e
@pytest.mark.parametrize('legacy', ['0', '1'], ids=['keras3', 'tf_keras'])
def test_keras_torso_trains_resumes_exports_evaluates(tmp_path, legacy):
  if legacy == '1':
    tf_version = tuple(int(v) for v in
                       importlib.metadata.version('tensorflow').split('.')[:2])
    if tf_version < (2, 16):
      pytest.skip('TF < 2.16: tf.keras is Keras 2 itself; TF_USE_LEGACY_KERAS and '
                  'tf-keras do not apply (the keras3 case covers it)')
    if importlib.util.find_spec('tf_keras') is None:
      pytest.skip('tf-keras is not installed: pip install "tf-keras~=2.X.0" '
                  'matching TensorFlow 2.X')
  assert os.path.isfile(_TORSOS_FILE)
  script = tmp_path / 'user_torso_run.py'
  script.write_text(_SCRIPT)
  proc = subprocess.run(
      [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
      env=_env(TF_USE_LEGACY_KERAS=legacy), cwd=str(tmp_path), timeout=600,
      check=False)
  lines = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')]
  assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
  report = json.loads(lines[-1][len('RESULT '):])
  # The torso came from the Keras the process asked for.
  assert report['torso_kinds'] == (['tf_keras'] if legacy == '1' else ['keras'])
  for use_lstm, run in report['runs'].items():
    first, resumed = run['first'], run['resumed']
    assert first['num_replicas'] == 2 and resumed['num_replicas'] == 2
    assert first['env_frames'] >= 200 and first['learner_steps'] >= 1
    # Resumed from the checkpoint: counters continue instead of restarting.
    assert resumed['env_frames'] >= 400
    assert resumed['learner_steps'] > first['learner_steps']
    assert resumed['episodes'] >= first['episodes']
    assert run['ev_ckpt'] == 2 and run['ev_saved'] == 2
    assert run['max_logit_diff'] < 1e-5, run
    assert run['same_actions'], run
    assert run['torso_type'] == 'UserTorso'
    assert run['num_torso_variables'] == 2  # The Dense kernel and bias.
    assert not run['numpy_policy']  # Actors act through TensorFlow.
  assert set(report['runs']) == {'False', 'True'}


_BAD = [
    ('no_such_module_xyz:torso', "cannot import module 'no_such_module_xyz'"),
    ('testdata.torsos:no_such_function', "has no function 'no_such_function'"),
    ('testdata.torsos:returns_int', 'returned int, not a torso'),
    ('testdata.torsos:wrong_rank', 'to shape [2, 4, 1] (rank 3)'),
]


@pytest.mark.e2e
def test_bad_network_values_give_one_line(tmp_path):
  procs = []
  for k, (value, _) in enumerate(_BAD):
    logdir = tmp_path / f'run{k}'
    procs.append((logdir, subprocess.Popen(
        [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}',
         f'--network={value}', '--total_environment_frames=200'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        cwd=_REPO)))
  for (value, expected), (logdir, proc) in zip(_BAD, procs):
    _, stderr = proc.communicate(timeout=300)
    lines = [l for l in stderr.splitlines()
             if l.startswith('impala_tf.train: error:')]
    assert proc.returncode == 2, stderr[-3000:]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith(f'impala_tf.train: error: --network={value}: '), lines
    assert expected in lines[0], lines
    assert not (logdir / 'config.json').exists()  # Refused before any work.


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
