"""Wires actors -> learner queue -> tf.data -> tower learner, and runs the loop.

`train(config)` is the library's way to train (the CLI calls it too). It owns every
thread: `num_actors` actor threads (each restarted with a fresh env when it dies),
the tf.data loaders (run by tf.data), and the learner loop on the calling thread. It
stops at `total_environment_frames`, at `target_return` (100-episode mean, once 100
episodes are done), on `stop_event`, on Ctrl-C / SIGTERM (the caller turns these into
`stop_event` or KeyboardInterrupt), or on an error; in every case it finishes the
current minibatch-reuse ring, stops the actors, writes a final checkpoint and the
SavedModel, and returns or raises with a message that says what to change.

This module reads no flags.
"""

import dataclasses
import json
import os
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional

from absl import logging
import numpy as np
import tensorflow as tf

from impala_tf import actor as actor_lib
from impala_tf import checkpoints
from impala_tf import config as config_lib
from impala_tf import data
from impala_tf import distribute
from impala_tf import environments
from impala_tf import learner as learner_lib
from impala_tf import losses
from impala_tf import metrics as metrics_lib
from impala_tf import networks
from impala_tf import replay as replay_lib

# An actor that dies this many times within _RESTART_WINDOW_SECS stops the run.
_MAX_RESTARTS = 5
_RESTART_WINDOW_SECS = 60.0


class TrainingError(RuntimeError):
  """The run cannot continue; the message says why and what to change."""


@dataclasses.dataclass
class RunResult:
  """What `train` returns: the last metrics line and where things were written."""
  metrics: Dict[str, object]
  logdir: str
  reached_target: bool
  interrupted: bool


class _RunState(tf.Module):
  """Run counters that live outside the learner's graph, for checkpoints."""

  def __init__(self):
    super().__init__(name='run_state')
    self.env_frames = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.episodes = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.wall_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)


class _ActorThread(threading.Thread):
  """Runs an Actor; rebuilds its env and restarts it when it dies."""

  def __init__(self, actor_id: int, make_actor: Callable[[int, int], actor_lib.Actor],
               on_fatal: Callable[[BaseException], None],
               stop_event: threading.Event):
    super().__init__(name=f'actor-{actor_id}', daemon=True)
    self.actor_id = actor_id
    self._make_actor = make_actor
    self._on_fatal = on_fatal
    self._stop_event = stop_event
    self.steps_done = 0  # Steps of actors that died, plus the current actor's.
    self.actor: Optional[actor_lib.Actor] = None
    self.restarts = 0

  @property
  def steps(self) -> int:
    return self.steps_done + (self.actor.steps if self.actor else 0)

  def run(self):
    deaths: List[float] = []
    while not self._stop_event.is_set():
      try:
        self.actor = self._make_actor(self.actor_id, self.restarts)
        self.actor.run()
        return
      except Exception as e:  # pylint: disable=broad-except
        if self._stop_event.is_set():
          return
        now = time.time()
        deaths = [d for d in deaths if now - d < _RESTART_WINDOW_SECS] + [now]
        logging.error('actor %d died (%s: %s); restarting it with a fresh env.\n%s',
                      self.actor_id, type(e).__name__, e, traceback.format_exc())
        if len(deaths) >= _MAX_RESTARTS:
          self._on_fatal(TrainingError(
              f'actor {self.actor_id} died {len(deaths)} times in '
              f'{_RESTART_WINDOW_SECS:.0f} s; last error: {type(e).__name__}: {e}'))
          return
        self.restarts += 1
      finally:
        if self.actor is not None:
          self.steps_done += self.actor.steps
          self.actor.steps = 0
          self.actor.close()


def _last_metrics(logdir: str) -> Dict[str, object]:
  """The last line of logdir/metrics.jsonl ({} when there is none)."""
  try:
    with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
      lines = [l for l in f if l.strip()]
    return json.loads(lines[-1]) if lines else {}
  except (OSError, ValueError):
    return {}


def _prepare_logdir(config: config_lib.Config):
  os.makedirs(config.logdir, exist_ok=True)
  with open(os.path.join(config.logdir, 'config.json'), 'w', encoding='utf-8') as f:
    f.write(config.to_json() + '\n')


def train(config: config_lib.Config,
          stop_event: Optional[threading.Event] = None,
          on_metrics: Optional[Callable[[Dict[str, object]], None]] = None
          ) -> RunResult:
  """Trains until a stop condition; see the module docstring.

  Args:
    config: a validated Config.
    stop_event: optional; set it (from any thread) to stop the run cleanly.
    on_metrics: optional; called with every metrics dict written.

  Returns:
    RunResult with the final metrics line.

  Raises:
    TrainingError: an actor kept dying, or the learner queue timed out.
  """
  distribute.configure_devices(config.num_virtual_cpu_devices, config.num_gpus)
  stop = stop_event or threading.Event()
  internal_stop = threading.Event()
  start_time = time.time()

  env_kwargs = checkpoints.env_kwargs(config)
  obs_space, action_space = environments.env_spaces(config.env, **env_kwargs)
  repeat = environments.action_repeat(config.env)
  make_net = lambda: networks.make_network(config, obs_space, action_space)

  strategy = distribute.get_strategy(config.num_gpus, config.num_virtual_cpu_devices)
  learner = learner_lib.Learner(config, make_net, strategy, repeat)
  run_state = _RunState()
  episode_log = metrics_lib.EpisodeLog(100)

  # Actors: networks and RNGs are built here so checkpoints can include the RNGs.
  actor_rngs = [tf.random.Generator.from_seed(config.seed * 1_000_003 + i)
                for i in range(config.num_actors)]
  ckpt = checkpoints.Checkpointer(
      config.logdir, config.keep_checkpoints, network=learner.network,
      optimizer=learner.optimizer, learner_steps=learner.learner_steps,
      consumed_frames=learner.consumed_frames,
      replayed_frames=learner.replayed_frames,
      trained_frames=learner.trained_frames, run_state=run_state,
      optional=[f'actor_rng_{i}' for i in range(config.num_actors)],
      **{f'actor_rng_{i}': g for i, g in enumerate(actor_rngs)})
  try:
    restored = ckpt.restore_latest()
  except checkpoints.CheckpointMismatchError as e:
    raise TrainingError(str(e)) from None
  _prepare_logdir(config)  # After the restore: a mismatch keeps config.json.
  if restored:
    logging.info('Resuming from %s: %d env frames, %d learner steps.', restored,
                 int(run_state.env_frames.numpy()), int(learner.learner_steps.numpy()))
    print(f'impala_tf: resuming from {restored} (env_frames='
          f'{int(run_state.env_frames.numpy())}, learner_steps='
          f'{int(learner.learner_steps.numpy())})', flush=True)
  base_env_frames = int(run_state.env_frames.numpy())
  if restored and base_env_frames >= config.total_environment_frames:
    print(f'impala_tf: {restored} already has env_frames={base_env_frames} >= '
          f'total_environment_frames={config.total_environment_frames}; nothing to '
          'train (raise --total_environment_frames to continue)', flush=True)
    checkpoints.save_policy(learner.network,
                            os.path.join(config.logdir, checkpoints.SAVED_POLICY_SUBDIR))
    return RunResult(_last_metrics(config.logdir), config.logdir, False, False)
  base_episodes = int(run_state.episodes.numpy())
  base_wall = float(run_state.wall_seconds.numpy())
  episode_log.count = base_episodes

  broadcast = actor_lib.ParameterBroadcast()
  broadcast.publish(int(learner.learner_steps.numpy()), learner.get_weights())
  learner_queue = data.LearnerQueue(config.learner_queue_size,
                                    config.learner_queue_timeout, internal_stop)
  replay = None
  if config.replay_proportion > 0:
    replay = replay_lib.ReplayBuffer(config.replay_buffer_num_slots,
                                     config.replay_proportion, seed=config.seed)
  source = data.ChunkSource(learner_queue.get, replay)
  state_sizes = [int(s.shape[-1]) for s in learner.network.initial_state(1)]
  signature = data.unroll_signature(obs_space.shape, obs_space.dtype,
                                    int(action_space.n), config.unroll_length,
                                    state_sizes)
  dist_dataset = data.distribute(strategy, lambda: data.build_dataset(
      source, signature, batch_size=config.batch_size,
      num_loaders=config.num_data_loader_buffers, num_sgd_iter=config.num_sgd_iter,
      minibatch_buffer_size=config.minibatch_buffer_size,
      num_replicas=strategy.num_replicas_in_sync))

  fatal: List[BaseException] = []

  def on_fatal(e):
    fatal.append(e)
    internal_stop.set()

  def make_actor(actor_id: int, restarts: int) -> actor_lib.Actor:
    seed = (config.seed * 1_000_003 + (actor_id + restarts * config.num_actors) *
            config.num_envs_per_actor) % (2**31)
    env = environments.make_vector_env(
        config.env, config.num_envs_per_actor, seed,
        vectorization=config.env_vectorization, **env_kwargs)
    with tf.device('/cpu:0'):
      net = make_net()
    return actor_lib.Actor(
        actor_id, env, net, broadcast, config.unroll_length, learner_queue.put,
        episode_log.add, seed, internal_stop, rng=actor_rngs[actor_id])

  threads = [_ActorThread(i, make_actor, on_fatal, internal_stop)
             for i in range(config.num_actors)]
  for t in threads:
    t.start()

  ring = config.minibatch_buffer_size * config.num_sgd_iter
  log_every = config.log_interval_secs
  last_log = last_ckpt = time.time()
  last_frames, last_log_wall = base_env_frames, last_log
  wait_secs = busy_secs = 0.0
  window_wait = window_busy = 0.0
  lag_sum = lag_max = num_unrolls = 0.0
  reached_target = interrupted = False
  steps_run = 0
  out = None
  writer = metrics_lib.MetricsWriter(config.logdir)
  first_step_secs = None

  def env_frames() -> int:
    return base_env_frames + sum(t.steps for t in threads) * repeat

  def snapshot(final: bool = False) -> Dict[str, object]:
    nonlocal last_frames, last_log_wall, window_wait, window_busy
    nonlocal lag_sum, lag_max, num_unrolls
    now = time.time()
    frames = env_frames()
    diag = {k: float(v) for k, v in (out or {}).items()}
    summary = {}
    if out is not None:
      summary = losses.summarize_diagnostics(diag)
    m = {
        'env_frames': frames,
        'trained_frames': int(learner.trained_frames.numpy()),
        'consumed_frames': int(learner.consumed_frames.numpy()),
        'replayed_frames': int(learner.replayed_frames.numpy()),
        'learner_steps': int(learner.learner_steps.numpy()),
        'episodes': episode_log.count,
        'fps': (frames - last_frames) / max(now - last_log_wall, 1e-9),
        'wall_seconds': base_wall + now - start_time,
        'policy_lag_mean': lag_sum / num_unrolls if num_unrolls else 0.0,
        'policy_lag_max': lag_max,
        'learner_queue_size': learner_queue.qsize(),
        'learner_queue_capacity': learner_queue.maxsize,
        'learner_wait_fraction': (window_wait / (window_wait + window_busy)
                                  if window_wait + window_busy > 0 else 0.0),
        'learning_rate': learner.learning_rate(),
        'grad_norm': diag.get('grad_norm'),
        'actor_restarts': sum(t.restarts for t in threads),
        'num_replicas': strategy.num_replicas_in_sync,
        'startup_seconds': first_step_secs,
    }
    m.update(episode_log.summary())
    for k in ('loss', 'policy_loss', 'baseline_loss', 'entropy_loss', 'entropy',
              'rho_mean', 'rho_clip_fraction', 'advantage_mean', 'advantage_std',
              'value_mean'):
      if k in summary:
        m[k] = summary[k]
    if final:
      m['final'] = True
    last_frames, last_log_wall = frames, now
    window_wait = window_busy = 0.0
    lag_sum = lag_max = num_unrolls = 0.0
    return m

  def emit(m):
    writer.write(m)
    logging.info('%s', metrics_lib.console_line(m))
    if on_metrics:
      on_metrics(m)

  def save():
    run_state.env_frames.assign(env_frames())
    run_state.episodes.assign(episode_log.count)
    run_state.wall_seconds.assign(base_wall + time.time() - start_time)
    return ckpt.save(int(learner.learner_steps.numpy()))

  iterator = iter(dist_dataset)
  try:
    while True:
      t0 = time.perf_counter()
      try:
        out = learner.step_from_iterator(iterator)
      except (StopIteration, tf.errors.OutOfRangeError):
        break
      data_wait = float(out['data_wait_seconds'])
      steps_run += 1
      step_version = int(learner.learner_steps.numpy())
      if step_version % config.broadcast_interval == 0:
        broadcast.publish(step_version, learner.get_weights())
      t2 = time.perf_counter()
      if first_step_secs is None:
        first_step_secs = time.time() - start_time
      else:
        wait_secs += data_wait
        busy_secs += t2 - t0 - data_wait
        window_wait += data_wait
        window_busy += t2 - t0 - data_wait
      lag_sum += float(out['policy_lag_sum'])
      num_unrolls += float(out['num_unrolls'])
      lag_max = max(lag_max, float(out['policy_lag_max']))

      now = time.time()
      at_ring_end = steps_run % ring == 0
      if now - last_log >= log_every:
        last_log = now
        emit(snapshot())
      if now - last_ckpt >= config.checkpoint_interval_secs:
        last_ckpt = now
        save()
      if not at_ring_end:
        continue
      if fatal or stop.is_set() or internal_stop.is_set():
        interrupted = not fatal and stop.is_set()
        break
      if env_frames() >= config.total_environment_frames:
        break
      if config.target_return is not None:
        s = episode_log.summary()
        if (s['episodes_in_mean'] >= episode_log.window and
            s['episode_return_mean'] >= config.target_return):
          reached_target = True
          break
  except KeyboardInterrupt:
    interrupted = True
    logging.info('Interrupted: stopping actors and writing a final checkpoint.')
  finally:
    internal_stop.set()
    for t in threads:
      t.join(timeout=30)
    # Let the loaders see the stop and return before the iterator is destroyed: its
    # destructor holds the GIL while it waits for them, and they need the GIL.
    deadline = time.time() + 10
    while source.active and time.time() < deadline:
      time.sleep(0.05)
    if not source.active:
      del iterator
    if source.error is not None and not fatal:
      fatal.append(source.error)
    final = snapshot(final=True)
    final['reached_target'] = reached_target
    final['interrupted'] = interrupted
    emit(final)
    save()
    writer.close()
  if fatal:
    e = fatal[0]
    raise TrainingError(str(e)) from e
  checkpoints.save_policy(learner.network,
                          os.path.join(config.logdir, checkpoints.SAVED_POLICY_SUBDIR))
  return RunResult(final, config.logdir, reached_target, interrupted)
