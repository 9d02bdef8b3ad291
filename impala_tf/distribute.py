"""Learner devices and workers: (MultiWorker)MirroredStrategy from one factory.

`configure_devices` must run before TensorFlow initialises its devices (before the
first op); `get_strategy` then returns a `tf.distribute.MirroredStrategy` over:

* `num_gpus` GPUs, all-reducing with NCCL;
* else `num_virtual_cpu_devices` logical devices carved out of the CPU (the tower path
  without a GPU: tests and CI use it);
* else the CPU as a single replica (still a MirroredStrategy, so every run takes the
  same code path: replica context, all-reduce, merge_call).

Several learner workers (TensorFlow's convention: the environment variable
`TF_CONFIG` names a cluster of more than one `worker` and this process's task):
`cluster_from_env` parses and checks it (`ClusterError`, one line, before any work),
and `get_strategy(..., cluster=...)` returns a
`tf.distribute.MultiWorkerMirroredStrategy` over the replicas of every worker (each
worker's GPUs, or its CPU). It must be created before any other TensorFlow op of
the process. The tower invariant holds across workers: the step's gradients and
sums are all-reduced once over all replicas, then clipped once and applied once on
every replica. Worker 0 is the chief. `sum_over_workers` makes the small per-step
all-reduce the driver uses to agree on stopping and to sum its counters.

TensorFlow's gRPC server listens on every interface (`[::]:PORT`; it has no
bind-address option): `exposure_line` says so at start (docs/scaling.md).
"""

import dataclasses
import json
import os
import signal
import socket
import threading
import zlib
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import torso_choice

TF_CONFIG = 'TF_CONFIG'
# Set (to 1) in the environment of the workers `impala_tf.launcher` starts: the
# launcher prints the exposure line and the line naming a dead worker for them.
LAUNCHED_ENV = 'IMPALA_TF_LAUNCHED_WORKER'


class ClusterError(ValueError):
  """TF_CONFIG (or a port it names) cannot be used; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The learner workers and this process's place among them.

  Attributes:
    workers: 'host:port' of every worker, in task index order.
    index: this process's task index in `workers`.
  """
  workers: Sequence[str]
  index: int

  @property
  def num_workers(self) -> int:
    return len(self.workers)

  @property
  def is_chief(self) -> bool:
    return self.index == 0

  @property
  def port(self) -> int:
    return int(self.workers[self.index].rsplit(':', 1)[1])

  def tf_config(self, index: Optional[int] = None) -> str:
    """The TF_CONFIG JSON of worker `index` (default: this one)."""
    return json.dumps({'cluster': {'worker': list(self.workers)},
                       'task': {'type': 'worker',
                                'index': self.index if index is None else index}})


def parse_tf_config(text: str) -> Cluster:
  """Parses a TF_CONFIG value into a Cluster.

  Raises:
    ClusterError: naming what is wrong: not JSON, no `cluster.worker` list, a
      worker that is not 'host:port', a `chief`/`ps`/`evaluator` job (name the
      chief as worker 0), a task that is not a worker, an index out of range.
  """
  try:
    spec = json.loads(text)
  except ValueError as e:
    raise ClusterError(f'{TF_CONFIG} is not JSON ({e})') from None
  if not isinstance(spec, dict) or not isinstance(spec.get('cluster'), dict):
    raise ClusterError(f'{TF_CONFIG} must be a JSON object with a "cluster" object, '
                       'e.g. {"cluster": {"worker": ["host0:2222", "host1:2222"]}, '
                       '"task": {"type": "worker", "index": 0}}')
  cluster = spec['cluster']
  others = sorted(k for k in cluster if k != 'worker')
  if others:
    raise ClusterError(f'{TF_CONFIG} cluster has job(s) {", ".join(others)}: impala_tf '
                       'runs only "worker" tasks (worker 0 is the chief)')
  workers = cluster.get('worker')
  if (not isinstance(workers, list) or not workers or
      not all(isinstance(w, str) for w in workers)):
    raise ClusterError(f'{TF_CONFIG} cluster.worker must be a non-empty list of '
                       f'"host:port" strings; got {workers!r}')
  for w in workers:
    host, _, port = w.rpartition(':')
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise ClusterError(f'{TF_CONFIG} worker {w!r} is not "host:port" with a port '
                         'in 1..65535')
  if len(set(workers)) != len(workers):
    raise ClusterError(f'{TF_CONFIG} names a worker address twice: {workers}')
  task = spec.get('task')
  if not isinstance(task, dict) or task.get('type') != 'worker':
    raise ClusterError(f'{TF_CONFIG} task must be {{"type": "worker", "index": I}}; '
                       f'got {task!r}')
  index = task.get('index')
  if not isinstance(index, int) or isinstance(index, bool) or not (
      0 <= index < len(workers)):
    raise ClusterError(f'{TF_CONFIG} task index {index!r} is out of range: the '
                       f'cluster has {len(workers)} worker(s), indices '
                       f'0..{len(workers) - 1}')
  return Cluster(tuple(workers), index)


def cluster_from_env(num_learner_workers: int = 1,
                     environ: Optional[dict] = None) -> Optional[Cluster]:
  """The Cluster this process belongs to, from TF_CONFIG; None for one worker.

  Args:
    num_learner_workers: the --num_learner_workers flag: with a TF_CONFIG it must
      be 1 (take the cluster's size) or the number of workers it names.
    environ: the environment (default os.environ).

  Raises:
    ClusterError: TF_CONFIG cannot be used (see `parse_tf_config`), or names
      another number of workers than num_learner_workers.
  """
  text = (os.environ if environ is None else environ).get(TF_CONFIG, '')
  if not text.strip():
    return None
  cluster = parse_tf_config(text)
  if num_learner_workers not in (1, cluster.num_workers):
    raise ClusterError(f'--num_learner_workers={num_learner_workers} but {TF_CONFIG} '
                       f'names {cluster.num_workers} worker(s); pass 1 or '
                       f'{cluster.num_workers}, or unset {TF_CONFIG}')
  return cluster if cluster.num_workers > 1 else None


def check_port_free(port: int, what: str = 'port') -> None:
  """Raises ClusterError when `port` cannot be bound on all interfaces.

  TensorFlow's server binds `[::]:port` (all interfaces), so that is what is
  tried; a port that another process holds would otherwise fail deep inside the
  strategy, after start-up work.
  """
  errors = []
  for family, address in ((socket.AF_INET6, '::'), (socket.AF_INET, '0.0.0.0')):
    try:
      sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
      continue  # No IPv6 on this host: the IPv4 try decides.
    try:
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      sock.bind((address, port))
      return
    except OSError as e:
      errors.append(e)
    finally:
      sock.close()
  detail = errors[0].strerror if errors else 'no socket family available'
  raise ClusterError(f'{what} {port} cannot be opened ({detail}): another process '
                     'holds it; free it or name another port')


def resolve_cluster(config: config_lib.Config, environ: Optional[dict] = None
                    ) -> Tuple[Optional[Cluster], config_lib.Config]:
  """The cluster this worker joins and `config` as it runs there, checked early.

  Args:
    config: the run's Config.
    environ: the environment (default os.environ).

  Returns:
    (None, `config`) without a multi-worker TF_CONFIG; else (the Cluster,
    `config` with `num_learner_workers` the cluster's size), once this worker's
    port was found free.

  Raises:
    ClusterError: (one line) TF_CONFIG cannot be used (`cluster_from_env`), or
      this worker's port is taken (`check_port_free`).
    config_lib.ConfigError: `config` with the cluster's size is invalid (e.g.
      its batch does not split over the workers); checked before the port.
  """
  cluster = cluster_from_env(config.num_learner_workers, environ)
  if cluster is None:
    return None, config
  config = config.replace(num_learner_workers=cluster.num_workers)
  check_port_free(cluster.port, f'{TF_CONFIG} worker {cluster.index} port')
  return cluster, config


def free_local_ports(count: int) -> List[int]:
  """`count` distinct ports that are free now (the OS picks them)."""
  socks = []
  try:
    for _ in range(count):
      sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sock.bind(('127.0.0.1', 0))
      socks.append(sock)
    return [s.getsockname()[1] for s in socks]
  finally:
    for s in socks:
      s.close()


def exposure_line(ports: Sequence[int]) -> str:
  """The start-up line naming the ports TensorFlow opens on all interfaces."""
  listed = ', '.join(f'[::]:{p}' for p in ports)
  return (f'impala_tf: learner workers open TCP port(s) {listed} on ALL network '
          'interfaces (TensorFlow\'s gRPC server for MultiWorkerMirroredStrategy has '
          'no bind-address option, and runs what a client sends it); only the '
          'workers\' own traffic should reach them: run on a private network or '
          'behind a firewall (docs/scaling.md)')


def worker_seed(seed: int, worker_index: int) -> int:
  """The actors' seed of learner worker `worker_index` (worker 0: `seed`)."""
  return (seed + worker_index * 7_919_993) % (2**31)


def visible_gpus() -> List[str]:
  """Names of the physical GPUs TensorFlow sees (does not initialise devices)."""
  return [d.name for d in tf.config.list_physical_devices('GPU')]


def check_gpus(num_gpus: int):
  """Raises ConfigError naming num_gpus when fewer GPUs are visible."""
  if num_gpus:
    found = len(visible_gpus())
    if found < num_gpus:
      raise config_lib.ConfigError(
          'num_gpus', num_gpus,
          f'only {found} GPU(s) are visible to TensorFlow; use --num_gpus<={found} '
          '(0 trains on the CPU)')


def configure_devices(num_virtual_cpu_devices: int = 0, num_gpus: int = 0):
  """Splits the CPU into logical devices and hides unused GPUs.

  Args:
    num_virtual_cpu_devices: int, logical CPU devices to create (0 or 1: none).
    num_gpus: int, GPUs the learner uses; the others are hidden from TensorFlow.
      Those it uses grow their memory as needed (unless the environment has
      TF_FORCE_GPU_ALLOW_GROWTH=false).

  Once TensorFlow has initialised its devices (an op ran), the GPUs seen can no
  longer change. GPUs that should be hidden but stay visible are only warned about
  (the learner names its devices, so it still trains on the ones asked for, but
  TensorFlow may reserve memory on the others); too few visible is an error.

  Raises:
    RuntimeError: when TensorFlow's devices are already initialised with a different
      layout (configure devices before running any TensorFlow op): fewer GPUs
      visible than `num_gpus`, or another number of CPU devices.
  """
  cpus = tf.config.list_physical_devices('CPU')
  gpus = tf.config.list_physical_devices('GPU')
  if gpus:
    want = gpus[:num_gpus]
    try:
      tf.config.set_visible_devices(want, 'GPU')
      # Memory as the learner needs it, not TensorFlow's default of nearly all of
      # each GPU up front (RLlib's allow_growth): what the run uses shows in
      # nvidia-smi, and a GPU can be shared on purpose. TensorFlow's own
      # TF_FORCE_GPU_ALLOW_GROWTH=false keeps its default.
      if os.environ.get('TF_FORCE_GPU_ALLOW_GROWTH', '').lower() != 'false':
        for gpu in want:
          try:
            tf.config.experimental.set_memory_growth(gpu, True)
          except ValueError as e:  # The caller gave it logical devices.
            logging.warning('%s keeps its memory settings: %s', gpu.name, e)
    except RuntimeError:  # Initialised: the layout it has stays.
      visible = tf.config.get_visible_devices('GPU')
      missing = [d.name for d in want if d not in visible]
      extra = [d.name for d in visible if d not in want]
      initialised = ('TensorFlow initialised its devices before configure_devices '
                     'ran (configure devices before any TensorFlow op runs, e.g. '
                     'in a fresh process)')
      if missing:
        raise RuntimeError(f'num_gpus={num_gpus}: {", ".join(missing)} hidden; '
                           f'{initialised}') from None
      if extra:
        logging.warning('num_gpus=%d: %s stay visible, not hidden; %s', num_gpus,
                        ', '.join(extra), initialised)
  try:
    if num_virtual_cpu_devices > 1:
      tf.config.set_logical_device_configuration(
          cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_virtual_cpu_devices)
  except RuntimeError:
    have = len(tf.config.list_logical_devices('CPU'))
    if num_virtual_cpu_devices > 1 and have != num_virtual_cpu_devices:
      raise RuntimeError(
          f'num_virtual_cpu_devices={num_virtual_cpu_devices}: TensorFlow already '
          f'initialised {have} CPU device(s) in this process; configure devices '
          'before any TensorFlow op runs (e.g. in a fresh process)') from None


def inter_op_threads(config: config_lib.Config,
                     observation_shape: Sequence[int]) -> int:
  """The inter-op pool size `config.tf_inter_op_threads` asks for (0: TF's default).

  -1 (auto) gives 1 where the learner is the process's only TensorFlow work: one
  CPU replica (no GPU, no logical CPU devices, one learner worker) and `threads`
  actors that act with numpy (`numpy_policy.NumpyMLPPolicy`: an 'mlp' torso, or
  'auto' on vector observations, without LSTM, in float32). There the learner's
  ops run one after another on one pool thread instead of handing off between
  threads, which costs the actor thread's core less CPU (more env frames/s and learner frames/s on CartPole,
  docs/benchmarks.md). Actors that act with TensorFlow (conv nets, LSTMs) would
  queue their calls behind the learner's ops on that one thread (slower on Pong
  with the shallow net), so they keep TensorFlow's default, as do GPUs
  (kernel launches), logical CPU towers (replicas run concurrently) and learner
  workers (collectives).

  Args:
    config: the run's Config.
    observation_shape: the single-env observation shape (for `network='auto'`).

  Returns:
    int >= 0, 0 meaning TensorFlow's default.
  """
  if config.tf_inter_op_threads >= 0:
    return config.tf_inter_op_threads
  torso = torso_choice.resolve_torso(config.network, observation_shape)
  numpy_actors = torso_choice.acts_with_numpy(torso, config.use_lstm,
                                              config.compute_dtype)
  one_cpu_replica = (config.num_gpus == 0 and config.num_virtual_cpu_devices <= 1 and
                     config.num_learner_workers == 1)
  return 1 if (numpy_actors and one_cpu_replica and
               config.actor_backend in ('threads', 'processes')) else 0


def set_inter_op_threads(num_threads: int, explicit: bool = True) -> bool:
  """Sets TensorFlow's inter-op thread pool size (before TensorFlow initialises).

  Args:
    num_threads: int >= 0; 0 leaves TensorFlow's default.
    explicit: whether the user asked for this number (else it is an automatic
      choice, dropped silently when it cannot apply).

  Returns:
    True when the pool has (or will have) `num_threads` threads. Once TensorFlow
    has initialised (an op ran in this process, e.g. in library use) the pool can
    no longer change: an explicit request is then warned about.
  """
  if num_threads <= 0:
    return False
  try:
    tf.config.threading.set_inter_op_parallelism_threads(num_threads)
    return True
  except RuntimeError:
    if tf.config.threading.get_inter_op_parallelism_threads() == num_threads:
      return True
    if explicit:
      logging.warning('tf_inter_op_threads=%d not applied: TensorFlow already '
                      'initialised its thread pools in this process (set it before '
                      'any TensorFlow op runs, e.g. in a fresh process)', num_threads)
    return False


def _restore_python_sigterm_handler() -> None:
  """Puts back the Python SIGTERM handler that TensorFlow's coordination service
  replaced.

  Creating a MultiWorkerMirroredStrategy installs a C-level SIGTERM handler (its
  preemption notifier) in place of Python's: a handler the program installed
  (impala_tf.train stops cleanly on SIGTERM) is then never called, and the
  process ignores or dies of SIGTERM (measured, TF 2.21). Re-installing the
  Python handler restores it. Only the main thread can do this.
  """
  if threading.current_thread() is not threading.main_thread():
    return
  handler = signal.getsignal(signal.SIGTERM)
  if handler is not None:
    signal.signal(signal.SIGTERM, handler)


def get_strategy(num_gpus: int = 0, num_virtual_cpu_devices: int = 0,
                 cluster: Optional[Cluster] = None) -> tf.distribute.Strategy:
  """Returns the learner's strategy (see the module docstring).

  Args:
    num_gpus: GPUs of this worker.
    num_virtual_cpu_devices: logical CPU devices (one worker only).
    cluster: from `cluster_from_env`; several workers give a
      MultiWorkerMirroredStrategy (created before any other TensorFlow op).

  A worker whose peer died learns it from the strategy's health check (its
  collectives fail with UnavailableError, ~10-30 s after the death). No collective
  timeout is set: TensorFlow keeps a thread per collective with a timeout until
  that timeout passes (measured: thousands of threads within a minute at ~200
  steps/s, then `std::system_error` aborted the process).
  """
  if cluster is not None and cluster.num_workers > 1:
    os.environ[TF_CONFIG] = cluster.tf_config()
    comm = tf.distribute.experimental.CommunicationOptions(
        implementation=(tf.distribute.experimental.CommunicationImplementation.NCCL
                        if num_gpus else
                        tf.distribute.experimental.CommunicationImplementation.RING))
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=comm)
    _restore_python_sigterm_handler()
    have = strategy.extended.worker_devices
    want = max(num_gpus, 1)
    if len(have) != want:
      raise RuntimeError(f'learner worker {cluster.index} has devices {list(have)}; '
                         f'expected {want} (--num_gpus={num_gpus})')
    return strategy
  if num_gpus:
    devices = [f'/gpu:{i}' for i in range(num_gpus)]
    ops = tf.distribute.NcclAllReduce() if num_gpus > 1 else None
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
  if num_virtual_cpu_devices > 1:
    have = len(tf.config.list_logical_devices('CPU'))
    if have < num_virtual_cpu_devices:
      raise RuntimeError(
          f'num_virtual_cpu_devices={num_virtual_cpu_devices}: only {have} CPU '
          'device(s) exist; call configure_devices() before any TensorFlow op')
    devices = [f'/cpu:{i}' for i in range(num_virtual_cpu_devices)]
    return tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice('/cpu:0'))
  return tf.distribute.MirroredStrategy(['/cpu:0'])


def num_workers(strategy: tf.distribute.Strategy) -> int:
  """Learner workers of `strategy` (1 for a MirroredStrategy)."""
  resolver = getattr(strategy, 'cluster_resolver', None)
  if resolver is None:
    return 1
  spec = resolver.cluster_spec().as_dict()
  return max(1, len(spec.get('worker', ())) + len(spec.get('chief', ())))


def local_replicas(strategy: tf.distribute.Strategy) -> int:
  """Replicas of this worker (all replicas for a MirroredStrategy)."""
  return len(strategy.extended.worker_devices)


def sum_over_workers(strategy: tf.distribute.Strategy
                     ) -> Callable[[Sequence[float]], np.ndarray]:
  """A function that sums a float64 vector over the learner workers.

  Every worker must call it the same number of times (it is a collective
  all-reduce, which costs a round trip between the workers). Each worker's
  vector counts once, whatever its number of replicas.

  Returns:
    `fn(values) -> np.ndarray` float64 `[len(values)]`, the sum over workers.
  """
  replicas = float(local_replicas(strategy))

  def replica_fn(x):
    ctx = tf.distribute.get_replica_context()
    # tf.identity: the all-reduce needs a value placed on the replica's device.
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.identity(x) / replicas)

  @tf.function(autograph=False)
  def reduce(x):
    out = strategy.run(replica_fn, args=(x,))
    return strategy.experimental_local_results(out)[0]

  def fn(values):
    return reduce(tf.constant(values, tf.float64)).numpy()
  return fn


# Config fields that may differ between learner workers: paths (a shared --logdir
# may be mounted at different paths), this machine's threads and timeouts, and what
# only the chief does (logging, checkpoints, evaluation). Every other field must be
# the same on every worker (`workers_disagree_on`).
PER_WORKER_FIELDS = frozenset({
    'logdir', 'envpool_num_threads', 'tf_inter_op_threads', 'env_step_timeout_secs',
    'actor_unroll_timeout_secs', 'learner_queue_timeout', 'stall_timeout_secs',
    'learner_worker_timeout_secs', 'ray_address', 'ray_connect_timeout_secs',
    'ray_placement_timeout_secs', 'max_actor_restarts', 'log_interval_secs',
    'checkpoint_interval_secs', 'keep_checkpoints', 'eval_interval_frames',
    'eval_episodes', 'eval_greedy', 'loss_term_grad_norms'})

_HASH_BITS = 24  # Exact in float64 sums over any number of workers and replicas.


def small_hash(data: bytes) -> int:
  """A 24-bit CRC of `data` (what the workers compare)."""
  return zlib.crc32(data) & ((1 << _HASH_BITS) - 1)


def config_fingerprint(config: config_lib.Config) -> Dict[str, int]:
  """`{'--FIELD': 24-bit hash of its value}` for the fields every worker must share."""
  return {f'--{k}': small_hash(repr(v).encode())
          for k, v in sorted(config.to_dict().items())
          if k not in PER_WORKER_FIELDS}


def weights_hash(weights: Sequence[np.ndarray]) -> int:
  """A 24-bit CRC of the weights' bytes (float32 arrays, in order)."""
  crc = 0
  for w in weights:
    crc = zlib.crc32(np.ascontiguousarray(w), crc)
  return crc & ((1 << _HASH_BITS) - 1)


def workers_disagree_on(sum_fn: Callable[[Sequence[float]], np.ndarray],
                        values: Dict[str, int], num_workers: int) -> List[str]:
  """The names whose value is not the same on every learner worker.

  Two all-reduces (`sum_fn`, from `sum_over_workers`): the sums, then which
  names some worker found to differ from the mean, so every worker returns the
  same list. Every worker must call it at the same point with the same names.

  Args:
    sum_fn: sums a float64 vector over the workers.
    values: name -> integer in [0, 2**31) (hashes, steps).
    num_workers: W.

  Returns:
    The differing names, sorted; [] when all agree.
  """
  names = sorted(values)
  mine = np.array([float(values[n]) for n in names], np.float64)
  total = np.asarray(sum_fn(mine), np.float64)
  differs = (np.abs(mine * num_workers - total) > 0.25).astype(np.float64)
  seen = np.asarray(sum_fn(differs), np.float64)
  return [n for n, d in zip(names, seen) if d > 0]
