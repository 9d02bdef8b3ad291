"""Starts learner workers on this host and supervises them (--num_learner_workers).

`launch_local(args, num_workers, timeout_secs)` runs `python -m impala_tf.train
ARGS` `num_workers` times, each with a `TF_CONFIG` naming all of them on
127.0.0.1 ports that were free a moment before, and its own task index: the same
program on every worker, TensorFlow's convention (`impala_tf.distribute`). Worker
0 is the chief and writes the run directory. The launcher:

* prints one line at start naming the ports, which TensorFlow's gRPC server opens
  on all interfaces (it has no bind-address option; docs/scaling.md);
* forwards SIGINT and SIGTERM to every worker; they agree to stop at the same
  learner step through the strategy, checkpoint and exit (the handler only
  records the signal, in a `SignalInbox`, and the supervising loop sends it: a
  handler that took a lock the interrupted code held would hang the launcher);
* when a worker dies (an exit status other than 0, or a signal) while others run,
  prints one line naming it, sends SIGTERM to the others and kills (SIGKILL) any
  still running `timeout_secs` after the death; the same deadline applies after a
  forwarded signal and after a worker ends normally while others go on;
* leaves no worker behind: each worker also gets SIGTERM if the launcher itself
  dies (Linux `PR_SET_PDEATHSIG`);
* gives each worker GPUs of its own: worker i sees (`CUDA_VISIBLE_DEVICES`) the
  i-th group of `--num_gpus` of the GPUs the launcher sees
  (`gpu_assignment`), and a worker with `--num_gpus=0` sees none, so no two
  workers open the same GPU and none reserves a GPU it does not use.

This module reads no flags; `impala_tf.train` calls it.
"""

import collections
import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

from impala_tf import config as config_lib
from impala_tf import distribute
from impala_tf import quiet

LAUNCHED_ENV = distribute.LAUNCHED_ENV

_POLL_SECS = 0.1


def die_with_parent():
  """Asks Linux to send this process SIGTERM when its parent dies.

  For a child between fork and exec (`subprocess.Popen(preexec_fn=...)`): a
  worker does not outlive the process that supervises it. Elsewhere than Linux
  it does nothing.
  """
  try:
    libc = ctypes.CDLL('libc.so.6', use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
  except OSError:
    pass  # Not Linux: the launcher's own handlers still stop the workers.


class SignalInbox:
  """SIGINT and SIGTERM, received by a handler that takes no lock.

  A Python signal handler runs in the main thread between two bytecodes of
  whatever it interrupted; one that waited for a lock the interrupted code holds
  would wait forever. `install` sets a handler that only appends the signal to a
  deque (atomic) and starts the stop deadline; the supervising loop `take`s the
  signals and acts on them. `install` and `restore`, or a `with` block, put the
  handler in place and the old ones back.

  Args:
    timeout_secs: the deadline, counted from the first signal.
  """

  def __init__(self, timeout_secs: float):
    self._timeout = timeout_secs
    self._pending = collections.deque()
    self.deadline: Optional[float] = None
    self._old: Dict[int, Callable] = {}

  def _handler(self, signum, frame):
    del frame
    self._pending.append(signum)
    if self.deadline is None:
      self.deadline = time.monotonic() + self._timeout

  def start_deadline(self, now: float):
    """Starts the deadline at `now` unless a signal started it already."""
    if self.deadline is None:
      self.deadline = now + self._timeout

  def take(self) -> List[int]:
    """The signals received since the last call, oldest first."""
    out = []
    while self._pending:
      out.append(self._pending.popleft())
    return out

  def install(self) -> 'SignalInbox':
    """Sets the handler (main thread only); returns self."""
    self._old = {s: signal.signal(s, self._handler)
                 for s in (signal.SIGINT, signal.SIGTERM)}
    return self

  def restore(self):
    """Puts back the handlers `install` replaced."""
    for s, handler in self._old.items():
      signal.signal(s, handler)
    self._old = {}

  def __enter__(self):
    return self.install()

  def __exit__(self, *exc):
    self.restore()


def describe_exit(returncode: int) -> str:
  """How a worker ended: 'was killed by SIGKILL' or 'exited with status 2'."""
  if returncode < 0:
    try:
      name = signal.Signals(-returncode).name
    except ValueError:
      name = f'signal {-returncode}'
    return f'was killed by {name}'
  return f'exited with status {returncode}'


CUDA_VISIBLE_DEVICES = 'CUDA_VISIBLE_DEVICES'


def gpu_assignment(num_workers: int, num_gpus: int, num_visible: int,
                   visible: Optional[str] = None) -> List[str]:
  """Each worker's `CUDA_VISIBLE_DEVICES`: its own `num_gpus` GPUs, or none.

  Args:
    num_workers: N learner workers on this host.
    num_gpus: G, --num_gpus (GPUs per worker).
    num_visible: the GPUs this process sees (TensorFlow's count).
    visible: this process's CUDA_VISIBLE_DEVICES (default: the environment's);
      its entries are what the workers share out, in order.

  Returns:
    N strings: worker i gets entries [i*G, (i+1)*G); '' (no GPU) when G is 0.

  Raises:
    config.ConfigError: naming num_gpus when N*G GPUs are not visible.
  """
  if num_gpus == 0:
    return [''] * num_workers
  visible = os.environ.get(CUDA_VISIBLE_DEVICES) if visible is None else visible
  ids = ([v.strip() for v in visible.split(',') if v.strip()] if visible
         else [str(i) for i in range(num_visible)])[:num_visible]
  need = num_workers * num_gpus
  if len(ids) < need:
    raise config_lib.ConfigError(
        'num_gpus', num_gpus,
        f'is per learner worker: --num_learner_workers={num_workers} x '
        f'--num_gpus={num_gpus} needs {need} GPUs on this host and {len(ids)} are '
        f'visible; lower --num_gpus to <= {len(ids) // num_workers} or start '
        'workers on other hosts (docs/scaling.md)')
  return [','.join(ids[i * num_gpus:(i + 1) * num_gpus]) for i in range(num_workers)]


def worker_commands(args: Sequence[str], num_workers: int, ports: Sequence[int],
                    cuda_devices: Optional[Sequence[str]] = None) -> List[dict]:
  """The command and environment of each worker.

  Args:
    args: the command-line arguments to repeat (flags, no program name).
    num_workers: N.
    ports: N ports on 127.0.0.1.
    cuda_devices: N CUDA_VISIBLE_DEVICES values (`gpu_assignment`); None keeps
      this process's.

  Returns:
    N dicts with `argv` (list of str) and `env` (the environment: this one plus
    TF_CONFIG, LAUNCHED_ENV and CUDA_VISIBLE_DEVICES).
  """
  cluster = distribute.Cluster(tuple(f'127.0.0.1:{p}' for p in ports), 0)
  out = []
  for i in range(num_workers):
    env = dict(os.environ)
    env[distribute.TF_CONFIG] = cluster.tf_config(i)
    env[LAUNCHED_ENV] = '1'
    if cuda_devices is not None:
      env[CUDA_VISIBLE_DEVICES] = cuda_devices[i]
    # TensorFlow's C++ errors when a peer dies (several lines per worker) would
    # bury the launcher's one line naming the worker; TF_CPP_MIN_LOG_LEVEL set
    # by the user is kept.
    if not quiet.user_set_level():
      env[quiet.LEVEL_VAR] = '3'
      env.pop(quiet.MARK_VAR, None)  # The worker keeps 3 as if the user set it.
    out.append({'argv': [sys.executable, '-m', 'impala_tf.train'] + list(args),
                'env': env})
  return out


def launch_local(args: Sequence[str], num_workers: int, timeout_secs: float,
                 prog: str = 'impala_tf.train',
                 ports: Optional[Sequence[int]] = None,
                 cuda_devices: Optional[Sequence[str]] = None) -> int:
  """Runs and supervises the workers (module docstring); returns an exit status.

  Args:
    args: the flags every worker gets (the launcher's own command line).
    num_workers: N >= 2.
    timeout_secs: --learner_worker_timeout_secs.
    prog: the program name of the one-line messages.
    ports: the workers' ports (default: free ones, chosen now).
    cuda_devices: each worker's CUDA_VISIBLE_DEVICES (`gpu_assignment`); None
      keeps the launcher's.

  Returns:
    0 when every worker exited with 0, else 1.
  """
  ports = list(ports) if ports else distribute.free_local_ports(num_workers)
  print(distribute.exposure_line(ports), flush=True)
  procs: List[subprocess.Popen] = []
  failed = False
  with SignalInbox(timeout_secs) as inbox:
    try:
      for spec in worker_commands(args, num_workers, ports, cuda_devices):
        # Its own session: a terminal's Ctrl-C reaches the launcher, which
        # forwards it once.
        procs.append(subprocess.Popen(spec['argv'], env=spec['env'],
                                      start_new_session=True,
                                      preexec_fn=die_with_parent))
      reported = set()
      while True:
        for signum in inbox.take():
          for p in procs:
            if p.poll() is None:
              try:
                p.send_signal(signum)
              except OSError:
                pass
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
          break
        now = time.monotonic()
        for i, code in enumerate(codes):
          if code is None or i in reported:
            continue
          reported.add(i)
          inbox.start_deadline(now)
          if code != 0 and not failed:
            failed = True
            print(f'{prog}: error: learner worker {i} (pid {procs[i].pid}) '
                  f'{describe_exit(code)}; stopping the other '
                  f'{sum(c is None for c in codes)} worker(s) within '
                  f'{timeout_secs:g} s (--learner_worker_timeout_secs); the newest '
                  'checkpoint is kept: rerun the same command to resume',
                  file=sys.stderr, flush=True)
            for p in procs:
              if p.poll() is None:
                try:
                  p.terminate()
                except OSError:
                  pass
        if inbox.deadline is not None and now >= inbox.deadline:
          late = [i for i, p in enumerate(procs) if p.poll() is None]
          for i in late:
            procs[i].kill()
          for i in late:
            procs[i].wait()
          if late and not failed:
            print(f'{prog}: error: learner worker(s) {", ".join(map(str, late))} '
                  'did not stop within '
                  f'{timeout_secs:g} s (--learner_worker_timeout_secs); killed',
                  file=sys.stderr, flush=True)
          failed = failed or bool(late)
          break
        time.sleep(_POLL_SECS)
    finally:
      for p in procs:  # An exception above: leave nothing behind.
        if p.poll() is None:
          p.kill()
          p.wait()
  codes = [p.returncode for p in procs]
  return 0 if not failed and all(c == 0 for c in codes) else 1
