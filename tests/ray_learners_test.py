"""Tests for impala_tf.ray_learners: learner workers placed as Ray actors.

One end-to-end run on a local Ray (2 workers of the chain env); the supervision
logic it shares with the local launcher is tested in tests/launcher_test.py.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

import helpers

pytest.importorskip('ray')

from impala_tf import ray_learners  # pylint: disable=g-import-not-at-top
from impala_tf import testing  # pylint: disable=g-import-not-at-top

REPO = helpers.REPO


def test_actor_options_split_ray_resources():
  opts = ray_learners._actor_options(  # pylint: disable=protected-access
      {'CPU': 2.0, 'GPU': 1.0, 'memory': 1e9, 'learner_node': 1.0})
  assert (opts['num_cpus'], opts['num_gpus'], opts['memory']) == (2.0, 1.0, 1e9)
  assert opts['resources'] == {'learner_node': 1.0}
  assert opts['max_restarts'] == 0 and opts['max_concurrency'] > 1
  assert 'resources' not in ray_learners._actor_options({'CPU': 1.0})  # pylint: disable=protected-access


_metrics = helpers.read_metrics


@pytest.mark.e2e
def test_two_ray_learner_workers_train_stop_on_sigterm_and_leave_nothing(tmp_path):
  logdir = str(tmp_path / 'run')
  args = [f'--env={testing.CHAIN_ID}', '--num_actors=1', '--num_envs_per_actor=4',
          '--unroll_length=5', '--batch_size=4', '--mlp_hidden_sizes=16',
          '--learner_queue_size=4', '--log_interval_secs=0.5',
          '--num_learner_workers=2', '--learner_backend=ray',
          '--total_environment_frames=10000000', f'--logdir={logdir}']
  env = dict(os.environ)
  env['PYTHONPATH'] = str(REPO) + os.pathsep + env.get('PYTHONPATH', '')
  env.pop('TF_CONFIG', None)
  log_path = tmp_path / 'run.log'
  with open(log_path, 'w', encoding='utf-8') as log:
    proc = subprocess.Popen([sys.executable, '-m', 'impala_tf.train'] + args,
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
  try:
    # About 35 s alone on 2 cores; minutes beside the rest of the suite on a slow
    # machine. SIGTERM goes only to a run that is training (a worker still
    # starting up has no handler yet: its death would be the test's doing).
    deadline = time.time() + 420
    steps = 0
    while time.time() < deadline and proc.poll() is None:
      m = _metrics(logdir)
      steps = m[-1].get('learner_steps', 0) if m else 0
      if steps >= 32:
        break
      time.sleep(0.2)
    assert proc.poll() is None, log_path.read_text(encoding='utf-8')[-3000:]
    assert steps >= 32, (f'{steps} learner steps in 420 s; '
                         + log_path.read_text(encoding='utf-8')[-3000:])
    # Ray runs actor methods in threads that block SIGTERM: the workers must
    # still get it (a child inherits the mask).
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  out = log_path.read_text(encoding='utf-8')
  assert proc.returncode == 0, out[-4000:]
  assert 'ALL network interfaces' in out and '[on the nodes ' in out, out[-3000:]
  assert out.count('impala_tf.train: done:') == 1  # The chief reports the run.
  for name in ('config.json', 'saved_policy/saved_model.pb', 'checkpoints/checkpoint'):
    assert os.path.exists(os.path.join(logdir, name)), name
  last = _metrics(logdir)[-1]
  assert last['final'] and last['interrupted'], last
  assert last['num_learner_workers'] == 2
  assert last['trained_frames'] == last['learner_steps'] * 4 * 5
  assert not os.path.exists(os.path.join(logdir, 'workertemp_1'))
  assert not testing.processes_mentioning(logdir)


def test_actor_options_place_each_worker_in_its_bundle():
  group = object()
  try:
    opts = ray_learners._actor_options({'CPU': 1.0}, group, 3)  # pylint: disable=protected-access
  except TypeError:  # Ray checks the group's type.
    pytest.skip('this Ray checks the placement group type')
  strategy = opts['scheduling_strategy']
  assert strategy.placement_group is group
  assert strategy.placement_group_bundle_index == 3
  assert ray_learners._bundle({'CPU': 1.0, 'GPU': 0.0, 'x': 2}) == {  # pylint: disable=protected-access
      'CPU': 1.0, 'x': 2.0}


def test_a_worker_on_other_versions_is_named_in_one_line():
  driver = {'impala_tf': '0.3.0', 'TensorFlow': '2.21.0'}
  assert ray_learners.version_mismatch(
      driver, [dict(driver)] * 2, ['10.0.0.1:2222', '10.0.0.2:2222']) is None
  line = ray_learners.version_mismatch(
      driver, [dict(driver), {'impala_tf': '0.3.0', 'TensorFlow': '2.20.0'}],
      ['10.0.0.1:2222', '10.0.0.2:2222'])
  assert line == ('Ray learner worker 1 on node 10.0.0.2 runs impala_tf 0.3.0, '
                  'TensorFlow 2.20.0 but the driver runs impala_tf 0.3.0, TensorFlow '
                  '2.21.0; install the same versions on every node (or ship the code '
                  'with --ray_runtime_env)')
