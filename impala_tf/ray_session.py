"""The run's connection to Ray, and a local Ray kept on the loopback interface.

`RaySession(address, ...)` connects the run to Ray (the `ray` actor backend,
`impala_tf.ray_actors`, and the Ray-placed learner workers,
`impala_tf.ray_learners`):

* `address=''` starts a local instance that listens on the loopback interface
  only (`loopback_only`; checked after `ray.init` by
  `impala_tf.socket_audit.check_loopback_only`: it fails closed, shutting Ray
  down), starts no dashboard, and is shut down by `close()`;
* `'auto'` or `HOST:PORT` (`ray://HOST:PORT`) joins a running cluster within
  `connect_timeout` seconds, in one line when it cannot, and leaves it running;
  a head on 127.0.0.1 is joined as a loopback node;
* a Ray already initialised in this process (library use, tests) is used as it
  is.

`ray.init` replaces the SIGTERM handler; the session puts the run's own SIGTERM
and SIGINT handlers back. `import_ray()` imports Ray with a one-line error naming
the extra when it is not installed.
"""

import contextlib
import os
import signal
import socket
import threading
import time
from typing import Optional

from impala_tf import actor_pool
from impala_tf import errors
from impala_tf import socket_audit

# Ray reads this at import to choose the node address; '0' makes it the loopback one.
_LOOPBACK_ENV = 'RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER'


def import_ray():
  """Imports ray, with a one-line error when the extra is not installed.

  Returns:
    The `ray` module.

  Raises:
    actor_pool.ActorPoolError: Ray is not installed.
  """
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
    ray = import_ray()
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
      import_ray().shutdown()


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
          f'({errors.one_line(e)}); start one with `ray start --head` or give '
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
        f'{errors.one_line(e)}) {hint}') from None
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
        f'{errors.one_line(e)})') from e


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

  Then checks that it is (`socket_audit.check_loopback_only`): fails closed,
  shutting it down.
  """
  before = socket_audit.socket_inodes(os.getpid())
  with loopback_only():
    ray.init(address='local', num_cpus=num_cpus, include_dashboard=False,
             log_to_driver=True, runtime_env=runtime_env or None)
  try:
    socket_audit.check_loopback_only(os.getpid(), ignore=before)
  except actor_pool.ActorPoolError:
    ray.shutdown()
    raise
