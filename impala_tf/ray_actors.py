"""Actors as Ray actor processes: the `ray` backend of `impala_tf.actor_pool`.

```
driver process                                      Ray actor process (one per actor)
  publish(version, weights)                           ray_actor.ImpalaActor: vector
    -> ray.put once per version actually sent         env, network copy,
  feeder thread: while the learner queue has  --->    impala_tf.actor.Actor
    room, asks each idle actor for one unroll;      unroll(version, [weights_ref]):
    puts each answer's chunk ObjectRef into the         fetches the weights if the
    bounded LearnerQueue (blocking:              <---   version is new (checked by
    back-pressure), counts steps and episodes           name and shape), returns one
                                                        chunk [B, T + 1, ...] and a
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

At start the pool connects to Ray (`impala_tf.ray_session.RaySession`) and
reserves all actors' resources at once (a placement group, one bundle per
actor), waiting up to `ray_placement_timeout_secs` for them. The actor itself
(`impala_tf.ray_actor`) hides every GPU unless Ray gave it one, and checks that it
runs the driver's impala_tf and TensorFlow versions before it builds its env and
network.

A Ray actor that dies (env error, process killed, node lost) or hangs (no unroll
within `actor_unroll_timeout_secs`) is replaced, after a doubling backoff, by a new
one with fresh env seeds and counted in `restarts`. The run stops with a one-line
error naming the root cause (`ray_actor.root_cause`) after `max_actor_restarts`
replacements, when one actor dies `MAX_RESTARTS` times a minute, when a replacement
no node of the cluster can host (its `--ray_actor_resources` left with a removed
node), or at once on a version or weights mismatch (`ray_actor.FATAL_ERRORS`).
"""

import json
import threading
import time
from typing import Dict, List, Optional, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from impala_tf import actor_pool
from impala_tf import errors
from impala_tf import ray_actor
from impala_tf import ray_session
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
backoff_secs = actor_pool.backoff_secs


class ActorHungError(RuntimeError):
  """A Ray actor answered no unroll within --actor_unroll_timeout_secs."""


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
    self._session: Optional[ray_session.RaySession] = None
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
    self._session = ray_session.RaySession(
        self.config.ray_address,
        connect_timeout=self.config.ray_connect_timeout_secs,
        runtime_env=self.config.ray_runtime_env_dict)
    ray = ray_session.import_ray()
    self._remote_class = ray.remote(ray_actor.ImpalaActor)
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
    ray = ray_session.import_ray()
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
    ray = ray_session.import_ray()
    return {s.actor_id: ray.get(s.handle.pid.remote(), timeout=60)
            for s in self._slots if s.handle is not None}

  def stop(self):
    self.stop_event.set()
    if self._feeder is not None and self._feeder.is_alive():
      self._feeder.join(timeout=30)
    if self._session is None:
      return
    ray = ray_session.import_ray()
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
    """`ray_actor.weight_spec` of the network an actor builds from the config."""
    from impala_tf import networks  # pylint: disable=g-import-not-at-top
    with tf.device('/cpu:0'):
      net = networks.make_network(self.config, self.observation_space,
                                  self.action_space)
    return ray_actor.weight_spec(net.variables)

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
        ray_actor.local_versions(), self.first_actor_id)
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
    ray = ray_session.import_ray()
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
    ray = ray_session.import_ray()
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
          f'{errors.one_line(e)}'))

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
    cause = ray_actor.root_cause(error)
    if isinstance(getattr(error, 'cause', None), ray_actor.FATAL_ERRORS):
      self.fail(actor_pool.ActorPoolError(errors.one_line(error.cause)))
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
