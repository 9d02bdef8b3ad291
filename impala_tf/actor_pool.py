"""The actors of a run behind one small interface: start, read, stop.

The driver sees acting only through an `ActorPool`:

* `start(version, weights)` starts `num_actors` actors acting with those weights;
* `publish(version, weights)` hands newer weights to the actors (they pick them up
  at their next unroll boundary);
* `get_chunk()` is what the tf.data loaders read (through `data.ChunkSource`): the
  next chunk of `num_envs_per_actor` unrolls, dict of arrays `[B, T + 1, ...]`
  (see `impala_tf.actor`), or None once the pool is stopping. It reads a bounded
  `data.LearnerQueue`, so a learner that falls behind blocks the actors;
* `steps` (agent steps whose unrolls were produced, dead actors included),
  `restarts` (actors replaced after dying), `error` (set when the pool cannot keep
  its actors alive; the pool then sets the run's stop event) and the queue's size;
* finished episodes go to the `episode_sink` given at construction;
* `stop()` stops and releases everything (call it after the loaders have returned).

Three backends (`Config.actor_backend`):

* `threads` (`ThreadActorPool`): each actor is a thread of this process, its chunks
  go straight into the learner queue. Cheapest to start; one interpreter (and GIL)
  for acting, loading and learning.
* `processes` (`impala_tf.process_actors.ProcessActorPool`): each actor is a child
  process; unrolls and weights go through shared memory (docs/scaling.md).
* `ray` (`impala_tf.ray_actors.RayActorPool`): each actor is a Ray actor process,
  on this machine or on a Ray cluster. The driver imports it only when asked for,
  so Ray stays an optional dependency.

Either way an actor is built by `make_actor` from the Config (same env seeds, same
network, same sampling), so both backends produce the same unrolls, and a dead actor
is rebuilt with fresh env seeds and counted in `restarts`; one that dies
`MAX_RESTARTS` times within `RESTART_WINDOW_SECS` stops the run.
"""

import abc
import functools
import re
import threading
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from impala_tf import actor as actor_lib
from impala_tf import config as config_lib
from impala_tf import data
from impala_tf import environments
from impala_tf import errors
from impala_tf import networks
from impala_tf import types

# Seconds `ThreadActorPool.stop` waits for all of its actor threads together.
STOP_JOIN_SECS = 5.0

# An actor that dies this many times within RESTART_WINDOW_SECS stops the run.
MAX_RESTARTS = 5
RESTART_WINDOW_SECS = 60.0
# An actor process (Ray or `processes`) that died n times in a row (no unroll in
# between) is replaced after min(RESTART_BACKOFF_MAX_SECS,
# RESTART_BACKOFF_SECS * 2**(n - 1)) seconds.
RESTART_BACKOFF_SECS = 1.0
RESTART_BACKOFF_MAX_SECS = 30.0


def backoff_secs(deaths_in_a_row: int) -> float:
  """Seconds before replacing an actor that died `deaths_in_a_row` (>= 1) times."""
  return min(RESTART_BACKOFF_MAX_SECS,
             RESTART_BACKOFF_SECS * 2.0**(max(1, deaths_in_a_row) - 1))

Arrays = Dict[str, np.ndarray]
EpisodeSink = Callable[[List[types.EpisodeStats]], None]


# The pool's error; defined in the TensorFlow-free `impala_tf.errors`.
ActorPoolError = errors.ActorPoolError


def env_seed(config: config_lib.Config, actor_id: int, restarts: int,
             resumes: int) -> int:
  """Seed of env 0 of an actor's vector env (env `i` gets `seed + i`).

  A deterministic function of the run's seed, the actor, its restarts in this
  process and the run's resume count (checkpointed), so a restarted actor and a
  resumed run draw fresh env seeds: `seed * 1_000_003 + ((resumes * 100_003 +
  restarts) * num_actors + actor_id) * num_envs_per_actor`, modulo 2**31.
  """
  generation = resumes * 100_003 + restarts
  return (config.seed * 1_000_003 + (generation * config.num_actors + actor_id) *
          config.num_envs_per_actor) % (2**31)


def actor_rng_seed(config: config_lib.Config, actor_id: int) -> int:
  """Seed of the checkpointed tf.random.Generator of actor `actor_id`."""
  return config.seed * 1_000_003 + actor_id


def make_actor(config: config_lib.Config, actor_id: int, restarts: int,
               observation_space, action_space,
               broadcast: actor_lib.ParameterBroadcast,
               emit: Optional[Callable[[Arrays], bool]], episode_sink: EpisodeSink,
               stop_event: threading.Event,
               rng: Optional[tf.random.Generator] = None,
               resumes: int = 0, id_offset: int = 0) -> actor_lib.Actor:
  """An Actor with its vector env and network copy, as every backend builds it.

  Args:
    config: the run's Config.
    actor_id: in [0, num_actors).
    restarts: times this actor was rebuilt (a restarted actor gets fresh env seeds).
    observation_space: the single-env observation space (`environments.env_spaces`).
    action_space: the single-env Discrete action space.
    broadcast: where the actor reads its weights from.
    emit: chunk callback of `Actor.run` (None when the chunks are taken from
      `Actor.unrolls`).
    episode_sink: receives finished `types.EpisodeStats`.
    stop_event: stops the actor.
    rng: the actor's sampling Generator (default: seeded from `actor_rng_seed`).
    resumes: times the run was resumed (enters the env seeds).
    id_offset: added to `actor_id` for the Actor's id (its unroll ids and
      messages): the first actor id of this learner worker (worker index times
      num_actors), so no two learner workers' actors share ids. The seeds use
      `actor_id` and the config's seed (per worker: `distribute.worker_seed`).

  Returns:
    The Actor (its env is open; `close()` it).
  """
  seed = env_seed(config, actor_id, restarts, resumes)
  env = environments.make_vector_env(
      config.env, config.num_envs_per_actor, seed,
      vectorization=config.env_vectorization, backend=config.env_backend,
      envpool_num_threads=config.envpool_num_threads,
      **environments.env_kwargs(config))
  try:
    with tf.device('/cpu:0'):
      net = networks.make_network(config, observation_space, action_space)
    if rng is None:
      rng = tf.random.Generator.from_seed(actor_rng_seed(config, actor_id))
    return actor_lib.Actor(actor_id + id_offset, env, net, broadcast, config.unroll_length,
                           emit, episode_sink, seed, stop_event, rng=rng,
                           env_id=config.env,
                           step_timeout=config.env_step_timeout_secs,
                           refresh_every_step=config.actor_refresh == 'step')
  except BaseException:
    env.close()  # Its subprocesses (async envs) would outlive the failed build.
    raise


class RestartBudget:
  """Counts an actor's deaths; says when it died too often to restart it again."""

  def __init__(self, max_deaths: int = MAX_RESTARTS,
               window_secs: float = RESTART_WINDOW_SECS):
    self._max = max_deaths
    self._window = window_secs
    self._deaths: List[float] = []

  def died(self, now: Optional[float] = None) -> bool:
    """Records a death; returns True when the actor may be restarted."""
    now = time.time() if now is None else now
    self._deaths = [d for d in self._deaths if now - d < self._window] + [now]
    return len(self._deaths) < self._max

  def message(self, actor_id: int, error: BaseException) -> str:
    return (f'actor {actor_id} died {len(self._deaths)} times in '
            f'{self._window:.0f} s; last error: {type(error).__name__}: '
            f'{errors.one_line(error)}')


class ActorPool(abc.ABC):
  """The interface of the module docstring.

  Args:
    config: the run's Config.
    observation_space: the single-env observation space.
    action_space: the single-env action space.
    episode_sink: receives finished episodes (from any thread).
    rngs: one checkpointed tf.random.Generator per actor; the pool keeps each one's
      state current so a checkpoint resumes the sampling streams.
    stop_event: the run's stop event: the pool stops when it is set, and sets it
      when it fails (with `error` set first).
    resumes: times the run was resumed (enters the env seeds).
    first_actor_id: id of this pool's actor 0 (`make_actor`'s id_offset): the
      learner worker's index times num_actors.
  """

  def __init__(self, config: config_lib.Config, observation_space, action_space,
               episode_sink: EpisodeSink, rngs: Sequence[tf.random.Generator],
               stop_event: threading.Event, resumes: int = 0,
               first_actor_id: int = 0):
    self.config = config
    self.observation_space = observation_space
    self.action_space = action_space
    self.episode_sink = episode_sink
    self.rngs = list(rngs)
    self.stop_event = stop_event
    self.resumes = resumes
    self.first_actor_id = first_actor_id
    self.error: Optional[BaseException] = None
    self._seen_errors = set()
    self._seen_errors_lock = threading.Lock()
    self.queue = data.LearnerQueue(config.learner_queue_size,
                                   config.learner_queue_timeout, stop_event)

  def first_time(self, error: BaseException) -> bool:
    """Whether no actor of this pool died of this error before (for logging).

    Errors are the same when their type and message are, numbers aside (an env
    step or index differs from one death to the next).
    """
    key = (type(error).__name__, re.sub(r'\d+', 'N', str(error)))
    with self._seen_errors_lock:
      if key in self._seen_errors:
        return False
      self._seen_errors.add(key)
      return True

  def fail(self, error: BaseException):
    """Records the first fatal error and stops the run."""
    if self.error is None:
      self.error = error
    self.stop_event.set()

  @abc.abstractmethod
  def start(self, version: int, weights: Sequence[np.ndarray]):
    """Starts the actors acting with `weights` (policy version `version`)."""

  @abc.abstractmethod
  def publish(self, version: int, weights: Sequence[np.ndarray]):
    """Makes `weights` the latest policy; actors take it at an unroll boundary."""

  @abc.abstractmethod
  def get_chunk(self) -> Optional[Arrays]:
    """The next chunk for the loaders; None once stopping.

    Raises:
      data.LearnerQueueTimeout: nothing arrived for learner_queue_timeout seconds.
    """

  @property
  @abc.abstractmethod
  def steps(self) -> int:
    """Agent steps of all actors so far (summed over envs; dead actors included)."""

  @property
  @abc.abstractmethod
  def restarts(self) -> int:
    """Actors replaced after dying, over the run."""

  @abc.abstractmethod
  def stop(self):
    """Stops the actors and releases what the pool holds. Idempotent."""


class _ActorThread(threading.Thread):
  """Runs an Actor; rebuilds it with fresh env seeds when it dies."""

  def __init__(self, pool: 'ThreadActorPool', actor_id: int):
    super().__init__(name=f'actor-{actor_id}', daemon=True)
    self.actor_id = actor_id
    self._pool = pool
    self.steps_done = 0  # Steps of the actors this thread ran that have ended.
    self.actor: Optional[actor_lib.Actor] = None
    self.restarts = 0
    # Held while an ended actor's steps move into steps_done, so that a reader
    # never counts them twice (or not at all).
    self._steps_lock = threading.Lock()

  @property
  def steps(self) -> int:
    with self._steps_lock:
      return self.steps_done + (self.actor.steps if self.actor else 0)

  def run(self):
    pool, stop = self._pool, self._pool.stop_event
    budget = RestartBudget()
    while not stop.is_set():
      try:
        self.actor = pool.build(self.actor_id, self.restarts)
        # The first unroll too is collected for a slot of its own (the emit
        # callback claims the next one after each put).
        if not pool.config.claim_queue_slots or pool.queue.claim_room():
          self.actor.run()
        return
      except Exception as e:  # pylint: disable=broad-except
        if stop.is_set():
          return
        logging.error('actor %d died (%s); restarting it with a fresh env.',
                      self.actor_id, errors.one_line(f'{type(e).__name__}: {e}'))
        if pool.first_time(e):  # The traceback once per distinct error.
          logging.error('actor %d: traceback of %s (shown once per distinct '
                        'error):\n%s', self.actor_id, type(e).__name__,
                        traceback.format_exc())
        if not budget.died():
          pool.fail(ActorPoolError(budget.message(self.actor_id, e)))
          return
        self.restarts += 1
      finally:
        pool.queue.release_claim()  # A dead actor's slot is free for the others.
        if self.actor is not None:
          with self._steps_lock:
            self.steps_done += self.actor.steps
            self.actor.steps = 0
          self.actor.close()


class ThreadActorPool(ActorPool):
  """Actors as threads of this process; see the module docstring."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._broadcast = actor_lib.ParameterBroadcast()
    self._threads = [_ActorThread(self, i) for i in range(self.config.num_actors)]

  def build(self, actor_id: int, restarts: int) -> actor_lib.Actor:
    """The Actor of thread `actor_id` (also after a restart)."""
    return make_actor(self.config, actor_id, restarts, self.observation_space,
                      self.action_space, self._broadcast,
                      functools.partial(self.queue.put_then_wait_for_room,
                                        claim=self.config.claim_queue_slots),
                      self.episode_sink, self.stop_event, rng=self.rngs[actor_id],
                      resumes=self.resumes, id_offset=self.first_actor_id)

  def start(self, version, weights):
    self.publish(version, weights)
    for t in self._threads:
      t.start()

  def publish(self, version, weights):
    self._broadcast.publish(version, weights)

  def get_chunk(self):
    return self.queue.get()

  @property
  def steps(self):
    return sum(t.steps for t in self._threads)

  @property
  def restarts(self):
    return sum(t.restarts for t in self._threads)

  def stop(self):
    self.stop_event.set()
    deadline = time.monotonic() + STOP_JOIN_SECS
    for t in self._threads:
      t.join(timeout=max(0.0, deadline - time.monotonic()))
    stuck = [t.actor_id for t in self._threads if t.is_alive()]
    if stuck:
      # A thread cannot be killed: one blocked in its env (a hung step of a sync
      # env) is left behind as a daemon thread rather than holding up the stop.
      logging.warning('actor(s) %s did not stop within %g s (an env step that '
                      'never returns?); leaving them behind',
                      ', '.join(map(str, stuck)), STOP_JOIN_SECS)
