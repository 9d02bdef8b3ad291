"""Tests for impala_tf.launcher: the workers' TF_CONFIG, supervision, signals.

The workers here are small Python scripts (no TensorFlow), so the supervision is
checked in seconds; tests/train_test.py runs real workers end to end.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from impala_tf import config as config_lib
from impala_tf import distribute
from impala_tf import launcher
from impala_tf import quiet


def test_worker_commands_name_the_cluster_and_each_index(monkeypatch):
  monkeypatch.delenv(quiet.LEVEL_VAR, raising=False)
  specs = launcher.worker_commands(['--logdir=/tmp/x', '--num_learner_workers=2'], 2,
                                   [23456, 23457])
  assert len(specs) == 2
  for i, spec in enumerate(specs):
    assert spec['argv'] == [sys.executable, '-m', 'impala_tf.train',
                            '--logdir=/tmp/x', '--num_learner_workers=2']
    tf_config = json.loads(spec['env']['TF_CONFIG'])
    assert tf_config == {'cluster': {'worker': ['127.0.0.1:23456', '127.0.0.1:23457']},
                         'task': {'type': 'worker', 'index': i}}
    assert distribute.parse_tf_config(spec['env']['TF_CONFIG']).index == i
    assert spec['env'][launcher.LAUNCHED_ENV] == '1'
    # TensorFlow's C++ errors off unless the user set a level.
    assert spec['env'][quiet.LEVEL_VAR] == '3'
  monkeypatch.setenv(quiet.LEVEL_VAR, '0')
  monkeypatch.delenv(quiet.MARK_VAR, raising=False)
  assert launcher.worker_commands([], 2, [1, 2])[0]['env'][quiet.LEVEL_VAR] == '0'


def _fake_workers(monkeypatch, bodies):
  """Makes the launcher start `python -c BODY` for each worker."""
  def commands(args, num_workers, ports, cuda_devices=None):
    del args, ports, cuda_devices
    assert num_workers == len(bodies)
    return [{'argv': [sys.executable, '-c', body], 'env': dict(os.environ)}
            for body in bodies]
  monkeypatch.setattr(launcher, 'worker_commands', commands)


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


@pytest.mark.e2e
def test_a_dead_worker_stops_the_others_within_the_timeout(monkeypatch, capsys,
                                                          tmp_path):
  pid_file = tmp_path / 'pid'
  stubborn = ('import os, signal, time\n'
              'signal.signal(signal.SIGTERM, signal.SIG_IGN)\n'
              f'open({str(pid_file)!r}, "w").write(str(os.getpid()))\n'
              'time.sleep(120)\n')
  dies = 'import time, sys\ntime.sleep(1.0)\nsys.exit(3)\n'
  _fake_workers(monkeypatch, [stubborn, dies])
  start = time.monotonic()
  code = launcher.launch_local([], 2, timeout_secs=2.0, prog='prog',
                               ports=[1, 2])
  took = time.monotonic() - start
  assert code == 1
  assert took < 1.0 + 2.0 + 2.0, took  # The death, the timeout, slack.
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  assert err[0].startswith('prog: error: learner worker 1 (pid ')
  assert 'exited with status 3; stopping the other 1 worker(s) within 2 s' in err[0]
  assert not _alive(int(pid_file.read_text()))  # Killed, not left behind.


@pytest.mark.e2e
def test_signals_are_forwarded_and_a_clean_stop_exits_0(monkeypatch, tmp_path):
  body = ('import signal, sys, time\n'
          'def stop(signum, frame):\n'
          f'  open({str(tmp_path)!r} + "/w%d" % {{i}}, "w").write(str(signum))\n'
          '  sys.exit(0)\n'
          'signal.signal(signal.SIGTERM, stop)\n'
          'signal.signal(signal.SIGINT, stop)\n'
          'time.sleep(60)\n')
  _fake_workers(monkeypatch, [body.replace('{i}', str(i)) for i in range(2)])
  timer = threading.Timer(1.5, os.kill, args=(os.getpid(), signal.SIGTERM))
  before = lambda signum, frame: None
  old = signal.signal(signal.SIGTERM, before)
  timer.start()
  try:
    code = launcher.launch_local([], 2, timeout_secs=20.0, prog='prog', ports=[1, 2])
    # The handler the launcher replaced is back.
    assert signal.getsignal(signal.SIGTERM) is before
  finally:
    timer.cancel()
    signal.signal(signal.SIGTERM, old)
  assert code == 0
  for i in range(2):
    assert (tmp_path / f'w{i}').read_text() == str(int(signal.SIGTERM))


_SIGNAL_WHILE_STARTING = r"""
import os, signal, subprocess, sys, time
from impala_tf import launcher
real = subprocess.Popen
def popen(argv, **kwargs):
  proc = real(argv, **kwargs)
  ready = os.path.join(sys.argv[1], str(proc.pid))
  while not os.path.exists(ready):
    time.sleep(0.01)
  # A Ctrl-C or SIGTERM while the launcher is inside its start-up code: the
  # handler runs here, between two bytecodes of the launcher's own code.
  os.kill(os.getpid(), signal.SIGTERM)
  return proc
launcher.subprocess.Popen = popen
body = ('import os, signal, sys, time\n'
        'def stop(s, f):\n'
        '  signal.signal(signal.SIGTERM, signal.SIG_IGN)  # One is enough.\n'
        '  sys.exit(0)\n'
        'signal.signal(signal.SIGTERM, stop)\n'
        f'open(os.path.join({sys.argv[1]!r}, str(os.getpid())), "w").close()\n'
        'time.sleep(60)\n')
launcher.worker_commands = lambda args, n, ports, cuda=None: [
    {'argv': [sys.executable, '-c', body], 'env': dict(os.environ)}] * n
sys.exit(launcher.launch_local([], 2, timeout_secs=20.0, ports=[1, 2]))
"""


@pytest.mark.e2e
def test_a_signal_while_the_workers_start_is_forwarded_not_a_hang(tmp_path):
  proc = subprocess.run(
      [sys.executable, '-c', _SIGNAL_WHILE_STARTING, str(tmp_path)],
      capture_output=True, text=True, timeout=60, check=False)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert len(os.listdir(tmp_path)) == 2  # Both workers started, then stopped.


def test_the_signal_inbox_records_signals_and_the_deadline():
  inbox = launcher.SignalInbox(5.0)
  old = signal.getsignal(signal.SIGINT)
  with inbox:
    assert signal.getsignal(signal.SIGINT) == inbox._handler  # pylint: disable=protected-access
    start = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)
    assert inbox.take() == [signal.SIGINT, signal.SIGTERM]
    assert inbox.take() == []
    assert start + 5.0 <= inbox.deadline <= time.monotonic() + 5.0
    first = inbox.deadline
    inbox.start_deadline(time.monotonic() + 100)
    assert inbox.deadline == first
  assert signal.getsignal(signal.SIGINT) is old


@pytest.mark.parametrize('code, text', [(-9, 'was killed by SIGKILL'),
                                        (2, 'exited with status 2')])
def test_describe(code, text):
  assert launcher.describe_exit(code) == text


def test_each_worker_gets_gpus_of_its_own_or_none(monkeypatch):
  monkeypatch.delenv(launcher.CUDA_VISIBLE_DEVICES, raising=False)
  assert launcher.gpu_assignment(2, 2, 4) == ['0,1', '2,3']
  assert launcher.gpu_assignment(3, 1, 4) == ['0', '1', '2']
  assert launcher.gpu_assignment(2, 0, 4) == ['', '']  # CPU workers see no GPU.
  # The launcher's own CUDA_VISIBLE_DEVICES is what is shared out, in its order.
  monkeypatch.setenv(launcher.CUDA_VISIBLE_DEVICES, '3, 1,0,2')
  assert launcher.gpu_assignment(2, 2, 4) == ['3,1', '0,2']
  with pytest.raises(config_lib.ConfigError,
                     match=r'^num_gpus=2: is per learner worker: '
                           r'--num_learner_workers=3 x --num_gpus=2 needs 6 GPUs on '
                           r'this host and 4 are visible; lower --num_gpus to <= 1'):
    launcher.gpu_assignment(3, 2, 4)
  specs = launcher.worker_commands([], 2, [1, 2], cuda_devices=['3,1', '0,2'])
  assert [s['env'][launcher.CUDA_VISIBLE_DEVICES] for s in specs] == ['3,1', '0,2']
  kept = launcher.worker_commands([], 2, [1, 2])
  assert [s['env'][launcher.CUDA_VISIBLE_DEVICES] for s in kept] == ['3, 1,0,2'] * 2
