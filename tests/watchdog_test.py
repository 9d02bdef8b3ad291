"""Tests of impala_tf/watchdog.py: the stall line, the heartbeats, and a hung run."""

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from impala_tf import watchdog

import helpers

REPO = helpers.REPO
# The torso that hangs: --network=testdata.torsos:hangs_in_the_learner.
TORSOS = REPO / 'testdata' / 'torsos.py'


def _wait_for(lines, secs=5.0):
  deadline = time.monotonic() + secs
  while not lines and time.monotonic() < deadline:
    time.sleep(0.02)
  return lines


def test_no_step_for_the_timeout_gives_one_line_naming_step_and_phase():
  lines = []
  dog = watchdog.Watchdog(0.3, on_stall=lines.append, interval_secs=0.05)
  dog.start()
  dog.progress(5)
  dog.phase('writing a checkpoint')
  t0 = time.monotonic()
  assert _wait_for(lines), 'no stall line within 5 s'
  assert 0.25 <= time.monotonic() - t0 < 2.0
  assert len(lines) == 1 and '\n' not in lines[0]
  line = lines[0]
  assert line.startswith('no learner step for 0 s (--stall_timeout_secs=0.3); '
                         'the last was step 5, and it is now in: writing a '
                         'checkpoint; the run stops'), line
  assert 'newest checkpoint in --logdir is intact' in line
  assert dog.stalled_line == line
  dog.close()


def test_steps_within_the_timeout_keep_it_quiet_and_close_ends_the_thread():
  lines = []
  dog = watchdog.Watchdog(0.4, on_stall=lines.append, interval_secs=0.05).start()
  for step in range(20):  # 1 s of steps, 0.05 s apart.
    dog.progress(step)
    time.sleep(0.05)
  dog.close()
  assert lines == []
  assert not any(t.is_alive() for t in dog._threads)  # pylint: disable=protected-access
  time.sleep(0.6)  # Closed: no line later either.
  assert lines == []


def test_zero_is_off_and_negative_is_an_error():
  lines = []
  dog = watchdog.Watchdog(0, on_stall=lines.append, interval_secs=0.01).start()
  time.sleep(0.2)
  assert lines == [] and not dog._threads  # pylint: disable=protected-access
  dog.close()
  with pytest.raises(ValueError, match='timeout_secs must be >= 0, got -1'):
    watchdog.Watchdog(-1)


def test_heartbeat_files_hold_step_phase_and_sequence(tmp_path):
  d = str(tmp_path / 'heartbeats')
  dog = watchdog.Watchdog(60, 1, 2, d, on_stall=lambda _: None,
                          interval_secs=0.05).start()
  dog.progress(42)
  dog.phase(watchdog.AGREEMENT)
  time.sleep(0.3)
  dog.close()  # No write after this: the file is the last heartbeat.
  beat = json.loads((tmp_path / 'heartbeats' / 'worker_1.json').read_text())
  assert beat['worker'] == 1 and beat['step'] == 42
  assert beat['phase'] == watchdog.AGREEMENT and beat['pid'] == os.getpid()
  assert abs(beat['time'] - time.time()) < 5 and beat['seq'] >= 2
  assert dog.read_heartbeats() == {0: None, 1: beat}
  # A single worker writes none.
  single = watchdog.Watchdog(60, heartbeat_dir=str(tmp_path / 'single'),
                             interval_secs=0.05).start()
  time.sleep(0.15)
  single.close()
  assert not (tmp_path / 'single').exists()


def test_two_workers_the_waiting_one_names_the_one_outside_the_step(tmp_path):
  d = str(tmp_path / 'hb')
  lines = {0: [], 1: []}
  dogs = [watchdog.Watchdog(0.4, i, 2, d, on_stall=lines[i].append,
                            interval_secs=0.05) for i in (0, 1)]
  for dog in dogs:
    dog.start()
    dog.progress(10)
  dogs[0].phase(watchdog.LEARNER_STEP)   # Waits in the step's all-reduce.
  dogs[1].phase('writing a checkpoint')  # Hung on its file system.
  assert _wait_for(lines[0]) and _wait_for(lines[1])
  for dog in dogs:
    dog.close()
  assert lines[0][0].startswith('learner worker 0: no learner step for'), lines[0]
  assert ('the run waits for learner worker 1 (at step 10, in: writing a '
          'checkpoint)') in lines[0][0]
  assert 'the other workers wait for this one' in lines[1][0]


def _beat(step, phase, age=0.0):
  return {'step': step, 'phase': phase, 'age': age, 'pid': 7, 'host': 'h'}


@pytest.mark.parametrize('beats, expected', [
    ({0: _beat(3, watchdog.LEARNER_STEP), 1: None},
     'no heartbeat from learner worker(s) 1 since this one started (still '
     'starting, hung before its first step, or HB is not one directory every '
     'worker shares)'),
    ({0: _beat(3, watchdog.LEARNER_STEP), 1: _beat(3, 'writing metrics', age=50)},
     'learner worker 1 stopped answering 50 s ago (at step 3, in: writing '
     'metrics; its process is frozen or its host gone: pid 7 on h)'),
    ({0: _beat(3, watchdog.LEARNER_STEP), 1: _beat(3, watchdog.AGREEMENT),
      2: _beat(3, watchdog.LEARNER_STEP)},
     'every worker is in a collective phase after step 3 (learner step or '
     'agreement): one of them hangs inside its own step (a device, an op) or a '
     'collective hangs; the heartbeats cannot tell which (py-spy dump --pid on '
     'each worker shows where it is)'),
    ({0: _beat(4, watchdog.AGREEMENT), 1: _beat(3, watchdog.LEARNER_STEP),
      2: _beat(4, watchdog.AGREEMENT)},
     'the run waits for learner worker 1 (at step 3, in: learner step)'),
    ({0: _beat(3, watchdog.LEARNER_STEP), 1: _beat(3, 'starting an evaluation'),
      2: _beat(3, 'writing a checkpoint')},
     'the run waits for learner worker 1 (at step 3, in: starting an '
     'evaluation); the run waits for learner worker 2 (at step 3, in: writing a '
     'checkpoint)'),
])
def test_describe_waiting_names_the_worker_from_the_heartbeats(beats, expected):
  assert watchdog.describe_waiting(beats, 0, 30.0, 'HB') == expected


def test_an_earlier_runs_heartbeat_is_not_taken_for_this_runs(tmp_path):
  # Worker 1's file is left from an earlier run; this run's worker 1 never wrote.
  d = tmp_path / 'hb'
  d.mkdir()
  (d / 'worker_1.json').write_text(json.dumps(
      {'worker': 1, 'step': 900, 'phase': 'writing metrics', 'seq': 5,
       'time': time.time() - 86400, 'pid': 1, 'host': 'old'}))
  lines = []
  dog = watchdog.Watchdog(0.4, 0, 2, str(d), on_stall=lines.append,
                          interval_secs=0.05).start(step=900)
  assert _wait_for(lines)
  dog.close()
  assert 'the last was step 900' in lines[0]
  assert 'no heartbeat from learner worker(s) 1 since this one started' in lines[0]


def test_a_file_system_that_hangs_does_not_stop_the_watch(tmp_path, monkeypatch):
  lines = []
  dog = watchdog.Watchdog(0.3, 0, 2, str(tmp_path / 'hb'), on_stall=lines.append,
                          interval_secs=0.05)
  hang = threading.Event()
  monkeypatch.setattr(dog, 'read_heartbeats', lambda: (hang.wait(), {})[1])
  dog.start()
  assert _wait_for(lines), 'a hung heartbeat read stopped the watch'
  hang.set()
  dog.close()
  assert 'no heartbeat from learner worker(s) 1' in lines[0]



def test_workers_meet_at_the_start_and_one_that_never_comes_is_named(tmp_path):
  d = str(tmp_path / 'hb')
  stop = threading.Event()
  # Two workers that both start: each hears the other within a second or so.
  dogs = [watchdog.Watchdog(60, i, 2, d, on_stall=lambda _: None,
                            interval_secs=5).start() for i in (0, 1)]
  t0 = time.monotonic()
  assert all(dog.wait_for_all(stop) for dog in dogs)
  assert time.monotonic() - t0 < 2.0, 'heartbeats at start come every 0.25 s'
  for dog in dogs:
    dog.close()
  # Worker 1 of another run never starts: the watch names it and the phase.
  lines = []
  dog = watchdog.Watchdog(0.4, 0, 2, str(tmp_path / 'hb2'),
                          on_stall=lines.append, interval_secs=0.05).start()
  dog.phase(watchdog.WAITING_FOR_WORKERS)
  waiter = threading.Thread(target=lambda: lines.append(dog.wait_for_all(stop)))
  waiter.start()
  assert _wait_for(lines)
  stop.set()
  waiter.join(timeout=5)
  dog.close()
  assert lines[0] == (
      'learner worker 0: no progress for 0 s before this run\'s first learner '
      'step (--stall_timeout_secs=0.4); it is now in: starting: waiting for every '
      'learner worker\'s heartbeat; no heartbeat from learner worker(s) 1 since '
      'this one started (still starting, hung before its first step, or '
      f'{tmp_path / "hb2"} is not one directory every worker shares); the run '
      'stops; the newest checkpoint in --logdir is intact: rerun the same command '
      'to resume'), lines
  assert lines[1:] == [False]  # The stop ended the wait.
  # A single worker waits for nobody.
  assert watchdog.Watchdog(60).wait_for_all(stop)


@pytest.mark.e2e
def test_a_learner_step_that_never_returns_stops_the_run_with_one_line(tmp_path):
  """Without the watchdog this run hangs forever (the test's timeout fails it)."""
  assert TORSOS.is_file()
  logdir = tmp_path / 'run'
  env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep +
             os.environ.get('PYTHONPATH', ''), CUDA_VISIBLE_DEVICES='',
             TF_CPP_MIN_LOG_LEVEL='2')
  t0 = time.monotonic()
  proc = subprocess.run(
      [sys.executable, '-m', 'impala_tf.train', '--env=CartPole-v1',
       '--network=testdata.torsos:hangs_in_the_learner', '--num_actors=1',
       '--num_envs_per_actor=4', '--unroll_length=8', '--batch_size=4',
       '--total_environment_frames=1000000', '--log_interval_secs=0.01',
       '--learner_queue_timeout=2', '--stall_timeout_secs=5',
       f'--logdir={logdir}'],
      capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300,
      check=False)
  wall = time.monotonic() - t0
  errors = [l for l in proc.stderr.splitlines() if 'error:' in l]
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert len(errors) == 1, proc.stderr[-3000:]
  assert re.match(
      r'impala_tf\.train: error: no learner step for [5-9] s '
      r'\(--stall_timeout_secs=5\); the last was step 2, and it is now in: '
      r'learner step; the run stops', errors[0]), errors
  assert wall < 120, wall
  # What the run wrote before it hung is there: the metrics of its two steps.
  rows = [json.loads(l) for l in (logdir / 'metrics.jsonl').read_text().splitlines()]
  assert rows and max(r['learner_steps'] for r in rows) == 2, rows


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
