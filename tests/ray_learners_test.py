"""Tests for impala_tf.ray_learners: learner workers placed as Ray actors.

One end-to-end run on a local Ray (2 workers of the chain env); the supervision
logic it shares with the local launcher is tested in tests/launcher_test.py.
"""

import glob
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip('ray')

from impala_tf import ray_learners  # pylint: disable=g-import-not-at-top
from impala_tf import testing  # pylint: disable=g-import-not-at-top

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_actor_options_split_ray_resources():
  opts = ray_learners._actor_options(  # pylint: disable=protected-access
      {'CPU': 2.0, 'GPU': 1.0, 'memory': 1e9, 'learner_node': 1.0})
  assert (opts['num_cpus'], opts['num_gpus'], opts['memory']) == (2.0, 1.0, 1e9)
  assert opts['resources'] == {'learner_node': 1.0}
  assert opts['max_restarts'] == 0 and opts['max_concurrency'] > 1
  assert 'resources' not in ray_learners._actor_options({'CPU': 1.0})  # pylint: disable=protected-access


def _processes_mentioning(text):
  pids = []
  for cmdline in glob.glob('/proc/[0-9]*/cmdline'):
    try:
      with open(cmdline, 'rb') as f:
        if text.encode() in f.read():
          pids.append(int(cmdline.split('/')[2]))
    except OSError:
      continue
  return [p for p in pids if p != os.getpid()]


def test_two_ray_learner_workers_train_and_leave_nothing_behind(tmp_path):
  logdir = str(tmp_path / 'run')
  args = [f'--env={testing.CHAIN_ID}', '--num_actors=1', '--num_envs_per_actor=4',
          '--unroll_length=5', '--batch_size=4', '--mlp_hidden_sizes=16',
          '--learner_queue_size=4', '--log_interval_secs=0.5',
          '--num_learner_workers=2', '--learner_backend=ray',
          '--total_environment_frames=2000', f'--logdir={logdir}']
  env = dict(os.environ)
  env['PYTHONPATH'] = str(REPO) + os.pathsep + env.get('PYTHONPATH', '')
  env.pop('TF_CONFIG', None)
  proc = subprocess.run([sys.executable, '-m', 'impala_tf.train'] + args, cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=240)
  out = proc.stdout + proc.stderr
  assert proc.returncode == 0, out[-4000:]
  assert 'ALL network interfaces' in out and '[on the nodes ' in out, out[-3000:]
  assert out.count('impala_tf.train: done:') == 1  # The chief reports the run.
  for name in ('config.json', 'saved_policy/saved_model.pb', 'checkpoints/checkpoint'):
    assert os.path.exists(os.path.join(logdir, name)), name
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    last = [json.loads(l) for l in f if l.strip()][-1]
  assert last['final'] and last['num_learner_workers'] == 2, last
  assert last['trained_frames'] == last['learner_steps'] * 4 * 5
  assert last['env_frames'] >= 2000
  assert not os.path.exists(os.path.join(logdir, 'workertemp_1'))
  assert not _processes_mentioning(logdir)
