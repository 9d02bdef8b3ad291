"""Wires actors -> learner queue -> tf.data -> tower learner, and runs the loop.

`train(config)` is the library's way to train (the CLI calls it too). It owns the
actors (an `actor_pool.ActorPool`: threads, or Ray actor processes, each replaced
with a fresh env when it dies), the tf.data loaders (run by tf.data), and the
learner loop on the calling thread. It
stops at `total_environment_frames`, at `target_return` (100-episode mean, once 100
episodes are done), on `stop_event`, on Ctrl-C / SIGTERM (the caller turns these into
`stop_event` or KeyboardInterrupt), or on an error; in every case it finishes the
current minibatch-reuse ring, stops the actors, writes a final checkpoint and the
SavedModel, and returns or raises with a message that says what to change.

Several learner workers (a `TF_CONFIG` naming more than one worker, read by
`distribute.cluster_from_env`): this process is one worker of a
MultiWorkerMirroredStrategy, created first, before any other TensorFlow op. It
runs its own actors (ids offset by worker index x num_actors, seeds by
`distribute.worker_seed`) and feeds its own replicas its share of the global
--batch_size. The workers decide together when to stop and to checkpoint, and
count frames and episodes over all of them (`agreement.Agreement`). The chief
(worker 0) alone writes the run directory (lock, config.json, metrics.jsonl, TensorBoard, checkpoints,
saved_policy); the others write their checkpoints to a temporary directory
(TensorFlow's protocol) and delete it; every worker restores from the chief's
checkpoints. A collective that fails (a worker died) ends the run with one line.

This module reads no flags.
"""

import dataclasses
import json
import math
import os
import shutil
import threading
import time
from typing import Callable, Dict, Optional, Tuple

from absl import logging
import tensorflow as tf

from impala_tf import actor_pool
from impala_tf import agreement as agreement_lib
from impala_tf import checkpoints
from impala_tf import config as config_lib
from impala_tf import data
from impala_tf import distribute
from impala_tf import environments
from impala_tf import errors
from impala_tf import envpool_env
from impala_tf import learner as learner_lib
from impala_tf import losses
from impala_tf import metrics as metrics_lib
from impala_tf import networks
from impala_tf import periodic_eval
from impala_tf import process_actors
from impala_tf import replay as replay_lib
from impala_tf import rundir
from impala_tf import saved_policy
from impala_tf import watchdog as watchdog_lib


# Errors of a collective's transport: a peer worker that stopped answering.
_TRANSPORT_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)
# Errors that a lost peer raises only with words naming a collective or its
# transport ("Collective ops is aborted by: ... task:1 ..."); without them a
# Cancelled, Aborted or Internal error is this worker's own (an NCCL or XLA fault,
# a cancelled op of its own).
_WORDED_ERRORS = (tf.errors.CancelledError, tf.errors.AbortedError,
                  tf.errors.InternalError)
_PEER_WORDS = ('collective', 'peer', 'remote', 'socket', 'connect', 'unavailable',
               '/job:worker/replica:0/task:')


def is_peer_loss(error: BaseException) -> bool:
  """Whether a learner step's error means another learner worker is gone.

  Unavailable and DeadlineExceeded are how TensorFlow's collectives fail when a
  peer stops answering (a worker killed with SIGKILL: `UnavailableError:
  Collective ops is aborted by: ... /job:worker/task:1 ...`); a Cancelled, Aborted
  or Internal error only when it names a collective or its transport.
  """
  if isinstance(error, _WORDED_ERRORS):
    text = str(error).lower()
    return any(w in text for w in _PEER_WORDS)
  return isinstance(error, _TRANSPORT_ERRORS)


# Seconds a stop request waits for the learner loop to reach the end of its reuse
# ring before the actors and the data pipeline are stopped under it.
STOP_GRACE_SECS = 2.0


class TrainingError(RuntimeError):
  """The run cannot continue; the message says why and what to change."""


class PeerLostError(TrainingError):
  """Another learner worker stopped answering (its launcher names it)."""


def _peer_lost(worker_index: int, error: Exception, when: str,
               then: str) -> PeerLostError:
  """The one line of a collective that failed because a peer stopped answering.

  `when` opens the parenthesis that names the failed collective (e.g. ' ('),
  `then` says what becomes of the run.
  """
  return PeerLostError(
      f'learner worker {worker_index}: another learner worker stopped '
      f'answering{when}a collective failed: {_first_line(error)}); {then}')


@dataclasses.dataclass
class RunResult:
  """What `train` returns: the last metrics line and where things were written."""
  metrics: Dict[str, object]
  logdir: str
  reached_target: bool
  interrupted: bool


def _make_pool(config: config_lib.Config, *args) -> actor_pool.ActorPool:
  """The actor pool of config.actor_backend (Ray is imported only for 'ray')."""
  if config.actor_backend == 'ray':
    from impala_tf import ray_actors  # pylint: disable=g-import-not-at-top
    return ray_actors.RayActorPool(config, *args)
  if config.actor_backend == 'processes':
    return process_actors.ProcessActorPool(config, *args)
  return actor_pool.ThreadActorPool(config, *args)


def _drain(iterator, deadline: float):
  """Reads a stopped pipeline to its end (until `deadline`, time.time()).

  Each loader's generator then returns and tf.data finalizes it at once, on its
  own thread. A generator left suspended is finalized when its iterator is
  destroyed, and on TensorFlow 2.12 that can happen inside a garbage collection
  (the learner's bound step captures the iterator in a reference cycle): the
  collector holds the interpreter lock that the finalizer needs, and the process
  hangs (seen in CI, in a later test of the same process).
  Not for several learner workers: their iterator's `next` is a collective.
  """
  if iterator is None:
    return
  while time.time() < deadline:
    try:
      next(iterator)
    except (StopIteration, tf.errors.OutOfRangeError):
      return


def _first_line(error: BaseException) -> str:
  """`Type: reason` of a TensorFlow error, on one line (`errors.one_line`)."""
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  reason = next((l for l in lines if 'abort' in l.lower() or 'unhealthy' in l.lower()
                 or 'deadline' in l.lower()), lines[0] if lines else '')
  return errors.one_line(f'{type(error).__name__}: {reason}')


def _last_metrics(logdir: str) -> Dict[str, object]:
  """The last line of logdir/metrics.jsonl ({} when there is none)."""
  try:
    with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
      lines = [l for l in f if l.strip()]
    return json.loads(lines[-1]) if lines else {}
  except (OSError, ValueError):
    return {}


def train(config: config_lib.Config,
          stop_event: Optional[threading.Event] = None,
          on_metrics: Optional[Callable[[Dict[str, object]], None]] = None,
          on_stall: Optional[Callable[[str], None]] = None) -> RunResult:
  """Trains until a stop condition; see the module docstring.

  Args:
    config: a validated Config.
    stop_event: optional; set it (from any thread) to stop the run cleanly.
    on_metrics: optional; called with every metrics dict written.
    on_stall: optional; called from the watchdog's thread with one line when no
      learner step is made for `config.stall_timeout_secs` (the main thread may
      be blocked inside TensorFlow); the default prints the line to stderr and
      ends the process with status 1 (`watchdog.Watchdog`).

  Returns:
    RunResult with the final metrics line.

  Raises:
    TrainingError: an actor kept dying (an env raised, hung or returned NaN/Inf)
      or could not be placed, the learner queue timed out,
      `max_nonfinite_updates` updates in a row were non-finite, the logdir cannot
      be written, or its checkpoints do not fit this config or cannot be read. The
      message is one line.
  """
  try:
    cluster, config = distribute.resolve_cluster(config)
  except distribute.ClusterError as e:
    raise TrainingError(str(e)) from None
  except config_lib.ConfigError as e:
    raise TrainingError(f'--{e}') from None
  if cluster is None and config.num_learner_workers > 1:
    raise TrainingError(
        f'--num_learner_workers={config.num_learner_workers} needs a '
        f'{distribute.TF_CONFIG} naming the workers (python -m impala_tf.train '
        'starts them on this host)')
  try:
    # The backend this run uses ('auto' resolved) goes to config.json and the
    # actors (Ray actors on other nodes too): one backend for the whole run.
    config = config.replace(env_backend=envpool_env.check_config(config))
  except config_lib.ConfigError as e:
    raise TrainingError(f'--{e}') from None
  chief = cluster is None or cluster.is_chief
  if chief:
    logging.info('Training %s on %s: %d actor(s) (%s) x %d envs; logdir %s',
                 config.env, config.env_backend, config.num_actors,
                 config.actor_backend, config.num_envs_per_actor, config.logdir)
  lock = rundir.LogdirLock(config.logdir)
  try:
    rundir.check_logdir(config.logdir)
    if chief:
      lock.acquire()  # One run per logdir, held until this call returns.
  except config_lib.ConfigError as e:
    raise TrainingError(f'--{e}') from None
  # Watched from here on: a start that hangs (an env that never builds, a learner
  # worker that never joins, actors that never start) stops the run too.
  dog = _watchdog(config, cluster, on_stall).start()
  try:
    dog.phase('starting: the env spaces, TensorFlow and its devices')
    # The spaces first: the inter-op pool must be sized before TensorFlow starts.
    spaces = environments.env_spaces(config.env, **environments.env_kwargs(config))
    threads = distribute.inter_op_threads(config, spaces[0].shape)
    if distribute.set_inter_op_threads(threads,
                                       explicit=config.tf_inter_op_threads >= 0):
      logging.info('TensorFlow inter-op threads: %d%s', threads,
                   ' (auto: one CPU learner, numpy actors)'
                   if config.tf_inter_op_threads < 0 else '')
    distribute.configure_devices(config.num_virtual_cpu_devices, config.num_gpus)
    if cluster is not None and not os.environ.get(distribute.LAUNCHED_ENV):
      print(distribute.exposure_line([cluster.port]), flush=True)
    if cluster is not None:
      dog.phase(watchdog_lib.WAITING_FOR_WORKERS)
      if not dog.wait_for_all(stop_event or threading.Event()):
        raise TrainingError(
            f'learner worker {cluster.index}: stopped before every learner '
            'worker had started; nothing was trained')
    # A MultiWorkerMirroredStrategy must come before any other TensorFlow op.
    dog.phase('starting: the learner workers\' strategy' if cluster else
              'starting: the strategy')
    strategy = distribute.get_strategy(
        config.num_gpus, config.num_virtual_cpu_devices, cluster)
    run = _Run(config, stop_event or threading.Event(), on_metrics, strategy,
               cluster, spaces, dog)
    try:
      if run.restored and run.base_env_frames >= config.total_environment_frames:
        if chief:
          print(f'impala_tf: {run.restored} already has env_frames='
                f'{run.base_env_frames} >= total_environment_frames='
                f'{config.total_environment_frames}; nothing to train (raise '
                '--total_environment_frames to continue)', flush=True)
          run.save_policy()
        return RunResult(_last_metrics(config.logdir), config.logdir, False, False)
      return run.train()
    finally:
      run.cleanup()
  finally:
    dog.close()  # Whatever failed: no later exit from its thread.
    if chief:
      lock.release()


_DIAGNOSTICS = ('loss', 'policy_loss', 'baseline_loss', 'entropy_loss', 'entropy',
                'rho_mean', 'rho_clip_fraction', 'advantage_mean', 'advantage_std',
                'value_mean', 'log_rho_abs_mean', 'rho_above_1p1_fraction',
                'ppo_clip_fraction')
# Learner outputs logged as they are (from the window's last step), when present.
_TERM_NORMS = ('grad_norm_policy', 'grad_norm_baseline', 'grad_norm_entropy')
_LAST_STEP = _TERM_NORMS + ('popart_mu', 'popart_sigma',
                             'popart_replica_spread')


def _watchdog(config: config_lib.Config, cluster: Optional[distribute.Cluster],
              on_stall: Optional[Callable[[str], None]]) -> watchdog_lib.Watchdog:
  """The run's progress watchdog (not started)."""
  # At least twice the loaders' timeout, so that data that stops is reported as
  # such first.
  stall = config.stall_timeout_secs and max(config.stall_timeout_secs,
                                            2 * config.learner_queue_timeout)
  return watchdog_lib.Watchdog(
      stall, cluster.index if cluster else 0,
      cluster.num_workers if cluster else 1,
      os.path.join(config.logdir, 'heartbeats'), on_stall)


class _Run:
  """One call of `train`: what it built and restored, and its phases as methods."""

  def __init__(self, config: config_lib.Config, stop: threading.Event,
               on_metrics: Optional[Callable[[Dict[str, object]], None]],
               strategy: tf.distribute.Strategy,
               cluster: Optional[distribute.Cluster],
               spaces: Tuple[object, object],
               dog: watchdog_lib.Watchdog):
    self.config = config
    self.stop = stop
    self.on_metrics = on_metrics
    self.cluster = cluster
    self.multi = cluster is not None
    self.worker_index = cluster.index if cluster else 0
    self.num_workers = cluster.num_workers if cluster else 1
    self.chief = self.worker_index == 0
    # This worker's actors: their own seeds (worker 0 keeps the run's).
    self.actor_config = config if self.chief else config.replace(
        seed=distribute.worker_seed(config.seed, self.worker_index))
    self.peer_error: Optional[TrainingError] = None
    self.tmpdir = None
    self.internal_stop = threading.Event()
    self.start_time = time.time()
    self.watchdog = dog  # Started by `train` (it watches the start-up too).
    self.obs_space, self.action_space = spaces
    self.repeat = environments.action_repeat(config.env)
    try:  # Before anything is built or written.
      learning_changes = rundir.check_resume(config, self.obs_space,
                                             self.action_space)
    except rundir.RunDirError as e:
      raise TrainingError(str(e)) from None
    if learning_changes:
      rundir.warn(rundir.learning_warning(learning_changes))
    self.strategy = strategy
    # With W workers each keeps its last ceil(100 / W) episodes: the mean over
    # all workers is over about the last 100.
    self.episode_log = metrics_lib.EpisodeLog(math.ceil(100 / self.num_workers))
    self.agreement = agreement_lib.Agreement(
        strategy, self.worker_index, self.num_workers, self.multi,
        config.minibatch_buffer_size * config.num_sgd_iter, self.episode_log,
        self.repeat, config.total_environment_frames, config.target_return)
    # Before anything is built: a flag that differs is one line.
    self.watchdog.phase(watchdog_lib.AGREEMENT_ON_FLAGS)
    self._check_workers_agree(distribute.config_fingerprint(config),
                              'flag(s) {}: start every worker with the same flags')
    self.learner = learner_lib.Learner(
        config, lambda: networks.make_network(config, self.obs_space,
                                              self.action_space),
        self.strategy, self.repeat)
    self.run_state = checkpoints.RunState()
    # Times this run was resumed; a separate (optional) trackable so checkpoints
    # written before it existed still restore.
    self.resumes = tf.Variable(0, dtype=tf.int64, trainable=False, name='resumes')
    # The actors' sampling RNGs live here so checkpoints include them (the
    # chief's; another worker's start from its own seeds at each resume).
    self.actor_rngs = [
        tf.random.Generator.from_seed(
            actor_pool.actor_rng_seed(self.actor_config, i))
        for i in range(config.num_actors)]
    # The episodes of the training mean: a resumed run's mean goes on over them.
    self.episode_window = checkpoints.EpisodeWindow()
    self.ckpt, self.save_ckpt, self.tmpdir = checkpoints.run_checkpointers(
        config.logdir, config.keep_checkpoints, self.learner, self.run_state,
        self.resumes, self.actor_rngs, self.worker_index, self.episode_window)
    self.watchdog.phase('starting: the network, restoring the checkpoint')
    self.restored = self._restore()
    self.watchdog.restored(int(self.learner.learner_steps.numpy()))
    self.num_resumes = int(self.resumes.numpy())
    self.base_env_frames = int(self.run_state.env_frames.numpy())
    self.base_wall = float(self.run_state.wall_seconds.numpy())
    self.agreement.start_from(self.base_env_frames,
                              int(self.run_state.episodes.numpy()))
    if self.multi:  # Replicas that start apart would drift while they all-reduce.
      self.watchdog.phase(watchdog_lib.AGREEMENT_ON_RESTORE)
      self._check_workers_agree(
          {'learner step': int(self.learner.learner_steps.numpy()),
           'weights': distribute.weights_hash(self.learner.get_weights())},
          '{} after the restore: every worker must restore the same checkpoint '
          "(--logdir one directory all of them share, the chief's)")
    self._learner_reuse = learner_lib.reuse_in_call(config)
    self.pool: Optional[actor_pool.ActorPool] = None
    self.out = None  # The last learner step's output.
    # The per-term gradient norms of the last call that measured them.
    self.term_norms: Dict[str, float] = {}
    self.first_step_secs = self.first_step_unix = None
    self.nonfinite_error: Optional[TrainingError] = None
    self.steps_run = 0  # Learner steps of this call (read by the stop watcher).
    self.evaluator: Optional[periodic_eval.PeriodicEvaluator] = None
    self.source: Optional[data.ChunkSource] = None
    # Set on the other workers when the agreement says one worker's actors or
    # data failed: they stop with a line naming it (its own line says why).
    self.other_failed: Optional[TrainingError] = None

  def _check_workers_agree(self, values: Dict[str, int], what: str):
    """Raises TrainingError (one line) when the workers' `values` differ.

    A peer that stops answering during the comparison is a PeerLostError (one
    line), not the collective's traceback.
    """
    try:
      error = self.agreement.check_same(values, what)
    except _TRANSPORT_ERRORS + _WORDED_ERRORS as e:
      if not is_peer_loss(e):
        raise
      raise _peer_lost(
          self.worker_index, e, ' while the workers compared their start (flags, learner step, '
          'weights; ', 'nothing was trained in this run') from None
    if error:
      raise TrainingError(error)

  def _restore(self) -> Optional[str]:
    """Restores the latest checkpoint (if any) and writes config.json."""
    try:
      restored = self.ckpt.restore_latest()
    except rundir.RunDirError as e:  # Mismatched, unreadable, or none readable.
      raise TrainingError(str(e)) from None
    if restored:
      self.resumes.assign_add(1)
    if self.chief:
      rundir.write_config(self.config)  # After the restore: a mismatch keeps it.
    if restored and self.chief:
      # The chief's own episodes (another worker's are not in the checkpoint; it
      # starts its share of the mean anew).
      self.episode_log.restore(self.episode_window.episodes())
      frames = int(self.run_state.env_frames.numpy())
      steps = int(self.learner.learner_steps.numpy())
      logging.info('Resuming from %s: %d env frames, %d learner steps.', restored,
                   frames, steps)
      print(f'impala_tf: resuming from {restored} (env_frames={frames}, '
            f'learner_steps={steps})', flush=True)
    return restored

  def _dataset(self, source: data.ChunkSource):
    """The distributed dataset of the learner, reading `source`."""
    config = self.config
    state_sizes = [int(s.shape[-1]) for s in self.learner.network.initial_state(1)]
    signature = data.unroll_signature(
        self.obs_space.shape, self.obs_space.dtype, int(self.action_space.n),
        config.unroll_length, state_sizes)
    # This worker's share of the global batch, over its own replicas.
    return data.distribute(self.strategy, lambda: data.build_dataset(
        source, signature, batch_size=config.batch_size // self.num_workers,
        num_loaders=config.num_data_loader_buffers,
        num_sgd_iter=1 if self._learner_reuse > 1 else config.num_sgd_iter,
        minibatch_buffer_size=config.minibatch_buffer_size,
        num_replicas=distribute.local_replicas(self.strategy)))

  def cleanup(self):
    """Deletes this worker's temporary checkpoint directory."""
    if self.tmpdir:
      shutil.rmtree(self.tmpdir, ignore_errors=True)

  def train(self) -> RunResult:
    """Starts the actors, runs the learner loop, and always shuts down cleanly."""
    config = self.config
    self.pool = _make_pool(self.actor_config, self.obs_space, self.action_space,
                           self.episode_log.add, self.actor_rngs, self.internal_stop,
                           self.num_resumes,
                           self.worker_index * config.num_actors)
    replay = None
    if config.replay_proportion > 0:
      replay = replay_lib.ReplayBuffer(
          config.replay_buffer_num_slots, config.replay_proportion,
          seed=self.actor_config.seed + self.num_resumes * 1_000_003)
    def get_chunk():
      chunk = self.pool.get_chunk()
      self.watchdog.alive()  # Data still flows: a call may need many chunks.
      return chunk

    source = self.source = data.ChunkSource(get_chunk, replay)
    dataset = self._dataset(source)
    self.writer = (metrics_lib.MetricsWriter(config.logdir, config.to_dict())
                   if self.chief else None)
    self.window = metrics_lib.LearnerWindow(self.base_env_frames)
    if self.chief and config.eval_interval_frames > 0:
      self.evaluator = periodic_eval.PeriodicEvaluator(
          config, self.obs_space, self.action_space, self.base_env_frames)
    reached_target = interrupted = False
    iterator = None
    loop_done = threading.Event()
    watcher = threading.Thread(target=self._end_data_on_stop, args=(loop_done,),
                               name='stop-watcher', daemon=True)
    watcher.start()
    try:
      self.watchdog.phase('starting the actors')
      self.pool.start(int(self.learner.learner_steps.numpy()),
                      self.learner.get_weights())
      # The first step, its tracing included, then every step.
      self.watchdog.phase(watchdog_lib.LEARNER_STEP)
      self.watchdog.alive()
      iterator = iter(dataset)
      reached_target, interrupted = self._loop(iterator)
    except KeyboardInterrupt:
      interrupted = True
      logging.info('Interrupted: stopping actors and writing a final checkpoint.')
    except actor_pool.ActorPoolError as e:
      self.pool.fail(e)
    except _TRANSPORT_ERRORS + _WORDED_ERRORS as e:
      if not self.multi:
        raise
      if is_peer_loss(e):
        self.peer_error = _peer_lost(
            self.worker_index, e, ' (', 'the run stops; the newest checkpoint in --logdir is '
            'intact: rerun the same command to resume')
      else:  # Its own fault (NCCL, XLA): said even under the launcher.
        self.peer_error = TrainingError(
            f'learner worker {self.worker_index}: {type(e).__name__}: '
            f'{_first_line(e)}; the run stops; the newest checkpoint in --logdir '
            'is intact')
    finally:
      self.watchdog.phase('stopping: the actors, the final checkpoint')
      self.watchdog.alive()  # The shutdown has its own clock.
      loop_done.set()
      self.internal_stop.set()
      # Let the loaders see the stop and return before the iterator is destroyed:
      # its destructor holds the GIL while it waits for them, and they need the GIL.
      deadline = time.time() + 10
      while source.active and time.time() < deadline:
        time.sleep(0.05)
      if not source.active:
        if not self.multi:
          _drain(iterator, deadline)
        del iterator
      # The actors were told to stop (internal_stop). Waiting for the threads (up
      # to actor_pool.STOP_JOIN_SECS for one hung in its env) overlaps the writes;
      # the Ray pool, which kills processes and shuts Ray down, stops first.
      stopper = threading.Thread(target=self.pool.stop, name='pool-stop',
                                 daemon=True)
      stopper.start()
      if not isinstance(self.pool, actor_pool.ThreadActorPool):
        stopper.join()
      if self.evaluator is not None:
        self.evaluator.close()
      final = self._metrics(final=True)
      final['reached_target'] = reached_target
      final['interrupted'] = interrupted
      self._emit(final)
      # Keep the last finite checkpoint; and a resumed run that made no learner
      # step leaves the checkpoint it restored as it was. After a failed
      # collective the state may be one step ahead of a dead worker's: keep the
      # last agreed checkpoint.
      if self.nonfinite_error is None and self.peer_error is None and not (
          self.restored and self.steps_run == 0):
        self._save()
      if self.writer is not None:
        self.writer.close()
    def fatal():
      return [e for e in (self.peer_error, self.nonfinite_error, self.pool.error,
                          source.error, self.other_failed)
              if e is not None]
    try:
      if not fatal():
        self.save_policy()
    finally:
      stopper.join()
    if fatal():
      error = fatal()[0]
      kind = PeerLostError if isinstance(error, PeerLostError) else TrainingError
      message = str(error)
      if self.multi and not message.startswith('learner worker '):
        message = f'learner worker {self.worker_index}: {message}'
      raise kind(message) from error
    return RunResult(final, config.logdir, reached_target, interrupted)

  def _end_data_on_stop(self, loop_done: threading.Event):
    """Ends the data when a stop request is not honoured within STOP_GRACE_SECS.

    The learner loop stops at the end of a reuse ring, which needs data; while the
    actors are stalled (an env hangs, a Ray node is gone) the learner waits in
    TensorFlow for a batch that does not come. Stopping the actors and the queue
    then ends the dataset, so the loop returns at once (`_loop` takes the end of
    data after a stop request as an interruption) instead of after
    --learner_queue_timeout.
    """
    while not self.stop.wait(0.1):
      if loop_done.is_set():
        return
    steps = -1
    while self.steps_run != steps:  # Data still flows: the ring will end.
      steps = self.steps_run
      if loop_done.wait(STOP_GRACE_SECS):
        return
    logging.info('Stop requested; the learner got no data for %g s: stopping the '
                 'actors and the data pipeline.', STOP_GRACE_SECS)
    self.internal_stop.set()

  def _loop(self, iterator) -> Tuple[bool, bool]:
    """Learner steps until a stop condition at the end of a reuse ring.

    Returns:
      (reached_target, interrupted).
    """
    config, learner = self.config, self.learner
    last_log = last_ckpt = time.time()
    steps_run = self.steps_run = 0
    base_learner_steps = int(learner.learner_steps.numpy())
    while True:
      t0 = time.perf_counter()
      # A metrics line follows this call: only such a call measures the per-term
      # gradient norms (two more backward passes), so
      # the line still shows its window's last step's. Workers of a multi-worker
      # run must run the same graph (its collectives): they measure every call.
      log_due = time.time() - last_log >= config.log_interval_secs
      term_norms = None if self.multi else (config.loss_term_grad_norms and (
          log_due or not self.term_norms))  # And the first call: a final line.
      self.watchdog.phase(watchdog_lib.LEARNER_STEP)
      try:
        self.out = learner.step_from_iterator(iterator, self._learner_reuse,
                                              term_norms=term_norms)
      except (StopIteration, tf.errors.OutOfRangeError):
        # A call that found no batch made no step and changed no counter.
        # The data ends when the run is stopping: by request (interrupted), or
        # because the actor pool failed (its error is raised by `train`).
        return False, self.stop.is_set() and not self.pool.error
      weights = self.out.pop('weights')
      made = int(self.out['steps'])  # learner_steps_per_call, or fewer at the end.
      steps_run = self.steps_run = steps_run + made
      version = base_learner_steps + steps_run
      self.watchdog.progress(version)
      interval = config.broadcast_interval
      if version // interval > (version - made) // interval:
        # The weights came back with the step: no second call, no variable reads.
        self.watchdog.phase('publishing the weights to the actors')
        self.pool.publish(version, weights)
      if self.evaluator is not None and self.evaluator.due(self._env_frames()):
        self.watchdog.phase('starting an evaluation')
        self.evaluator.submit(self._env_frames(), weights)
      step_secs = time.perf_counter() - t0
      if self.first_step_secs is None:  # Tracing: not part of the wait split.
        self.first_step_unix = time.time()
        self.first_step_secs = self.first_step_unix - self.start_time
        step_secs = None
      self.window.add(self.out, step_secs)
      self.term_norms.update({k: self.out[k] for k in _TERM_NORMS if k in self.out})
      if float(self.out['nonfinite_streak']) >= config.max_nonfinite_updates:
        self.nonfinite_error = TrainingError(
            f'{config.max_nonfinite_updates} updates in a row had a non-finite loss '
            'or gradient and were skipped (the weights are unchanged since the last '
            'finite one; the last checkpoint is kept); lower --learning_rate (or '
            'bound large rewards with --reward_clipping=abs_one), or raise '
            '--max_nonfinite_updates')
        return False, False

      now = time.time()
      if log_due:
        last_log = now
        self.watchdog.phase('writing metrics')
        self._emit(self._metrics())
      want_checkpoint = now - last_ckpt >= config.checkpoint_interval_secs
      if not self.multi and want_checkpoint:  # Several workers: when they agree.
        last_ckpt = now
        self.watchdog.phase('writing a checkpoint')
        self._save()
      if not self.agreement.due(steps_run):
        continue  # Stop only at the end of a reuse ring.
      if self.multi:
        self.watchdog.phase(watchdog_lib.AGREEMENT)
      decision = self.agreement.decide(
          stop_requested=self.stop.is_set(),
          stopping=self.internal_stop.is_set(),
          pool_failed=self.pool.error is not None,
          data_failed=self.source is not None and self.source.error is not None,
          pool_steps=self.pool.steps,
          want_checkpoint=self.chief and want_checkpoint)
      if decision.failed_workers:
        self.other_failed = PeerLostError(
            f'learner worker {self.worker_index}: learner worker(s) '
            f'{decision.failed_workers} stopped the run: their actors or their '
            'data failed (their own line says why); the newest checkpoint in '
            '--logdir is intact: rerun the same command to resume')
      if decision.checkpoint:
        last_ckpt = now
        self.watchdog.phase('writing a checkpoint')
        self._save()
      if decision.stop is not None:
        return decision.stop

  def _env_frames(self) -> int:
    return self.agreement.env_frames(self.pool.steps)

  def _metrics(self, final: bool = False) -> Dict[str, object]:
    """A metrics line; starts the next window."""
    learner = self.learner
    frames = self._env_frames()
    diag = {k: float(v) for k, v in (self.out or {}).items()}
    summary = losses.summarize_diagnostics(diag) if self.out is not None else {}
    m = {
        'env_frames': frames,
        'trained_frames': int(learner.trained_frames.numpy()),
        'consumed_frames': int(learner.consumed_frames.numpy()),
        'replayed_frames': int(learner.replayed_frames.numpy()),
        'learner_steps': int(learner.learner_steps.numpy()),
        'wall_seconds': self.base_wall + time.time() - self.start_time,
        'learner_queue_size': self.pool.queue.qsize(),
        'learner_queue_capacity': self.pool.queue.maxsize,
        'learning_rate': learner.learning_rate(),
        'grad_norm': diag.get('grad_norm'),
        'actor_restarts': self.pool.restarts,
        'nonfinite_updates': int(learner.nonfinite_updates.numpy()),
        'num_replicas': self.strategy.num_replicas_in_sync,
        'num_learner_workers': self.num_workers,
        'startup_seconds': self.first_step_secs,
        'first_learner_step_unix': self.first_step_unix,
    }
    m.update(self.window.metrics(frames))
    m.update(self.agreement.episode_summary())
    m.update({k: summary[k] for k in _DIAGNOSTICS if k in summary})
    diag = dict(self.term_norms, **diag)
    m.update({k: diag[k] for k in _LAST_STEP if k in diag})
    if self.evaluator is not None:
      m.update(self.evaluator.results())
    if final:
      m['final'] = True
    self.window.reset(frames)
    return m

  def _emit(self, m: Dict[str, object]):
    if self.writer is None:  # Not the chief: the chief writes the sums.
      return
    self.writer.write(m)
    logging.info('%s', metrics_lib.console_line(
        m, self.config.total_environment_frames))
    if self.on_metrics:
      self.on_metrics(m)

  def _save(self):
    self.run_state.env_frames.assign(self._env_frames())
    episodes, window = self.agreement.saved_episodes()
    self.run_state.episodes.assign(episodes)
    self.episode_window.assign(window)
    self.run_state.wall_seconds.assign(self.base_wall + time.time() - self.start_time)
    return self.save_ckpt.save(int(self.learner.learner_steps.numpy()))

  def save_policy(self):
    if not self.chief:
      return
    saved_policy.save_policy(
        self.learner.network,
        os.path.join(self.config.logdir, rundir.SAVED_POLICY_SUBDIR))
