"""A progress watchdog: a learner that makes no progress for too long stops the run.

A learner worker that hangs (an env step or a device that never returns, a
checkpoint write on a dead file system, a process frozen by the host) leaves every
other worker of a multi-worker run waiting in its next collective, forever; the
data pipeline's own timeout (--learner_queue_timeout) covers only data that stops.
The `Watchdog` is a daemon thread per learner process, started before the run
builds anything (a start that hangs is a stall too: an env that never builds, a
learner worker that never joins the others, actors that never start). The run loop
calls `progress(step)` after every learner call, `alive()` when a chunk of data
arrives, and `phase(name)` before each part of the start and of the loop (plain
attribute writes: no lock, no I/O); when none of them is seen for `timeout_secs`
the thread calls `on_stall`
with one line, by default printed to stderr before the process exits with status 1
(the main thread may be blocked inside TensorFlow, where no Python exception
reaches it). The newest checkpoint is as it was: checkpoints are written whole or
not at all.

With several workers a second thread writes a heartbeat, `worker_I.json` in
`heartbeat_dir` (a directory of the shared --logdir), every few seconds (its learner
step, its phase, a sequence number, pid and host) and reads the others', noting on
its own clock when each last changed; the watch itself never touches the file
system, so a hung one cannot stop it. A stalled worker's line names the worker(s)
the run waits for: those not heard from during this run, those whose heartbeat
stopped changing (a process frozen or a host gone), else those behind the others
or outside the learner step and the agreement, else every worker: all are inside
a learner step or the agreement, and which of them hangs in its own part of the
step (a device, an op) rather than in a collective is not visible from outside the
TensorFlow call; the line says so.
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
# The two checks at the start that the workers agree (collectives too).
AGREEMENT_ON_FLAGS = 'starting: the workers\' agreement on the flags'
AGREEMENT_ON_RESTORE = 'starting: the workers\' agreement on the restored state'
# Before the strategy: until every worker's heartbeat is seen (`wait_for_all`).
WAITING_FOR_WORKERS = 'starting: waiting for every learner worker\'s heartbeat'
# Phases in which a worker waits for the others (a collective, or the start's
# rendezvous).
COLLECTIVE_PHASES = frozenset({LEARNER_STEP, AGREEMENT, AGREEMENT_ON_FLAGS,
                               AGREEMENT_ON_RESTORE, WAITING_FOR_WORKERS})
# A heartbeat older than this many write intervals is from a process that stopped.
STALE_INTERVALS = 3
# Seconds between heartbeats until every worker has been heard from (the start's
# rendezvous waits on it).
START_INTERVAL_SECS = 0.25


def _exit_on_stall(line: str) -> None:
  """The default `on_stall`: the line on stderr, then the process ends (status 1)."""
  sys.stderr.write(f'impala_tf: error: {line}\n')
  sys.stderr.flush()
  os._exit(1)  # pylint: disable=protected-access


class Watchdog:
  """Calls `on_stall(line)` once when the learner makes no progress for long.

  Progress is a learner call that returned (`progress`) or a chunk of data that
  reached the pipeline (`alive`): one call may need many chunks, so slow but
  healthy data never counts as a stall, while a hung step soon stops the data too
  (the bounded queue fills and the actors wait).

  Args:
    timeout_secs: float, seconds without progress before the stall; 0: off
      (`start` starts nothing; `phase`, `progress` and `alive` still cost
      nothing).
    worker_index: int, this learner worker's index (0 for a single worker).
    num_workers: int >= 1, learner workers of the run.
    heartbeat_dir: directory every worker can read and write (the shared
      --logdir's `heartbeats/`); None: no heartbeats (a single worker).
    on_stall: called from the watchdog's thread with the one-line message; the
      default prints it to stderr and ends the process with status 1.
    interval_secs: seconds between checks and heartbeats (default:
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
    self._stepped = False  # A learner call of this run returned.
    self._phase = 'starting'
    self._last_progress = time.monotonic()
    self._closed = threading.Event()
    self._threads: List[threading.Thread] = []
    self._seq = 0
    # Per other worker: (its last heartbeat, local monotonic time it changed);
    # the time is None until a heartbeat written during this run was seen.
    self._seen: Dict[int, tuple] = {}
    self._seen_lock = threading.Lock()  # Threads only; never a signal handler.
    self.stalled_line: Optional[str] = None

  def start(self, step: int = 0) -> 'Watchdog':
    """Starts the clock at learner step `step`, and the thread(s)."""
    self.step = int(step)
    self._last_progress = time.monotonic()
    if not self.timeout_secs:
      return self
    targets = [self._watch]
    if self.heartbeat_dir:
      # Its own thread: a file system that hangs must not stop the watch.
      targets.append(self._heartbeats)
    for target in targets:
      thread = threading.Thread(target=target, daemon=True,
                                name=f'watchdog{target.__name__}')
      thread.start()
      self._threads.append(thread)
    return self

  def phase(self, name: str) -> None:
    """What the run loop does now ('learner step', 'checkpoint', ...)."""
    self._phase = name

  def progress(self, step: int) -> None:
    """A learner call returned: `step` is the learner step it reached."""
    self.step = int(step)
    self._stepped = True
    self._last_progress = time.monotonic()

  def restored(self, step: int) -> None:
    """The run restored a checkpoint of learner step `step` (progress, no step)."""
    self.step = int(step)
    self._last_progress = time.monotonic()

  def alive(self) -> None:
    """Progress without a step: data arrived, or the run began to stop."""
    self._last_progress = time.monotonic()

  def close(self) -> None:
    """Stops the threads (waits for them briefly; they are daemons)."""
    self._closed.set()
    for thread in self._threads:
      thread.join(timeout=2 * self.interval_secs + 1)

  def _path(self, index: int) -> str:
    return os.path.join(self.heartbeat_dir, f'worker_{index}.json')

  def _beat(self) -> None:
    self._seq += 1
    beat = {'worker': self.worker_index, 'step': self.step, 'phase': self._phase,
            'seq': self._seq, 'time': time.time(), 'pid': os.getpid(),
            'host': socket.gethostname()}
    path = self._path(self.worker_index)
    tmp = f'{path}.tmp'
    try:
      os.makedirs(self.heartbeat_dir, exist_ok=True)
      with open(tmp, 'w') as f:
        json.dump(beat, f)
      os.replace(tmp, path)
    except OSError:
      pass  # A full or gone file system: the stall line still comes.

  def read_heartbeats(self) -> Dict[int, Optional[dict]]:
    """Every worker's heartbeat file (None where there is none or it is unreadable)."""
    beats = {}
    for i in range(self.num_workers):
      try:
        with open(self._path(i)) as f:
          beats[i] = json.load(f)
      except (OSError, ValueError):
        beats[i] = None
    return beats

  def _heartbeats(self) -> None:
    """Writes this worker's heartbeat and notes when the others' change."""
    first = self.read_heartbeats()  # Left by earlier runs: not this run's.
    while True:
      self._beat()
      now = time.monotonic()
      for i, beat in self.read_heartbeats().items():
        with self._seen_lock:
          old, changed = self._seen.get(i, (first.get(i), None))
          if beat is not None and beat != old:
            old, changed = beat, now
          self._seen[i] = (old, changed)
      interval = (self.interval_secs if self.heard_from_all()
                  else min(self.interval_secs, START_INTERVAL_SECS))
      if self._closed.wait(interval):
        return

  def heard_from_all(self) -> bool:
    """Whether every worker has written a heartbeat during this run."""
    with self._seen_lock:
      return all(self._seen.get(i, (None, None))[1] is not None
                 for i in range(self.num_workers))

  def wait_for_all(self, stop: threading.Event) -> bool:
    """Waits (in Python: the watch goes on) until every worker has been heard.

    A learner worker that never starts would otherwise leave the others in
    TensorFlow's connection to it, which holds the GIL: no Python thread, the
    watch included, runs again. After `timeout_secs` the watch's stall line names
    the workers not heard from.

    Returns:
      True when every worker has been heard from (at once without heartbeats),
      False when `stop` was set or the watchdog closed first.
    """
    if not self.heartbeat_dir:
      return True
    while not self.heard_from_all():
      if stop.is_set() or self._closed.wait(0.05):
        return False
    return True

  def others(self) -> Dict[int, Optional[dict]]:
    """Each worker's last heartbeat written during this run, with `age` (local
    seconds since it last changed); None for a worker not heard from yet."""
    now = time.monotonic()
    with self._seen_lock:
      return {i: None if changed is None else dict(beat, age=now - changed)
              for i, (beat, changed) in self._seen.items()}

  def _watch(self) -> None:
    while not self._closed.wait(self.interval_secs):
      idle = time.monotonic() - self._last_progress
      if idle >= self.timeout_secs:
        self.stalled_line = self.stall_line(idle)
        self.on_stall(self.stalled_line)
        return

  def stall_line(self, idle_secs: float) -> str:
    """The one-line message of a stall after `idle_secs` without progress."""
    who = (f'learner worker {self.worker_index}: ' if self.num_workers > 1
           else '')
    if self._stepped:
      line = (f'{who}no learner step for {idle_secs:.0f} s (--stall_timeout_secs='
              f'{self.timeout_secs:g}); the last was step {self.step}, and it is '
              f'now in: {self._phase}')
    else:
      line = (f'{who}no progress for {idle_secs:.0f} s before this run\'s first '
              f'learner step (--stall_timeout_secs={self.timeout_secs:g})')
      if self.step:
        line += f'; the last was step {self.step} (restored)'
      line += f'; it is now in: {self._phase}'
    if self.heartbeat_dir:
      beats = self.others()
      beats[self.worker_index] = dict(step=self.step, phase=self._phase, age=0.0)
      line += '; ' + describe_waiting(
          {i: beats.get(i) for i in range(self.num_workers)}, self.worker_index,
          self.interval_secs * STALE_INTERVALS, self.heartbeat_dir)
    return ' '.join((
        line + '; the run stops; the newest checkpoint in --logdir is intact: '
        'rerun the same command to resume').split())


def describe_waiting(beats: Dict[int, Optional[dict]], me: int,
                     stale_secs: float, heartbeat_dir: str) -> str:
  """Names the worker(s) a stalled run waits for, from their heartbeats.

  Args:
    beats: worker index -> its last heartbeat of this run (`step`, `phase`, and
      `age`, the local seconds since it last changed), or None when none was seen.
    me: this worker's index.
    stale_secs: a heartbeat unchanged for longer is from a process that stopped.
    heartbeat_dir: where the heartbeats are (named when one is missing).

  Returns:
    str, part of the stall line.
  """
  missing = [i for i, b in beats.items() if b is None]
  if missing:
    return (f'no heartbeat from learner worker(s) {_names(missing)} since this '
            f'one started (still starting, hung before its first step, or '
            f'{heartbeat_dir} is not one directory every worker shares)')
  stale = [i for i, b in beats.items() if b['age'] > stale_secs]
  if stale:
    return '; '.join(
        f'learner worker {i} stopped answering {beats[i]["age"]:.0f} s ago '
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
  return (f'every worker is in a collective phase after step {lowest} ('
          f'{LEARNER_STEP} or agreement): one of them hangs inside its own step '
          '(a device, an op) or a collective hangs; the heartbeats cannot tell '
          'which (py-spy dump --pid on each worker shows where it is)')


def _names(indices: List[int]) -> str:
  return ', '.join(str(i) for i in indices)
