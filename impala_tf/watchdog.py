"""A progress watchdog: a learner that makes no step for too long stops the run.

A learner worker that hangs (an env step or a device that never returns, a
checkpoint write on a dead file system, a process frozen by the host) leaves every
other worker of a multi-worker run waiting in its next collective, forever; the
data pipeline's own timeout (--learner_queue_timeout) covers only data that stops.
The `Watchdog` is a daemon thread per learner process. The run loop calls
`progress(step)` after every learner call and `phase(name)` before each part of the
loop (a plain attribute write: no lock, no I/O); when no progress is seen for
`timeout_secs` the thread calls `on_stall` with one line, by default printed to
stderr before the process exits with status 1 (the main thread may be blocked
inside TensorFlow, where no Python exception reaches it). The newest checkpoint is
as it was: checkpoints are written whole or not at all.

With several workers each thread also writes a heartbeat, `worker_I.json` in
`heartbeat_dir` (a directory of the shared --logdir), every few seconds: its learner
step, its phase and the time. A stalled worker's line names the worker(s) the run
waits for: those whose heartbeat has stopped (a process frozen or a host gone),
else those behind the others or in a phase other than the learner step, else
every worker (all wait inside the step: a collective or a device hangs).
"""

import json
import os
import socket
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

LEARNER_STEP = 'learner step'
AGREEMENT = 'the workers\' agreement'
# Phases in which a worker waits for the others (a collective).
COLLECTIVE_PHASES = frozenset({LEARNER_STEP, AGREEMENT})
# A heartbeat older than this many write intervals is from a process that stopped.
STALE_INTERVALS = 3


def _exit_on_stall(line: str) -> None:
  """The default `on_stall`: the line on stderr, then the process ends (status 1)."""
  sys.stderr.write(f'impala_tf: error: {line}\n')
  sys.stderr.flush()
  os._exit(1)  # pylint: disable=protected-access


class Watchdog:
  """Calls `on_stall(line)` once when no learner step is made for `timeout_secs`.

  Args:
    timeout_secs: float, seconds without `progress` before the stall; 0: off
      (`start` starts nothing; `phase` and `progress` still cost nothing).
    worker_index: int, this learner worker's index (0 for a single worker).
    num_workers: int >= 1, learner workers of the run.
    heartbeat_dir: directory every worker can read and write (the shared
      --logdir's `heartbeats/`); None: no heartbeats (a single worker).
    on_stall: called from the watchdog's thread with the one-line message; the
      default prints it to stderr and ends the process with status 1.
    interval_secs: seconds between checks and heartbeat writes (default:
      min(10, timeout_secs / 5)).
  """

  def __init__(self, timeout_secs: float, worker_index: int = 0,
               num_workers: int = 1, heartbeat_dir: Optional[str] = None,
               on_stall: Optional[Callable[[str], None]] = None,
               interval_secs: Optional[float] = None):
    if timeout_secs < 0:
      raise ValueError(f'timeout_secs must be >= 0, got {timeout_secs!r}')
    self.timeout_secs = float(timeout_secs)
    self.worker_index = worker_index
    self.num_workers = num_workers
    self.heartbeat_dir = heartbeat_dir if num_workers > 1 else None
    self.on_stall = on_stall or _exit_on_stall
    self.interval_secs = (interval_secs if interval_secs is not None
                          else min(10.0, self.timeout_secs / 5 or 1.0))
    self.step = 0
    self._phase = 'starting'
    self._last_progress = time.monotonic()
    self._closed = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self.stalled_line: Optional[str] = None

  def start(self) -> 'Watchdog':
    """Starts the clock and the thread (writes the first heartbeat)."""
    self._last_progress = time.monotonic()
    if not self.timeout_secs:
      return self
    if self.heartbeat_dir:
      os.makedirs(self.heartbeat_dir, exist_ok=True)
      self._beat()
    self._thread = threading.Thread(target=self._watch, name='watchdog',
                                    daemon=True)
    self._thread.start()
    return self

  def phase(self, name: str) -> None:
    """What the run loop does now ('learner step', 'checkpoint', ...)."""
    self._phase = name

  def progress(self, step: int) -> None:
    """A learner call returned: `step` is the learner step it reached."""
    self.step = int(step)
    self._last_progress = time.monotonic()

  def close(self) -> None:
    """Stops the thread; the heartbeat file stays (the run's last state)."""
    self._closed.set()
    if self._thread is not None:
      self._thread.join()

  def _path(self, index: int) -> str:
    return os.path.join(self.heartbeat_dir, f'worker_{index}.json')

  def _beat(self) -> None:
    beat = {'worker': self.worker_index, 'step': self.step, 'phase': self._phase,
            'time': time.time(), 'pid': os.getpid(), 'host': socket.gethostname()}
    path = self._path(self.worker_index)
    tmp = f'{path}.tmp'
    try:
      with open(tmp, 'w') as f:
        json.dump(beat, f)
      os.replace(tmp, path)
    except OSError:
      pass  # A full or gone file system: the stall line still comes.

  def read_heartbeats(self) -> Dict[int, Optional[dict]]:
    """Every worker's last heartbeat (None where there is none or it is unreadable)."""
    beats = {}
    for i in range(self.num_workers):
      try:
        with open(self._path(i)) as f:
          beats[i] = json.load(f)
      except (OSError, ValueError):
        beats[i] = None
    return beats

  def _watch(self) -> None:
    while not self._closed.wait(self.interval_secs):
      if self.heartbeat_dir:
        self._beat()
      idle = time.monotonic() - self._last_progress
      if idle >= self.timeout_secs:
        self.stalled_line = self.stall_line(idle)
        self.on_stall(self.stalled_line)
        return

  def stall_line(self, idle_secs: float) -> str:
    """The one-line message of a stall after `idle_secs` without a step."""
    who = (f'learner worker {self.worker_index}: ' if self.num_workers > 1
           else '')
    line = (f'{who}no learner step for {idle_secs:.0f} s (--stall_timeout_secs='
            f'{self.timeout_secs:g}); the last was step {self.step}, and it is '
            f'now in: {self._phase}')
    if self.heartbeat_dir:
      line += '; ' + describe_waiting(self.read_heartbeats(), self.worker_index,
                                      self.interval_secs * STALE_INTERVALS,
                                      self.heartbeat_dir)
    return ' '.join((
        line + '; the run stops; the newest checkpoint in --logdir is intact: '
        'rerun the same command to resume').split())


def describe_waiting(beats: Dict[int, Optional[dict]], me: int,
                     stale_secs: float, heartbeat_dir: str,
                     now: Optional[float] = None) -> str:
  """Names the worker(s) a stalled run waits for, from their heartbeats.

  Args:
    beats: worker index -> its heartbeat dict (`step`, `phase`, `time`) or None.
    me: this worker's index.
    stale_secs: a heartbeat older than this is from a process that stopped.
    heartbeat_dir: where the heartbeats are (named when one is missing).
    now: the time (default: time.time()).

  Returns:
    str, part of the stall line.
  """
  now = time.time() if now is None else now
  missing = [i for i, b in beats.items() if b is None]
  if missing:
    return (f'no heartbeat from learner worker(s) {_names(missing)} in '
            f'{heartbeat_dir} (is --logdir one directory every worker shares?)')
  stale = [i for i, b in beats.items() if now - b['time'] > stale_secs]
  if stale:
    return '; '.join(
        f'learner worker {i} stopped answering {now - beats[i]["time"]:.0f} s ago '
        f'(at step {beats[i]["step"]}, in: {beats[i]["phase"]}; its process is '
        f'frozen or its host gone: pid {beats[i].get("pid")} on '
        f'{beats[i].get("host")})' for i in stale)
  lowest = min(b['step'] for b in beats.values())
  behind = [i for i, b in beats.items()
            if b['step'] == lowest and b['phase'] not in COLLECTIVE_PHASES]
  if not behind and any(b['step'] != lowest for b in beats.values()):
    behind = [i for i, b in beats.items() if b['step'] == lowest]
  if behind:
    return '; '.join(
        f'the run waits for learner worker {i} (at step {beats[i]["step"]}, in: '
        f'{beats[i]["phase"]})' for i in behind if i != me) or (
            'the other workers wait for this one')
  return (f'every worker waits in a collective after step {lowest} ('
          f'{LEARNER_STEP} or agreement): a collective or a device hangs')


def _names(indices: List[int]) -> str:
  return ', '.join(str(i) for i in indices)
