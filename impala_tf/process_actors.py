"""Actors as local processes: unrolls and weights through shared memory.

`ProcessActorPool` (`--actor_backend=processes`) runs each actor in a child process
of its own (started with `spawn`), so acting takes no share of the learner
process's interpreter lock: on a machine with a core to spare for it, the actor
loop runs at its own speed next to the learner. Nothing is pickled per unroll:

* each child owns `learner_queue_size` slots of a shared-memory block, each slot
  one chunk of the run's fixed layout (`chunk_layout`); it writes a finished chunk
  into a slot it holds, then sends the slot's index down a pipe of its own (four
  bytes) and waits for a free slot of its own before it acts again (as a thread
  actor with `--claim_queue_slots` does: its chunks wait in its slots, never in
  its hands, so the next unroll starts with the newest weights);
* the loaders (`get_chunk`) wait on every child's pipe, take an index (round
  robin over the ready children), copy the chunk out and hand that slot back by
  its index (a third pipe per child): a child writes only into a slot it was
  given back, so several loaders copying at once never see a slot overwritten
  under them, whatever order they finish in;
* `publish` writes the weights into a shared block between two increments of a
  sequence number, with a CRC-32 of the weights; a child copies them at an
  unroll boundary when the version changed, again if the parent wrote meanwhile
  or the copy's CRC differs (what `actor.ParameterBroadcast` does for threads).
  The CRC makes a torn copy visible on CPUs that reorder memory accesses (ARM),
  where the sequence number alone does not;
* finished episodes, and a child's error, come back over a second pipe per child.

No lock is shared between processes: a child killed at any point leaves nothing
held that the parent or another child waits for. A child whose parent is gone
(the trainer killed with SIGKILL, by the OOM killer) stops at its next env step
or wait: every wait and the stop flag check the parent's pid, so no child
outlives the trainer by more than an env step, and the blocks are unlinked by
multiprocessing's resource tracker once the last child exits. Before the first
child starts, `start` checks that `/dev/shm` has room for the blocks and says
how much is needed if not (Docker gives containers 64 MB: `--shm-size`).

A child builds its Actor with `actor_pool.make_actor` from the same Config, seeds
and sampling stream as the other backends, so a run's unrolls are the same
whichever backend made them. A child that dies (an env error, a kill) is replaced
with fresh env seeds and counted in `restarts`, as the Ray backend does: after a
backoff that doubles with each death in a row without a finished unroll
(`actor_pool.backoff_secs`: 1, 2, 4, ... 30 s), at most
`--max_actor_restarts` replacements over the run, and the run fails after
`actor_pool.MAX_RESTARTS` deaths in a row without an unroll. The replacement
gets a new block, and chunks the dead child had finished are still read; the
dead child's block is unlinked once they are. `stop()` asks the children to stop,
terminates those that do not within `STOP_JOIN_SECS`, and unlinks every block.
"""

from impala_tf import quiet

# A child imports this module first: as quiet as the run that started it.
quiet.quiet_if_parent_was()

# pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order
import multiprocessing
from multiprocessing import connection as mp_connection
from multiprocessing import shared_memory
import contextlib
import os
import shutil
import signal
import struct
import sys
import threading
import time
import traceback
import types as types_lib
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

from absl import logging
import numpy as np

from impala_tf import actor_pool
from impala_tf import data
from impala_tf import errors
from impala_tf import types

# Seconds `stop` waits for the children to exit before terminating them.
STOP_JOIN_SECS = 5.0
# Seconds a blocked child or loader sleeps between checks of the stop flag.
_POLL_SECS = 0.05
_ALIGN = 64
_SLOT = struct.Struct('<i')
_MAIN_LOCK = threading.Lock()
# Header of the weights block, int64: [version, stop flag, write sequence (odd while
# the parent writes the weights), CRC-32 of the weights, steps of actor 0, ...].
_VERSION, _STOP, _SEQ, _CRC, _STEPS = 0, 1, 2, 3, 4
# Where shared memory lives on Linux; `start` checks its free space.
SHM_DIR = '/dev/shm'
CUDA_VISIBLE_DEVICES = 'CUDA_VISIBLE_DEVICES'

Layout = Tuple[Tuple[str, Tuple[int, ...], str], ...]


def chunk_layout(config, observation_space, action_space) -> Layout:
  """The fields of one chunk: `(key, shape, dtype name)`, as `Actor` emits them.

  Args:
    config: the run's Config (`num_envs_per_actor` B, `unroll_length` T, LSTM).
    observation_space: the single-env observation space.
    action_space: the single-env Discrete action space.

  Returns:
    Tuple of `(key, shape, dtype)`; shapes `[B, T + 1, ...]` or `[B, ...]`.
  """
  b, t1 = config.num_envs_per_actor, config.unroll_length + 1
  a = int(action_space.n)
  fields = [
      ('observation', (b, t1) + tuple(observation_space.shape),
       np.dtype(observation_space.dtype).name),
      ('reward', (b, t1), 'float32'),
      ('terminated', (b, t1), 'bool'),
      ('truncated', (b, t1), 'bool'),
      ('first', (b, t1), 'bool'),
      ('prev_action', (b, t1), 'int32'),
      ('action', (b, t1), 'int32'),
      ('behaviour_logits', (b, t1, a), 'float32'),
  ]
  if config.use_lstm:
    fields += [(f'core_state_{i}', (b, config.lstm_size), 'float32')
               for i in range(2)]
  fields += [('policy_version', (b,), 'int64'), ('unroll_id', (b,), 'int64'),
             ('replayed', (b,), 'bool')]
  return tuple(fields)


def _offsets(fields) -> Tuple[List[int], int]:
  """Byte offsets of `(key, shape, dtype)` fields laid out in order, and the size."""
  offsets, size = [], 0
  for _, shape, dtype in fields:
    offsets.append(size)
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    size += -(-nbytes // _ALIGN) * _ALIGN
  return offsets, max(size, _ALIGN)


def _attach(name: str) -> shared_memory.SharedMemory:
  """Opens the parent's block `name` in a child; the parent unlinks it.

  (Python < 3.13 registers the attached block with the resource tracker again;
  `spawn` children share the parent's tracker, which keeps one entry per name, so
  the parent's unlink clears it.)
  """
  return shared_memory.SharedMemory(name=name)


def _release(shm: shared_memory.SharedMemory, unlink: bool):
  """Closes a block (its numpy views dropped first), and unlinks it if asked."""
  try:
    shm.close()
    if unlink:
      shm.unlink()
  except (BufferError, FileNotFoundError):
    pass


@contextlib.contextmanager
def _child_start():
  """Starts a `spawn` child without the parent's `__main__` and without GPUs.

  `spawn` runs the parent's main script (or `-m` module) again in every child
  before its target, which fails for a script without an `if __name__ ==
  '__main__'` guard and costs every child the script's imports. The child's
  target lives in this module, so it needs nothing of `__main__`.

  A child acts on the CPU (its network's variables are there), yet runs
  TensorFlow: with the GPUs visible, each would open a CUDA context on them and
  TensorFlow's default near-total reservation of their memory. The child's
  environment says `CUDA_VISIBLE_DEVICES=` (set in this process for the moment of
  the start, under a lock).
  """
  with _MAIN_LOCK:
    main = sys.modules.get('__main__')
    sys.modules['__main__'] = types_lib.ModuleType('__main__')
    cuda = os.environ.get(CUDA_VISIBLE_DEVICES)
    os.environ[CUDA_VISIBLE_DEVICES] = ''
    try:
      yield
    finally:
      if main is not None:
        sys.modules['__main__'] = main
      if cuda is None:
        os.environ.pop(CUDA_VISIBLE_DEVICES, None)
      else:
        os.environ[CUDA_VISIBLE_DEVICES] = cuda


def _views(buf, base: int, fields, offsets) -> Dict[str, np.ndarray]:
  return {key: np.ndarray(shape, dtype, buffer=buf, offset=base + off)
          for (key, shape, dtype), off in zip(fields, offsets)}


class _Slots:
  """`num_slots` chunks of one layout in one shared-memory block."""

  def __init__(self, layout: Layout, num_slots: int, name: Optional[str] = None):
    self._offsets, self.slot_bytes = _offsets(layout)
    self._layout = layout
    self.num_slots = num_slots
    if name is None:
      self.shm = shared_memory.SharedMemory(create=True,
                                            size=self.slot_bytes * num_slots)
    else:
      self.shm = _attach(name)
    self.slots = [_views(self.shm.buf, i * self.slot_bytes, layout, self._offsets)
                  for i in range(num_slots)]

  def close(self, unlink: bool = False):
    self.slots = []
    _release(self.shm, unlink)


class _SharedWeights:
  """The policy weights and the header (version, stop flag, steps) in shared memory.

  The parent (one writer) writes the weights between two increments of a sequence
  number and stores their CRC-32; a child copies them when the version changed,
  again until the sequence was even and unchanged across its copy and the copy's
  CRC matches (a seqlock checked by content: no lock a killed child could leave
  held, and no reliance on the CPU keeping the order of the parent's stores). It
  stands in for `actor.ParameterBroadcast` in the child.

  Args:
    shapes: the weights' shapes (float32).
    num_actors: N: one step counter each in the header.
    name: None in the parent (creates the block); the block's name in a child.
    alive: in a child, a callable that is False once the reader must give up
      (the stop flag is set or the parent is gone): `latest` then returns
      `(version, None)` instead of waiting on a writer that will never finish.
  """

  def __init__(self, shapes, num_actors: int, name: Optional[str] = None,
               alive=None):
    self._fields = self._layout(shapes, num_actors)
    offsets, nbytes = _offsets(self._fields)
    self.shm = (shared_memory.SharedMemory(create=True, size=nbytes)
                if name is None else _attach(name))
    views = _views(self.shm.buf, 0, self._fields, offsets)
    self.header = views.pop('header')
    self._weights = [views[f'w{i}'] for i in range(len(shapes))]
    self.shapes = [tuple(s) for s in shapes]
    self.alive = alive or (lambda: True)
    if name is None:
      self.header[:] = 0
      self.header[_VERSION] = -1

  @staticmethod
  def _layout(shapes, num_actors: int):
    return ((('header', (_STEPS + num_actors,), 'int64'),) +
            tuple((f'w{i}', tuple(s), 'float32') for i, s in enumerate(shapes)))

  @classmethod
  def size(cls, shapes, num_actors: int) -> int:
    """Bytes of the block for weights of `shapes` and `num_actors` actors."""
    return _offsets(cls._layout(shapes, num_actors))[1]

  @property
  def version(self) -> int:
    return int(self.header[_VERSION])

  def publish(self, version: int, weights: Sequence[np.ndarray]):
    header = self.header
    header[_SEQ] += 1
    crc = 0
    for dst, src in zip(self._weights, weights):
      src = np.ascontiguousarray(src, dtype=np.float32)
      dst[...] = src
      crc = zlib.crc32(src, crc)
    header[_CRC] = crc
    header[_VERSION] = int(version)
    header[_SEQ] += 1

  def latest(self):
    """`(version, copies of the weights)`; `(version, None)` before the first
    publish or once `alive()` is False."""
    header = self.header
    while True:
      before = int(header[_SEQ])
      if before % 2 == 0:
        version, crc = int(header[_VERSION]), int(header[_CRC])
        if version < 0:
          return version, None
        copies, got = [], 0
        for w in self._weights:
          copies.append(w.copy())
          got = zlib.crc32(copies[-1], got)
        if int(header[_SEQ]) == before and got == crc:
          return version, copies
      if not self.alive():
        return int(header[_VERSION]), None
      time.sleep(0)

  def close(self, unlink: bool = False):
    self.header = None
    self._weights = []
    _release(self.shm, unlink)


class _StopFlag:
  """`threading.Event`'s `is_set` over the shared header (read every env step).

  In a child (`parent_pid` given) it is also set once the parent is gone: a
  child of a killed trainer is re-parented, and `os.getppid` (one system call per
  env step) tells.
  """

  def __init__(self, header, parent_pid: Optional[int] = None):
    self._header = header
    self._parent = parent_pid

  def is_set(self) -> bool:
    return bool(self._header[_STOP]) or (
        self._parent is not None and os.getppid() != self._parent)

  def set(self):
    self._header[_STOP] = 1


def _child_main(spec):
  """A child: builds its Actor, acts, and writes chunks into its slots."""
  # Ctrl-C reaches the whole process group: the parent stops the children (the
  # flag), so that a child does not die first and get replaced during the stop.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  conn = spec['conn']
  weights = slots = None
  try:
    weights = _SharedWeights(spec['weight_shapes'], spec['num_actors'],
                             name=spec['weights_name'])
    slots = _Slots(spec['layout'], spec['num_slots'], name=spec['slots_name'])
    stop = _StopFlag(weights.header, parent_pid=spec['parent_pid'])
    weights.alive = lambda: not stop.is_set()
    free, filled, actor_id = spec['free'], spec['slots_conn'], spec['actor_id']
    pending: List[types.EpisodeStats] = []
    state = {'free': list(range(slots.num_slots)), 'actor': None}

    def wait_for_slot() -> bool:
      """Takes back the slots the loaders freed; True once one is free."""
      while True:
        try:
          while free.poll(0 if state['free'] else _POLL_SECS):
            state['free'].append(_SLOT.unpack(free.recv_bytes())[0])
        except (EOFError, OSError):  # The parent is gone.
          return False
        if stop.is_set():
          return False
        if state['free']:
          return True

    def emit(chunk) -> bool:
      slot = state['free'].pop(0)
      for key, view in slots.slots[slot].items():
        view[...] = chunk[key]
      weights.header[_STEPS + actor_id] = state['actor'].steps
      filled.send_bytes(_SLOT.pack(slot))
      if pending:
        conn.send(('episodes', list(pending)))
        del pending[:]
      return wait_for_slot()

    rng = tf.random.Generator.from_state(spec['rng_state'], spec['rng_alg'])
    if not wait_for_slot():
      return
    actor = actor_pool.make_actor(
        spec['config'], actor_id, spec['restarts'], spec['observation_space'],
        spec['action_space'], weights, emit, pending.extend, stop, rng=rng,
        resumes=spec['resumes'], id_offset=spec['id_offset'])
    state['actor'] = actor
    try:
      actor.run()
    finally:
      weights.header[_STEPS + actor_id] = actor.steps
      actor.close()
      if pending:  # Episodes that ended in the last, unfinished unroll.
        conn.send(('episodes', list(pending)))
  except KeyboardInterrupt:
    pass
  except BaseException as e:  # pylint: disable=broad-except
    try:
      conn.send(('error', type(e).__name__, str(e), traceback.format_exc()))
    except (OSError, ValueError):
      pass
  finally:
    for block in (slots, weights):
      if block is not None:
        block.close()


class _ChildError(RuntimeError):
  """A child's exception, as the child reported it."""

  def __init__(self, type_name: str, message: str):
    super().__init__(message)
    self.type_name = type_name

  def __str__(self):
    return f'{self.type_name}: {super().__str__()}'


class _Child:
  """The parent's record of one actor process (one generation of actor `id`)."""

  def __init__(self, actor_id, generation, process, conn, slots, free, slot_conn):
    self.actor_id = actor_id
    self.generation = generation
    self.process = process
    self.conn = conn  # Episodes and errors.
    self.slots = slots
    # Where the loaders send back the index of a slot they copied (one loader at a
    # time: `free_lock`).
    self.free = free
    self.free_lock = threading.Lock()
    # Indices of the slots it filled; at EOF (the child is gone and everything it
    # sent was read) `drained`.
    self.slot_conn = slot_conn
    self.drained = False
    self.copying = 0  # Loaders copying one of its slots now (under the pool's lock).
    self.error: Optional[BaseException] = None
    self.traceback: Optional[str] = None


class _QueueView:
  """What the driver reads of a learner queue: chunks waiting and the capacity."""

  def __init__(self, maxsize: int, waiting):
    self.maxsize = maxsize
    self._waiting = waiting

  def qsize(self) -> int:
    """Children with a finished chunk waiting (the pipes tell no more)."""
    return self._waiting()


class ProcessActorPool(actor_pool.ActorPool):
  """Actors as child processes; see the module docstring."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._ctx = multiprocessing.get_context('spawn')
    c = self.config
    self._layout = chunk_layout(c, self.observation_space, self.action_space)
    self._num_slots = c.learner_queue_size
    self.queue = _QueueView(c.learner_queue_size * c.num_actors, self._waiting)
    self._next_reader = 0  # Where get_chunk's round of the children starts.
    self._weights: Optional[_SharedWeights] = None
    self._children: Dict[int, _Child] = {}
    self._blocks: Dict[Tuple[int, int], _Child] = {}  # (actor, generation) -> child
    self._restarts = [0] * c.num_actors
    # Deaths of each actor since its last finished chunk, and when a dead
    # actor's replacement is due (the monitor thread starts it then).
    self._in_a_row = [0] * c.num_actors
    self._respawn_at: Dict[int, float] = {}
    self._steps_done = [0] * c.num_actors
    self._read_lock = threading.Lock()
    self._lock = threading.Lock()
    self._monitor: Optional[threading.Thread] = None
    self._stopped = False

  def start(self, version, weights):
    shapes = [w.shape for w in weights]
    # Every child's slots, one more child's (a replacement overlaps the dead
    # child's block until its chunks are read) and the weights.
    check_shm_space((self.config.num_actors + 1) * self._num_slots *
                    _offsets(self._layout)[1] +
                    _SharedWeights.size(shapes, self.config.num_actors))
    self._weights = _SharedWeights(shapes, self.config.num_actors)
    self.publish(version, weights)
    for i in range(self.config.num_actors):
      self._spawn(i)
    self._monitor = threading.Thread(target=self._watch, name='process-actors',
                                     daemon=True)
    self._monitor.start()

  def _spawn(self, actor_id: int):
    generation = self._restarts[actor_id]
    slots = _Slots(self._layout, self._num_slots)
    free_reader, free = self._ctx.Pipe(duplex=False)
    parent_conn, child_conn = self._ctx.Pipe(duplex=False)
    slot_reader, slot_writer = self._ctx.Pipe(duplex=False)
    rng = self.rngs[actor_id]
    spec = {
        'config': self.config, 'actor_id': actor_id, 'generation': generation,
        'restarts': generation, 'resumes': self.resumes,
        'id_offset': self.first_actor_id,
        'observation_space': self.observation_space,
        'action_space': self.action_space,
        'layout': self._layout, 'num_slots': self._num_slots,
        'slots_name': slots.shm.name, 'free': free_reader,
        'slots_conn': slot_writer, 'parent_pid': os.getpid(),
        'weights_name': self._weights.shm.name,
        'weight_shapes': self._weights.shapes,
        'num_actors': self.config.num_actors,
        'rng_state': rng.state.numpy(), 'rng_alg': rng.algorithm,
        'conn': child_conn,
    }
    # The child draws its numpy sampling seed from this state once (Actor's
    # `_reseed`); the same draw here keeps the checkpointed stream where it is.
    rng.uniform_full_int([2], dtype='int64')
    process = self._ctx.Process(target=_child_main, args=(spec,),
                                name=f'impala_tf-actor-{actor_id}', daemon=True)
    with _child_start():
      process.start()
    child_conn.close()  # The child's ends: EOF here once the child is gone.
    slot_writer.close()
    free_reader.close()
    child = _Child(actor_id, generation, process, parent_conn, slots, free,
                   slot_reader)
    with self._lock:
      previous = self._children.get(actor_id)
      self._children[actor_id] = child
      self._blocks[(actor_id, generation)] = child
    if previous is not None:
      self._reclaim(previous)  # If its last chunk was read already.

  def _watch(self):
    """Delivers episodes and errors; replaces children that die."""
    while not self.stop_event.is_set():
      now = time.monotonic()
      for actor_id, due in list(self._respawn_at.items()):
        if now >= due:
          del self._respawn_at[actor_id]
          self._spawn(actor_id)
      with self._lock:  # Not the dead ones waiting for their replacement.
        children = [c for c in self._children.values()
                    if c.actor_id not in self._respawn_at]
      waitables = {}
      for child in children:
        waitables[child.conn] = child
        waitables[child.process.sentinel] = child
      ready = mp_connection.wait(list(waitables), timeout=_POLL_SECS * 4)
      for obj in ready:
        child = waitables[obj]
        if obj is child.conn:
          self._receive(child)
        elif not self.stop_event.is_set():
          self._died(child)
    self._tell_children_to_stop()

  def _tell_children_to_stop(self):
    weights = self._weights
    if weights is not None and weights.header is not None:
      _StopFlag(weights.header).set()

  def _receive(self, child: _Child):
    try:
      while child.conn.poll():
        message = child.conn.recv()
        if message[0] == 'episodes':
          self.episode_sink(message[1])
        elif message[0] == 'error':
          _, type_name, text, child.traceback = message
          child.error = _ChildError(type_name, text)
    except (EOFError, OSError):
      pass

  def _died(self, child: _Child):
    self._receive(child)
    child.process.join(timeout=1.0)
    if (self._children.get(child.actor_id) is not child or
        child.actor_id in self._respawn_at):
      return
    error = child.error or _ChildError(
        'ActorProcessExit', f'the process exited with code {child.process.exitcode}')
    self._steps_done[child.actor_id] += int(
        self._weights.header[_STEPS + child.actor_id])
    self._weights.header[_STEPS + child.actor_id] = 0
    logging.error('actor %d died (%s).',
                  child.actor_id, errors.one_line(error))
    if child.traceback and self.first_time(error):
      logging.error('actor %d: traceback of %s (shown once per distinct error):\n%s',
                    child.actor_id, error.type_name, child.traceback)
    child.conn.close()
    actor_id = child.actor_id
    self._in_a_row[actor_id] += 1
    limit = self.config.max_actor_restarts
    cause = errors.one_line(error)
    if self._in_a_row[actor_id] >= actor_pool.MAX_RESTARTS:
      self.fail(actor_pool.ActorPoolError(
          f'actor {actor_id} died {self._in_a_row[actor_id]} times in a row '
          f'without finishing an unroll; last error: {cause}'))
      return
    if self.restarts >= limit:
      self.fail(actor_pool.ActorPoolError(
          f'actor {actor_id} died ({cause}) and the run already replaced '
          f'{self.restarts} actor processes, the most --max_actor_restarts={limit} '
          'allows; fix the cause or raise --max_actor_restarts'))
      return
    self._restarts[actor_id] += 1
    delay = actor_pool.backoff_secs(self._in_a_row[actor_id])
    logging.error('Replacing actor %d with a fresh env in %g s (restart %d of at '
                  'most --max_actor_restarts=%d).', actor_id, delay, self.restarts,
                  limit)
    self._respawn_at[actor_id] = time.monotonic() + delay

  def publish(self, version, weights):
    self._weights.publish(version, weights)

  def _waiting(self) -> int:
    with self._lock:
      children = [c for c in self._blocks.values() if not c.drained]
    try:
      return sum(1 for c in children if c.slot_conn.poll(0))
    except (OSError, ValueError):
      return 0

  def _next_slot(self):
    """`(child, slot)` of a finished chunk, or None after `_POLL_SECS`."""
    with self._lock:
      children = [c for c in self._blocks.values() if not c.drained]
    if not children:
      time.sleep(_POLL_SECS)  # Between a child's death and its replacement.
      return None
    ready = set(mp_connection.wait([c.slot_conn for c in children],
                                   timeout=_POLL_SECS))
    # Round robin over the ready ones: no child waits behind another's stream.
    self._next_reader += 1
    start = self._next_reader % len(children)
    for child in children[start:] + children[:start]:
      if child.slot_conn not in ready:
        continue
      try:
        slot = _SLOT.unpack(child.slot_conn.recv_bytes())[0]
      except (EOFError, OSError):  # Gone, and all it sent was read.
        child.drained = True
        self._reclaim(child)
        continue
      with self._lock:
        child.copying += 1
      return child, slot
    return None

  def _reclaim(self, child: _Child):
    """Unlinks the block of a dead, drained child once no loader copies from it."""
    with self._lock:
      if (not child.drained or child.copying or self._stopped or
          self._children.get(child.actor_id) is child or
          self._blocks.get((child.actor_id, child.generation)) is not child):
        return
      del self._blocks[(child.actor_id, child.generation)]
    child.slots.close(unlink=True)
    for conn in (child.free, child.slot_conn):
      try:
        conn.close()
      except OSError:
        pass

  def get_chunk(self):
    deadline = time.monotonic() + self.config.learner_queue_timeout
    with self._read_lock:  # One loader at a time reads the pipes.
      while True:
        if self.stop_event.is_set():
          self._tell_children_to_stop()
          return None
        got = self._next_slot()
        if got is not None:
          break
        if time.monotonic() > deadline:
          raise data.LearnerQueueTimeout(
              f'no unroll reached the learner for {self.config.learner_queue_timeout:g}'
              ' s (--learner_queue_timeout): the actors are stalled or too slow; '
              'check the env, or raise --learner_queue_timeout')
    child, slot = got
    self._in_a_row[child.actor_id] = 0  # It finished an unroll.
    try:
      chunk = self._copy_out(child, slot)
      with child.free_lock:
        try:
          child.free.send_bytes(_SLOT.pack(slot))
        except (OSError, ValueError):  # The child is gone (or stopped).
          pass
    finally:
      with self._lock:
        child.copying -= 1
    self._reclaim(child)
    return chunk

  def _copy_out(self, child: _Child, slot: int) -> Dict[str, np.ndarray]:
    """A copy of the chunk in `child`'s `slot` (the slot is not handed back yet)."""
    return {key: view.copy() for key, view in child.slots.slots[slot].items()}

  @property
  def steps(self):
    """Steps of the children that ended, plus what the live ones last reported."""
    weights = self._weights
    live = int(weights.header[_STEPS:].sum()) if weights is not None else 0
    return sum(self._steps_done) + live

  @property
  def restarts(self):
    return sum(self._restarts)

  def stop(self):
    if self._stopped:
      return
    self._stopped = True
    self.stop_event.set()
    self._tell_children_to_stop()
    if self._monitor is not None:
      self._monitor.join(timeout=STOP_JOIN_SECS)
    deadline = time.monotonic() + STOP_JOIN_SECS
    with self._lock:
      children = list(self._blocks.values())
    for child in children:
      child.process.join(timeout=max(0.0, deadline - time.monotonic()))
    for child in children:
      if child.process.is_alive():
        child.process.terminate()
        child.process.join(timeout=1.0)
      if child.process.is_alive():
        child.process.kill()
        child.process.join(timeout=1.0)
    for child in children:
      child.slots.close(unlink=True)
      for conn in (child.conn, child.slot_conn, child.free):
        try:
          conn.close()
        except OSError:
          pass
    if self._weights is not None:  # The children's last counts move into _steps_done.
      self._steps_done = [done + int(live) for done, live in zip(
          self._steps_done, self._weights.header[_STEPS:])]
      weights, self._weights = self._weights, None
      weights.close(unlink=True)


def check_shm_space(nbytes: int, directory: Optional[str] = None):
  """Raises ActorPoolError (one line) when `directory` has less than `nbytes` free.

  Args:
    nbytes: the bytes the run's shared blocks take (chunks and weights), with
      one spare set for a replaced child.
    directory: the shared-memory file system (default `SHM_DIR`); not checked
      where it does not exist (not Linux).
  """
  directory = directory or SHM_DIR
  try:
    free = shutil.disk_usage(directory).free
  except OSError:
    return
  if free < nbytes:
    raise actor_pool.ActorPoolError(
        f'--actor_backend=processes needs {_mib(nbytes)} of shared memory in '
        f'{directory} and {_mib(free)} is free: give the container more (docker '
        '--shm-size), or lower --num_actors, --learner_queue_size, '
        '--num_envs_per_actor or --unroll_length, or use --actor_backend=threads')


def _mib(nbytes: int) -> str:
  return f'{nbytes / 2**20:.1f} MiB'
