"""Actors as Ray actor processes: the `ray` backend of `impala_tf.actor_pool`.

```
driver process                                      Ray actor process (one per actor)
  publish(version, weights)                           ImpalaActor: vector env, network
    -> ray.put once per version actually sent         copy, impala_tf.actor.Actor
  feeder thread: while the learner queue has  --->  unroll(version, [weights_ref]):
    room, asks each idle actor for one unroll;          fetches the weights if the
    puts each answer's chunk ObjectRef into the         version is new (checked by
    bounded LearnerQueue (blocking:              <---   name and shape), returns one
    back-pressure), counts steps and episodes           chunk [B, T + 1, ...] and a
                                                        small info dict
  tf.data loaders: get_chunk() = ray.get(next ref)
```

The actor steps its envs only while it answers a request, so it produces exactly the
chunks a thread actor produces (same `Actor.unrolls` code, same seeds, same sampling
stream: the actor's checkpointed tf.random.Generator state travels with every
answer). An actor is asked for an unroll only while the learner queue has room,
one request at a time, as a thread actor acts only after finding room: at most one
chunk per actor exists beyond the learner queue, and it is made with the weights
of when room appeared.

At start the pool reserves all actors' resources at once (a placement group, one
bundle per actor), waiting up to `ray_placement_timeout_secs` for them. An actor
hides every GPU unless Ray gave it one, and checks that it runs the driver's
impala_tf and TensorFlow versions before it builds its env and network.

A Ray actor that dies (env error, process killed, node lost) or hangs (no unroll
within `actor_unroll_timeout_secs`) is replaced, after a doubling backoff, by a new
one with fresh env seeds and counted in `restarts`. The run stops with a one-line
error naming the root cause (`root_cause`) after `max_actor_restarts` replacements,
when one actor dies `MAX_RESTARTS` times a minute, when a replacement no node of the
cluster can host (its `--ray_actor_resources` left with a removed node), or at once
on a version or weights mismatch.

`RaySession` connects the run to Ray: `ray_address=''` starts a local instance that
listens on the loopback interface only (checked after `ray.init`: it fails closed),
starts no dashboard, and is shut down by `stop()`; `'auto'` or an address joins a
running cluster within `ray_connect_timeout_secs` and leaves it running; a Ray
already initialised in this process (library use, tests) is used as it is.
"""

import contextlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from impala_tf import quiet

# A Ray actor process imports this module first: as quiet as the run that started it.
quiet.quiet_if_parent_was()

# pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order
from absl import logging
import numpy as np
import tensorflow as tf

from impala_tf import actor as actor_lib
from impala_tf import actor_pool
from impala_tf import config as config_lib
from impala_tf import types

# Unroll requests an actor has at a time: it acts only when asked, and it is asked
# only while the learner queue has room (as a thread actor waits for room).
REQUESTS_IN_FLIGHT = 1
# Seconds the feeder waits for an answer while an actor is idle for a full queue.
_IDLE_POLL_SECS = 0.002
# Seconds between checks that a pending replacement actor can still be placed, and
# that no actor hangs.
_PLACEMENT_CHECK_SECS = 1.0
# Seconds between the lines saying what a start waits for.
_PLACEMENT_LOG_SECS = 10.0
# A slot whose actor died n times in a row (no unroll in between) is replaced after
# `actor_pool.backoff_secs(n)` seconds.
RESTART_BACKOFF_SECS = actor_pool.RESTART_BACKOFF_SECS
# Ray reads this at import to choose the node address; '0' makes it the loopback one.
_LOOPBACK_ENV = 'RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'


def _ray():
  """Imports ray, with a clear error when the extra is not installed."""
  try:
    import ray  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise actor_pool.ActorPoolError(
        "--actor_backend=ray needs Ray: pip install -e '.[ray]' (or pip install "
        "'ray>=2.60,<3')") from None
  return ray


class RaySession:
  """The run's connection to Ray; see the module docstring.

  Args:
    address: Config.ray_address.
    num_cpus: CPUs of a local instance (default: this machine's).
    connect_timeout: Config.ray_connect_timeout_secs: seconds a cluster at
      `address` has to answer and accept this driver.
    runtime_env: Config.ray_runtime_env_dict: the job's Ray runtime_env (local
      working_dir / py_modules are uploaded by ray.init, so it goes there).

  Attributes:
    started: True when this session started the Ray instance (and stops it).

  Raises:
    actor_pool.ActorPoolError: (one line) no Ray cluster answered at `address`
      within `connect_timeout`.
  """

  def __init__(self, address: str, num_cpus: Optional[int] = None,
               connect_timeout: float = 60.0, runtime_env: Optional[dict] = None):
    ray = _ray()
    self.started = False
    self._connected = False
    if ray.is_initialized():
      if runtime_env:
        raise actor_pool.ActorPoolError(
            '--ray_runtime_env is given to ray.init, but Ray was already '
            'initialised in this process; pass it to your ray.init(runtime_env=...) '
            'instead')
      return
    handlers = _save_signal_handlers()
    try:
      if address:
        _join(ray, address, connect_timeout, runtime_env)
      else:
        _start_local(ray, num_cpus, runtime_env)
        self.started = True
      self._connected = True
    finally:
      # ray.init replaces the SIGTERM handler with sys.exit; the run keeps its own
      # (a clean stop with a final checkpoint).
      _restore_signal_handlers(handlers)

  def close(self):
    """Shuts down a Ray this session started; disconnects from a joined one."""
    if self._connected:
      self._connected = False
      _ray().shutdown()


_LOOPBACK_HOSTS = ('127.0.0.1', 'localhost', '::1')


def _bootstrap_address(address: str) -> str:
  """HOST:PORT that `address` ('auto', HOST:PORT or ray://HOST:PORT) points to.

  Raises:
    actor_pool.ActorPoolError: 'auto' finds no running Ray on this machine.
  """
  if address == 'auto':
    from ray._private import services  # pylint: disable=g-import-not-at-top
    try:
      found = services.get_ray_address_from_environment('auto', None)
    except Exception as e:  # pylint: disable=broad-except
      raise actor_pool.ActorPoolError(
          f'--ray_address=auto found no running Ray cluster on this machine '
          f'({actor_pool._one_line(e)}); start one with `ray start --head` or give '  # pylint: disable=protected-access
          'its HOST:PORT') from None
    if not found or found == 'auto':
      raise actor_pool.ActorPoolError(
          '--ray_address=auto found no running Ray cluster on this machine; start '
          'one with `ray start --head` or give its HOST:PORT')
    address = found
  return address.split('://', 1)[-1]


def _split_host_port(address: str, flag_value: str):
  host, sep, port = address.rpartition(':')
  if not sep or not port.isdigit() or not host:
    raise actor_pool.ActorPoolError(
        f'--ray_address={flag_value}: must be HOST:PORT (as printed by `ray start '
        "--head`), 'auto' or '' (start a local Ray)")
  return host.strip('[]'), int(port)


def _join(ray, address: str, timeout: float, runtime_env: Optional[dict] = None):
  """ray.init(address=...) that answers within `timeout` seconds, in one line.

  A TCP connection to the head's GCS port is tried first (Ray itself retries an
  address where nothing listens for minutes without a word), then ray.init runs
  with what is left of `timeout`. A head on the loopback interface (a single-machine
  `ray start --head`) is joined as a loopback node: Ray would otherwise rewrite
  127.0.0.1 to this machine's network address and find no node there.
  """
  deadline = time.monotonic() + timeout
  target = _bootstrap_address(address)
  host, port = _split_host_port(target, address)
  said = f'--ray_address={address}' + (f' ({target})' if target != address else '')
  hint = (f'within --ray_connect_timeout_secs={timeout:g}; check that the cluster '
          'is up (`ray status` on its head) and reachable from here, or raise '
          '--ray_connect_timeout_secs')
  try:
    with socket.create_connection((host, port), timeout=max(0.1, timeout)):
      pass
  except OSError as e:
    raise actor_pool.ActorPoolError(
        f'{said}: no Ray cluster answered ({type(e).__name__}: '
        f'{actor_pool._one_line(e)}) {hint}') from None  # pylint: disable=protected-access
  loopback = host in _LOOPBACK_HOSTS
  outcome = {}

  def init():
    try:
      with loopback_only() if loopback else contextlib.nullcontext():
        ray.init(address=address if address.startswith('ray://') else target,
                 log_to_driver=True, runtime_env=runtime_env or None)
      outcome['ok'] = True
    except BaseException as e:  # pylint: disable=broad-except
      outcome['error'] = e

  thread = threading.Thread(target=init, name='ray-init', daemon=True)
  thread.start()
  thread.join(max(0.0, deadline - time.monotonic()))
  if thread.is_alive():
    raise actor_pool.ActorPoolError(
        f'{said}: something listens there but no Ray cluster accepted this driver '
        f'{hint}')
  if 'error' in outcome:
    e = outcome['error']
    raise actor_pool.ActorPoolError(
        f'{said}: could not join the Ray cluster ({type(e).__name__}: '
        f'{actor_pool._one_line(e)})') from e  # pylint: disable=protected-access


def _save_signal_handlers():
  if threading.current_thread() is not threading.main_thread():
    return None
  return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}


def _restore_signal_handlers(handlers):
  for s, h in (handlers or {}).items():
    if h is not None:
      signal.signal(s, h)


@contextlib.contextmanager
def loopback_only():
  """Within it, a Ray instance started in this process binds 127.0.0.1 only.

  Ray advertises (and its servers bind) the loopback address when it believes it
  runs a single-machine instance (its Windows/macOS default); we ask for that for
  the processes started inside the block, then restore the setting.
  """
  from ray._private import ray_constants  # pylint: disable=g-import-not-at-top
  env = {_LOOPBACK_ENV: '0', 'TF_CPP_MIN_LOG_LEVEL':
         os.environ.get('TF_CPP_MIN_LOG_LEVEL', '2')}
  saved_env = {k: os.environ.get(k) for k in env}
  saved_flag = ray_constants.ENABLE_RAY_CLUSTER
  os.environ.update(env)
  ray_constants.ENABLE_RAY_CLUSTER = False
  try:
    yield
  finally:
    ray_constants.ENABLE_RAY_CLUSTER = saved_flag
    for k, v in saved_env.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


def _start_local(ray, num_cpus: Optional[int] = None,
                 runtime_env: Optional[dict] = None):
  """Starts a local Ray bound to 127.0.0.1, without dashboard, sized to the machine.

  Then checks that it is (`check_loopback_only`): fails closed, shutting it down.
  """
  before = _socket_inodes(os.getpid())
  with loopback_only():
    ray.init(address='local', num_cpus=num_cpus, include_dashboard=False,
             log_to_driver=True, runtime_env=runtime_env or None)
  try:
    check_loopback_only(os.getpid(), ignore=before)
  except actor_pool.ActorPoolError:
    ray.shutdown()
    raise


# --- Which addresses a process tree listens on (Linux: /proc) ----------------------


def _listening_sockets() -> Dict[str, str]:
  """Socket inode -> local address (hex, as in /proc/net/tcp*) of listening TCP sockets."""
  out = {}
  for path in ('/proc/net/tcp', '/proc/net/tcp6'):
    try:
      with open(path, encoding='utf-8') as f:
        rows = f.read().splitlines()[1:]
    except OSError:
      continue
    for row in rows:
      fields = row.split()
      if len(fields) > 9 and fields[3] == '0A':  # TCP_LISTEN
        out[fields[9]] = fields[1]
  return out


def _socket_inodes(pid: int) -> set:
  inodes = set()
  try:
    fds = os.listdir(f'/proc/{pid}/fd')
  except OSError:
    return inodes
  for fd in fds:
    try:
      target = os.readlink(f'/proc/{pid}/fd/{fd}')
    except OSError:
      continue
    if target.startswith('socket:['):
      inodes.add(target[8:-1])
  return inodes


def _descendants(root: int) -> List[int]:
  children: Dict[int, List[int]] = {}
  for d in os.listdir('/proc'):
    if not d.isdigit():
      continue
    try:
      with open(f'/proc/{d}/stat', encoding='utf-8') as f:
        ppid = int(f.read().rsplit(')', 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
    children.setdefault(ppid, []).append(int(d))
  out, todo = [], [root]
  while todo:
    for c in children.get(todo.pop(), []):
      out.append(c)
      todo.append(c)
  return out


def _is_loopback(hex_address: str) -> bool:
  """Whether a /proc/net/tcp* `ADDR:PORT` (hex) is on the loopback interface."""
  addr = hex_address.rsplit(':', 1)[0].upper()
  if len(addr) == 8:  # IPv4, little-endian: 127.x.x.x
    return addr.endswith('7F')
  return (addr == '00000000000000000000000001000000' or  # ::1
          (addr.startswith('0000000000000000FFFF0000') and addr.endswith('7F')))


def _readable(hex_address: str) -> str:
  addr, port = hex_address.rsplit(':', 1)
  raw = b''.join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
  family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
  host = socket.inet_ntop(family, raw)
  return f'{host}:{int(port, 16)}' if family == socket.AF_INET else f'[{host}]:{int(port, 16)}'


def _process_name(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/comm', encoding='utf-8') as f:
      return f.read().strip()
  except OSError:
    return '?'


def check_loopback_only(root: int, ignore: frozenset = frozenset()):
  """Raises unless every listening TCP socket of `root` and its descendants is local.

  On Linux (it reads /proc; elsewhere it checks nothing). The run's own Ray binds
  127.0.0.1 because impala_tf sets a private Ray constant (`loopback_only`); this
  check makes a Ray release that ignores it stop the run instead of exposing it.

  Args:
    root: the process whose tree is checked (the driver: Ray's processes are its
      descendants).
    ignore: socket inodes of `root` to leave out (those it had before Ray).

  Raises:
    actor_pool.ActorPoolError: (one line) naming the first non-loopback listener.
  """
  if not os.path.isdir('/proc/self/fd'):
    return
  listening = _listening_sockets()
  for pid in [root] + _descendants(root):
    for inode in sorted(_socket_inodes(pid) - set(ignore if pid == root else ())):
      address = listening.get(inode)
      if address is not None and not _is_loopback(address):
        raise actor_pool.ActorPoolError(
            f'the local Ray instance listens on {_readable(address)} (process '
            f'{pid}, {_process_name(pid)}), not only on 127.0.0.1: this Ray '
            'release ignores impala_tf\'s loopback setting, so the run stopped it '
            'rather than open ports to the network; use a Ray version that '
            "setup.py allows, or start Ray yourself and join it with --ray_address")


def hide_gpus_unless_assigned() -> bool:
  """In a Ray actor process: hides every GPU from TensorFlow unless Ray gave it one.

  Ray 2.60 sets `CUDA_VISIBLE_DEVICES` only for actors that reserved a GPU, so an
  actor with `--ray_actor_resources` without "GPU" would otherwise see every GPU of
  its node and create a CUDA context (and take memory) on each. Call it before
  TensorFlow initialises its devices.

  Returns:
    True when the GPUs were hidden.
  """
  if _ray().get_gpu_ids():
    return False  # Ray set CUDA_VISIBLE_DEVICES to the actor's own GPU(s).
  os.environ['CUDA_VISIBLE_DEVICES'] = ''  # Read when TensorFlow initialises CUDA.
  try:
    tf.config.set_visible_devices([], 'GPU')
  except RuntimeError:  # Devices already initialised; the variable is set anyway.
    pass
  return True


backoff_secs = actor_pool.backoff_secs


class ActorHungError(RuntimeError):
  """A Ray actor answered no unroll within --actor_unroll_timeout_secs."""


class VersionMismatchError(RuntimeError):
  """A Ray actor runs other impala_tf or TensorFlow versions than the driver."""


class WeightsMismatchError(RuntimeError):
  """The weights sent to a Ray actor do not fit its network's variables."""


# Errors no replacement actor can get past: they stop the run at once.
_FATAL_ERRORS = (VersionMismatchError, WeightsMismatchError)


def local_versions() -> Dict[str, str]:
  """Versions that must agree between the driver and its Ray actors."""
  # The package (imported before any of its modules; not a BUILD dependency: it
  # depends on the driver, which depends on this module).
  package = sys.modules[__name__.rpartition('.')[0]]
  return {'impala_tf': package.__version__, 'TensorFlow': tf.__version__}


def _canonical_name(name: str) -> str:
  """A variable name without ':0' and Keras' uniquifying '_N' suffixes.

  The driver's reference network is built in a process that already holds the
  learner's, so Keras may have named its layers `dense_1` where an actor says
  `dense`.
  """
  name = name.split(':', 1)[0]
  return '/'.join(re.sub(r'_\d+$', '', part) for part in name.split('/'))


def weight_spec(variables) -> List[Tuple[str, Tuple[int, ...]]]:
  """(canonical name, shape) of each variable, in order (see `_canonical_name`)."""
  return [(_canonical_name(v.name), tuple(int(d) for d in v.shape))
          for v in variables]


def check_weights(spec, weights: Sequence[np.ndarray], variables,
                  actor_id: int):
  """Raises WeightsMismatchError unless `spec` and `weights` fit `variables`.

  Args:
    spec: `weight_spec` of the driver's network (the order of `weights`).
    weights: the arrays, one per variable.
    variables: the actor's network variables.
    actor_id: for the message.
  """
  mine = weight_spec(variables)
  problem = None
  if len(spec) != len(weights):
    problem = f'{len(weights)} arrays for {len(spec)} variables'
  elif len(spec) != len(mine):
    problem = (f'the driver\'s network has {len(spec)} variables, the actor\'s '
               f'{len(mine)}')
  else:
    for (name, shape), w, (my_name, my_shape) in zip(spec, weights, mine):
      if name != my_name or tuple(shape) != my_shape:
        problem = (f'the driver sends {name} {list(shape)} where the actor has '
                   f'{my_name} {list(my_shape)}')
        break
      if tuple(np.shape(w)) != my_shape:
        problem = f'{name}: an array of shape {list(np.shape(w))} for {list(my_shape)}'
        break
  if problem:
    raise WeightsMismatchError(
        f'the weights sent to Ray actor {actor_id} do not fit its network ('
        f'{problem}): the driver and the actor\'s node run different code or '
        'flags; install the same impala_tf on every node')


def _set_threads(num_threads: int):
  try:
    tf.config.threading.set_intra_op_parallelism_threads(num_threads)
    tf.config.threading.set_inter_op_parallelism_threads(num_threads)
  except RuntimeError:  # TensorFlow already started (an actor built in-process).
    pass


class ImpalaActor:
  """The body of one Ray actor process: an impala_tf Actor, one unroll per call.

  The constructor only hides GPUs and sets threads; the env and network are built
  at the first `unroll`, after the actor checked that it runs the driver's
  versions, so a failure there reaches the driver as that call's error (with its
  root cause), not as a dead actor.

  Args:
    config_dict: the run's `Config.to_dict()`.
    actor_id: in [0, num_actors).
    restarts: times this actor was replaced (fresh env seeds).
    observation_space: the single-env observation space.
    action_space: the single-env action space.
    rng_state: int64 state of the actor's sampling tf.random.Generator.
    rng_alg: its algorithm.
    num_threads: TensorFlow intra/inter-op threads (the CPUs it reserved, >= 1).
    resumes: times the run was resumed (enters the env seeds).
    driver_versions: the driver's `local_versions()` (None: not checked).
    id_offset: the pool's `first_actor_id` (`actor_pool.make_actor`).
  """

  def __init__(self, config_dict: dict, actor_id: int, restarts: int,
               observation_space, action_space, rng_state: np.ndarray, rng_alg,
               num_threads: int, resumes: int = 0,
               driver_versions: Optional[Dict[str, str]] = None,
               id_offset: int = 0):
    _set_threads(num_threads)
    hide_gpus_unless_assigned()  # Never take the learner's GPUs.
    self._args = (config_dict, actor_id, restarts, observation_space, action_space,
                  rng_state, rng_alg, resumes, id_offset)
    self._actor_id = actor_id
    self._driver_versions = driver_versions
    self._broadcast = actor_lib.ParameterBroadcast()
    self._episodes: List[types.EpisodeStats] = []
    self._actor = None
    self._unrolls = None
    self._rng = None

  def pid(self) -> int:
    return os.getpid()

  def ready(self) -> int:
    """Answers once the actor process is up (its imports done): its pid."""
    return os.getpid()

  def _check_versions(self):
    mine = local_versions()
    theirs = self._driver_versions
    if theirs is None or mine == theirs:
      return
    node = _ray().util.get_node_ip_address()

    def say(v):
      keys = list(mine) + [k for k in theirs if k not in mine]
      return ', '.join(f'{k} {v.get(k)}' for k in keys)
    raise VersionMismatchError(
        f'Ray actor {self._actor_id} on node {node} runs {say(mine)} but the '
        f'driver runs {say(theirs)}; install the same versions on every node')

  def _build(self):
    self._check_versions()
    (config_dict, actor_id, restarts, observation_space, action_space, rng_state,
     rng_alg, resumes, id_offset) = self._args
    config = config_lib.Config.from_dict(config_dict)
    self._rng = tf.random.Generator.from_state(rng_state, rng_alg)
    self._actor = actor_pool.make_actor(
        config, actor_id, restarts, observation_space, action_space,
        self._broadcast, None, self._episodes.extend, threading.Event(),
        rng=self._rng, resumes=resumes, id_offset=id_offset)
    self._unrolls = self._actor.unrolls()

  def unroll(self, version: int, weights_ref: list):
    """Acts one unroll with the weights of `version`.

    Args:
      version: the policy version (learner step) of `weights_ref[0]`.
      weights_ref: a one-element list holding the ObjectRef of the weights (a list,
        so Ray passes the reference and the weights are fetched only when new):
        `(spec, arrays)`, `spec` the driver network's `weight_spec`.

    Returns:
      (chunk, info): the chunk (dict of arrays `[B, T + 1, ...]`); info is a dict
      with `steps` (int, agent steps taken), `episodes` (list of (return, length))
      and `rng_state` (the sampling generator's state after this unroll).

    Raises:
      VersionMismatchError, WeightsMismatchError: see the classes; the env's own
        errors.
    """
    if self._actor is None:
      self._build()
    if version != self._broadcast.version:
      spec, weights = _ray().get(weights_ref[0])
      check_weights(spec, weights, self._actor._network.variables,  # pylint: disable=protected-access
                    self._actor_id)
      self._broadcast.publish(version, weights)
    steps = self._actor.steps
    try:
      chunk = next(self._unrolls)
    except BaseException:
      self._actor.close()  # The driver replaces this actor; free its env first.
      raise
    info = {'steps': self._actor.steps - steps,
            'episodes': [tuple(e) for e in self._episodes],
            'rng_state': self._rng.state.numpy()}
    self._episodes.clear()
    return chunk, info


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_EXCEPTION_LINE = re.compile(r'^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*: ')


def _where(frames) -> str:
  """' (at FILE:LINE in FUNCTION)' of the innermost of `_FRAME` matches, or ''."""
  if not frames:
    return ''
  path, line, function = frames[-1]
  return f' (at {path}:{line} in {function})'


def root_cause(error: BaseException) -> str:
  """One line naming what made a Ray actor fail: `Type: message (at FILE:LINE in F)`.

  For an exception raised in the actor (a `RayTaskError`): the original exception's
  type and message and the innermost frame of its traceback (the env's own code
  when the env raised). For an actor process that died: Ray's reason.
  """
  exceptions = _ray().exceptions
  if type(error).__name__ == 'UnserializableException':
    # The driver could not rebuild the actor's exception; its text holds the
    # remote traceback, whose last line says what it was.
    text = str(error)
    frames = _FRAME.findall(text)
    said = [l.strip() for l in text.splitlines() if _EXCEPTION_LINE.match(l.strip())]
    if said:
      return f'{actor_pool._one_line(said[-1])}{_where(frames)}'  # pylint: disable=protected-access
  if isinstance(error, exceptions.RayTaskError):
    cause = getattr(error, 'cause', None) or error
    # The exception ray.get raises derives from the cause's class too; its str is
    # the remote traceback (it has no traceback_str of its own).
    frames = _FRAME.findall(str(error))
    return (f'{type(cause).__name__}: '
            f'{actor_pool._one_line(cause)}{_where(frames)}')  # pylint: disable=protected-access
  if isinstance(error, exceptions.RayActorError):
    lines = [l.strip() for l in str(error).splitlines() if l.strip()]
    # An error in the actor's creation task: the last line is the exception.
    frames = _FRAME.findall(str(error))
    if getattr(error, 'actor_init_failed', False) and frames:
      return (f'{type(error).__name__}: '
              f'{actor_pool._one_line(lines[-1])}{_where(frames)}')  # pylint: disable=protected-access
    reason = [l for l in lines if not l.startswith(('class_name:', 'actor_id:',
                                                   'pid:', 'name:', 'namespace:'))]
    return f'{type(error).__name__}: {actor_pool._one_line(" ".join(reason))}'  # pylint: disable=protected-access
  return f'{type(error).__name__}: {actor_pool._one_line(error)}'  # pylint: disable=protected-access


class _Slot:
  """One actor position: the current Ray actor and its requests in flight."""

  def __init__(self, actor_id: int):
    self.actor_id = actor_id
    self.restarts = 0
    self.handle = None
    # (info_ref, chunk_ref, time.monotonic() when requested), oldest first.
    self.pending: List[tuple] = []
    self.answered = False  # The current Ray actor has answered once.
    self.budget = actor_pool.RestartBudget()
    self.ready_ref = None  # Answers once the actor process is up.
    self.up_at: Optional[float] = None  # When it was seen up (monotonic).
    self.last_answer_at = 0.0  # When its last unroll was taken (monotonic).
    self.deaths_in_a_row = 0  # Deaths since its last unroll.
    self.respawn_at: Optional[float] = None  # A replacement is due then.


class RayActorPool(actor_pool.ActorPool):
  """Actors as Ray actor processes; see the module docstring."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._resources = self.config.ray_actor_resources_dict
    self._lock = threading.Lock()
    self._version = -1
    self._weights = None
    self._weights_ref = None
    self._ref_version = None
    self.num_weight_puts = 0
    self._slots: List[_Slot] = []
    self._steps = 0
    self._restarts = 0
    self._session: Optional[RaySession] = None
    self._feeder: Optional[threading.Thread] = None
    self._remote_class = None
    self._last_placement_check = 0.0
    self._spec = None
    self._placement_group = None
    self._last_hung_check = 0.0
    # (actor_id, time.monotonic()) of every death and every actor started.
    self.deaths: List[Tuple[int, float]] = []
    self.spawns: List[Tuple[int, float]] = []

  # --- The interface ---------------------------------------------------------

  def start(self, version, weights):
    self._spec = self._reference_spec()
    if [tuple(s) for _, s in self._spec] != [tuple(np.shape(w)) for w in weights]:
      raise actor_pool.ActorPoolError(
          f'the learner\'s weights (shapes {[list(np.shape(w)) for w in weights]}) '
          f'do not fit the actors\' network ({[list(s) for _, s in self._spec]})')
    self.publish(version, weights)
    self._session = RaySession(self.config.ray_address,
                               connect_timeout=self.config.ray_connect_timeout_secs,
                               runtime_env=self.config.ray_runtime_env_dict)
    ray = _ray()
    self._remote_class = ray.remote(ImpalaActor)
    self._placement_group = self._reserve(ray)
    if self.stop_event.is_set():
      return
    for i in range(self.config.num_actors):
      slot = _Slot(i)
      self._slots.append(slot)
      self._spawn(slot)
    self._feeder = threading.Thread(target=self._feed, name='ray-feeder', daemon=True)
    self._feeder.start()

  def publish(self, version, weights):
    with self._lock:
      self._version = int(version)
      self._weights = list(weights)

  def get_chunk(self):
    ray = _ray()
    while True:
      ref = self.queue.get()
      if ref is None:
        return None
      try:
        return ray.get(ref, timeout=self.config.learner_queue_timeout)
      except ray.exceptions.RayError as e:
        # Its actor answered, so its steps are counted; only the object is gone
        # (stored on a node that was lost). consumed <= env frames still holds.
        logging.warning('an unroll was lost before the learner read it (%s: %s); '
                        'skipping it', type(e).__name__, e)

  @property
  def steps(self):
    return self._steps

  @property
  def restarts(self):
    return self._restarts

  def actor_pids(self) -> Dict[int, int]:
    """actor_id -> process id of its current Ray actor (for tests and tools)."""
    ray = _ray()
    return {s.actor_id: ray.get(s.handle.pid.remote(), timeout=60)
            for s in self._slots if s.handle is not None}

  def stop(self):
    self.stop_event.set()
    if self._feeder is not None and self._feeder.is_alive():
      self._feeder.join(timeout=30)
    if self._session is None:
      return
    ray = _ray()
    for slot in self._slots:
      slot.pending.clear()
      if slot.handle is not None:
        try:
          ray.kill(slot.handle, no_restart=True)
        except Exception:  # pylint: disable=broad-except
          pass
    if self._placement_group is not None:
      try:  # A cluster the run joined stays up: give its resources back.
        ray.util.remove_placement_group(self._placement_group)
      except Exception:  # pylint: disable=broad-except
        pass
      self._placement_group = None
    self._session.close()
    self._session = None

  # --- Actors ----------------------------------------------------------------

  def _reference_spec(self):
    """`weight_spec` of the network an actor builds from this run's config."""
    from impala_tf import networks  # pylint: disable=g-import-not-at-top
    with tf.device('/cpu:0'):
      net = networks.make_network(self.config, self.observation_space,
                                  self.action_space)
    return weight_spec(net.variables)

  def _options(self) -> dict:
    res = dict(self._resources)
    opts = dict(num_cpus=res.pop('CPU', 0.0), num_gpus=res.pop('GPU', 0.0),
                max_restarts=0)
    if 'memory' in res:
      opts['memory'] = res.pop('memory')
    if res:
      opts['resources'] = res
    return opts

  def _placement(self, slot: _Slot) -> dict:
    """Options that put the slot's actor into its bundle of the placement group."""
    if self._placement_group is None:
      return {}
    from ray.util import scheduling_strategies  # pylint: disable=g-import-not-at-top
    return {'scheduling_strategy':
            scheduling_strategies.PlacementGroupSchedulingStrategy(
                placement_group=self._placement_group,
                placement_group_bundle_index=slot.actor_id)}

  def _spawn(self, slot: _Slot):
    rng = self.rngs[slot.actor_id]
    threads = max(1, int(self._resources.get('CPU', 1)))
    slot.handle = self._remote_class.options(
        **self._options(), **self._placement(slot)).remote(
        self.config.to_dict(), slot.actor_id, slot.restarts, self.observation_space,
        self.action_space, rng.state.numpy(), rng.algorithm, threads, self.resumes,
        local_versions(), self.first_actor_id)
    self.spawns.append((slot.actor_id, time.monotonic()))
    slot.answered = False
    slot.pending = []
    slot.respawn_at = None
    slot.up_at = None
    slot.ready_ref = slot.handle.ready.remote()
    # Its first request goes out from the feeder, once the learner queue has room.

  def _request_where_room(self):
    """Asks every idle actor for an unroll if the learner queue has room.

    As a thread actor waits for room after its put before it acts again, a Ray
    actor is asked to act only when the queue has room, with the weights of then:
    its unroll does not wait, already stale, for the learner (measured policy lag
    in docs/benchmarks.md).
    """
    if self.queue.qsize() >= self.queue.maxsize:
      return
    for slot in self._slots:
      if (slot.handle is not None and len(slot.pending) < REQUESTS_IN_FLIGHT and
          not self.stop_event.is_set()):
        self._request(slot)

  def _request(self, slot: _Slot):
    """Queues one unroll request on the slot's actor, with the latest weights."""
    ray = _ray()
    with self._lock:
      if self._ref_version != self._version:
        # Once per version sent, with the names and shapes they are for.
        self._weights_ref = ray.put((self._spec, self._weights))
        self._ref_version = self._version
        self.num_weight_puts += 1
      version, ref = self._version, self._weights_ref
    chunk_ref, info_ref = slot.handle.unroll.options(num_returns=2).remote(
        version, [ref])
    slot.pending.append((info_ref, chunk_ref, time.monotonic()))

  def _feed(self):
    """The feeder thread: answers in, chunk references to the queue, requests out."""
    ray = _ray()
    try:
      while not self.stop_event.is_set():
        self._respawn_due()
        self._note_ready(ray)
        self._check_hung(ray)
        self._request_where_room()
        owner = {p[0]: s for s in self._slots for p in s.pending}
        full = self.queue.qsize() >= self.queue.maxsize
        # An actor left idle by a full queue is asked as soon as the learner takes
        # a chunk: wait on the queue (or poll answers briefly), not 0.1-0.2 s, which
        # left one actor idle ~90% of the time on CartPole (docs/benchmarks.md).
        idle = full and any(s.handle is not None and not s.pending
                            for s in self._slots)
        ready = []
        if owner:
          ready, _ = ray.wait(list(owner), num_returns=1,
                              timeout=_IDLE_POLL_SECS if idle else 0.2)
        elif full:
          self.queue.wait_for_room(timeout=0.1)
        else:
          self.stop_event.wait(0.1)  # Every actor is waiting to be replaced.
        if not ready:
          self._check_placement(ray)
          continue
        slot = owner[ready[0]]
        info_ref, chunk_ref, _ = slot.pending.pop(0)  # An actor answers in order.
        try:
          info = ray.get(info_ref)
        except ray.exceptions.RayError as e:
          self._replace(slot, e, ray)
          continue
        slot.answered = True
        slot.deaths_in_a_row = 0
        slot.last_answer_at = time.monotonic()
        if not self.queue.put(chunk_ref):
          return  # Stopping: this unroll is neither delivered nor counted.
        self._account(slot, info)
        self._request_where_room()
    except Exception as e:  # pylint: disable=broad-except
      logging.exception('the Ray actor feeder failed')
      self.fail(actor_pool.ActorPoolError(
          f'the Ray actor pool failed: {type(e).__name__}: '
          f'{actor_pool._one_line(e)}'))  # pylint: disable=protected-access

  def _account(self, slot: _Slot, info: dict):
    with self._lock:
      self._steps += int(info['steps'])
    self.rngs[slot.actor_id].reset(info['rng_state'])
    if info['episodes']:
      self.episode_sink([types.EpisodeStats(float(r), int(n))
                         for r, n in info['episodes']])

  def _replace(self, slot: _Slot, error: BaseException, ray):
    """Replaces the slot's dead actor, or stops the run when it cannot."""
    if self.stop_event.is_set():
      return
    cause = root_cause(error)
    if isinstance(getattr(error, 'cause', None), _FATAL_ERRORS):
      self.fail(actor_pool.ActorPoolError(actor_pool._one_line(error.cause)))  # pylint: disable=protected-access
      return
    logging.error('Ray actor %d died (%s).\n%s', slot.actor_id, cause, error)
    try:
      ray.kill(slot.handle, no_restart=True)
    except Exception:  # pylint: disable=broad-except
      pass
    slot.handle = None
    slot.pending = []
    slot.ready_ref = None
    self.deaths.append((slot.actor_id, time.monotonic()))
    limit = self.config.max_actor_restarts
    if self._restarts >= limit:
      self.fail(actor_pool.ActorPoolError(
          f'Ray actor {slot.actor_id} failed ({cause}) and the run already replaced '
          f'{self._restarts} actors, the most --max_actor_restarts={limit} allows; '
          'fix the cause or raise --max_actor_restarts'))
      return
    if not slot.budget.died():
      self.fail(actor_pool.ActorPoolError(
          f'Ray actor {slot.actor_id} died {actor_pool.MAX_RESTARTS} times in '
          f'{actor_pool.RESTART_WINDOW_SECS:.0f} s; last error: {cause}'))
      return
    if not self._placeable(ray):
      self.fail(actor_pool.ActorPoolError(self._unplaceable_message(slot, error)))
      return
    slot.restarts += 1
    with self._lock:
      self._restarts += 1
    slot.deaths_in_a_row += 1
    delay = backoff_secs(slot.deaths_in_a_row)
    slot.respawn_at = time.monotonic() + delay
    logging.error('Replacing Ray actor %d with a fresh env in %g s (restart %d of at '
                  'most --max_actor_restarts=%d).', slot.actor_id, delay,
                  self._restarts, limit)

  def _respawn_due(self):
    now = time.monotonic()
    for slot in self._slots:
      if slot.respawn_at is not None and now >= slot.respawn_at:
        self._spawn(slot)

  def _note_ready(self, ray):
    """Notes when each new actor process is up (its unroll timeout starts then)."""
    refs = {s.ready_ref: s for s in self._slots if s.ready_ref is not None}
    if not refs:
      return
    done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
    for ref in done:
      refs[ref].ready_ref = None
      refs[ref].up_at = time.monotonic()

  def _check_hung(self, ray):
    """Replaces an actor that answered no unroll within actor_unroll_timeout_secs.

    The clock of a request starts when the actor could start on it: when it was
    sent, the actor process was up, and the actor's previous unroll was taken.
    """
    now = time.monotonic()
    if now - self._last_hung_check < _PLACEMENT_CHECK_SECS:
      return
    self._last_hung_check = now
    timeout = self.config.actor_unroll_timeout_secs
    for slot in self._slots:
      if slot.handle is None or not slot.pending or slot.up_at is None:
        continue
      info_ref, _, requested = slot.pending[0]
      if now - max(requested, slot.up_at, slot.last_answer_at) <= timeout:
        continue
      done, _ = ray.wait([info_ref], timeout=0)
      if not done:
        self._replace(slot, ActorHungError(
            f'no unroll within --actor_unroll_timeout_secs={timeout:g}; a hung env '
            'step?'), ray)

  # --- Placement -------------------------------------------------------------

  def _demand(self) -> Dict[str, float]:
    """Ray resource name -> amount one actor reserves (zeros left out)."""
    return {k: v for k, v in self._resources.items() if v > 0}

  def _placeable(self, ray) -> bool:
    """Whether some alive node has, in total, the resources of one actor."""
    need = self._demand()
    for node in ray.nodes():
      have = node.get('Resources', {})
      if node.get('Alive') and all(have.get(k, 0.0) >= v for k, v in need.items()):
        return True
    return False

  def _unplaceable_message(self, slot: _Slot, error: BaseException) -> str:
    return (f'Ray actor {slot.actor_id} died ({type(error).__name__}) and no node '
            f'left in the Ray cluster has its resources --ray_actor_resources='
            f'{self.config.ray_actor_resources}; add such a node or change '
            '--ray_actor_resources')

  def _check_placement(self, ray):
    """Stops the run when a replacement that never answered cannot be placed."""
    now = time.time()
    if now - self._last_placement_check < _PLACEMENT_CHECK_SECS:
      return
    self._last_placement_check = now
    waiting = [s for s in self._slots if s.restarts and not s.answered]
    if waiting and not self._placeable(ray):
      self.fail(actor_pool.ActorPoolError(self._unplaceable_message(
          waiting[0], RuntimeError('node lost'))))

  def _reserve(self, ray):
    """Reserves room for num_actors actors at once: a placement group, one bundle each.

    Waits until the cluster has the resources available (busy clusters free them,
    autoscaling clusters add nodes for the group's demand), saying every
    `_PLACEMENT_LOG_SECS` what it waits for, up to ray_placement_timeout_secs.

    Returns:
      The placement group (None when an actor reserves nothing).

    Raises:
      actor_pool.ActorPoolError: (one line) not placed within the timeout.
    """
    demand = self._demand()
    if not demand:
      return None
    from ray import util as ray_util  # pylint: disable=g-import-not-at-top
    n = self.config.num_actors
    timeout = self.config.ray_placement_timeout_secs
    group = ray_util.placement_group([dict(demand) for _ in range(n)], strategy='PACK')
    ready = group.ready()
    deadline = time.monotonic() + timeout
    need = ', '.join(f'{k}={v * n:g}' for k, v in demand.items())
    what = (f'--num_actors={n} actors with --ray_actor_resources='
            f'{json.dumps(self._resources)} need {need}')

    def have():
      avail, total = ray.available_resources(), ray.cluster_resources()
      return ', '.join(f'{k}={avail.get(k, 0.0):g} of {total.get(k, 0.0):g}'
                       for k in demand)
    while True:
      left = deadline - time.monotonic()
      done, _ = ray.wait([ready], timeout=max(0.0, min(_PLACEMENT_LOG_SECS, left)))
      if done:
        return group
      if self.stop_event.is_set() or time.monotonic() >= deadline:
        ray_util.remove_placement_group(group)
        if self.stop_event.is_set():
          return None  # Stopped while waiting (Ctrl-C): start() starts nothing.
        raise actor_pool.ActorPoolError(
            f'{what}, but the Ray cluster did not have them available within '
            f'--ray_placement_timeout_secs={timeout:g} (available of total: '
            f'{have()}); lower --num_actors or the resources per actor, add nodes, '
            'or raise --ray_placement_timeout_secs')
      logging.info('Waiting for the Ray cluster: %s (available of total: %s); up '
                   'to %.0f s more (--ray_placement_timeout_secs).', what, have(),
                   deadline - time.monotonic())
