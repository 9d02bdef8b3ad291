"""The learner's input pipeline: learner queue -> tf.data -> per-replica batches.

```
LearnerQueue (bounded; thread actors wait for room, or claim a slot, before each unroll)
  -> num_data_loader_buffers loaders (a tf.numpy_function each) in parallel interleave;
     each fresh chunk passes through the shared ReplayBuffer, which appends its replays
  -> unbatch to single unrolls [T + 1, ...] -> batch(batch_size) [B, T + 1, ...]
  -> minibatch reuse: groups of minibatch_buffer_size batches, each group emitted
     num_sgd_iter times in ring order (b1 b2 .. bS b1 b2 .. bS ...); the next
     group is prefetched while the current one is reused
  -> split every batch into num_replicas consecutive shards of B / N unrolls
  -> strategy.distribute_datasets_from_function: shard i goes to replica i,
     prefetched onto its device.
```

Elements are flat dicts of tensors (the fields of `impala_tf.types.Unroll`, the
recurrent state as `core_state_0`, `core_state_1`, ...) plus `reuse` (int32 `[B]`, 0
on a batch's first use), which lets the learner count each batch's frames once.
"""

import collections
import threading
import time
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

from impala_tf import replay as replay_lib

Arrays = Dict[str, np.ndarray]


class LearnerQueueTimeout(RuntimeError):
  """No unroll reached the learner within learner_queue_timeout."""


class LearnerQueue:
  """Bounded queue of actor chunks with back-pressure and a stall timeout.

  A slot is either holding a chunk or claimed by an actor thread that is
  collecting the chunk for it (`claim_room`): `maxsize` bounds the chunks queued
  and the chunks being collected together, so no chunk ever waits in an actor's
  hands for a slot another actor took first.

  Args:
    maxsize: learner_queue_size, chunks (each num_envs_per_actor unrolls) held or
      claimed; >= 1.
    timeout: learner_queue_timeout, seconds a reader waits before giving up.
    stop_event: set to stop every blocked reader and writer.
  """

  def __init__(self, maxsize: int, timeout: float, stop_event: threading.Event):
    if maxsize < 1:
      raise ValueError(f'learner_queue_size={maxsize}: must be >= 1')
    self._maxsize = maxsize
    self._items = collections.deque()
    self._claims = 0  # Slots claimed by threads collecting a chunk.
    self._holder = threading.local()  # .claimed: this thread holds a claim.
    self._cond = threading.Condition()
    self._timeout = timeout
    self._stop = stop_event
    self.num_put = 0
    self.num_got = 0

  def qsize(self) -> int:
    return len(self._items)

  @property
  def maxsize(self) -> int:
    return self._maxsize

  @property
  def claims(self) -> int:
    """Slots claimed by actor threads still collecting their chunk."""
    return self._claims

  def _has_room(self) -> bool:
    return len(self._items) + self._claims < self._maxsize

  def _holds_claim(self) -> bool:
    return getattr(self._holder, 'claimed', False)

  def _wait_locked(self, ready: Callable[[], bool],
                   timeout: Optional[float] = None) -> bool:
    """Waits (holding the condition) until `ready()`; False if stopped or timed out."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not self._stop.is_set():
      if ready():
        return True
      left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
      if left <= 0:
        return False
      self._cond.wait(timeout=left)
    return False

  def put(self, chunk: Arrays) -> bool:
    """Queues `chunk`. Returns False when stopped instead.

    A thread holding a claim (`claim_room`) puts into its claimed slot at once;
    any other waits while every slot is full or claimed.
    """
    with self._cond:
      if self._holds_claim():
        self._release_locked()
        if self._stop.is_set():
          return False
      elif not self._wait_locked(self._has_room):
        return False
      self._items.append(chunk)
      self.num_put += 1
      self._cond.notify_all()
      return True

  def wait_for_room(self, timeout: Optional[float] = None) -> bool:
    """Blocks while every slot is full or claimed. False when stopped instead.

    With a `timeout` (seconds) it also returns False once that has passed with no
    room. It claims nothing: a later `put` may still wait (the Ray actors' poll).
    """
    with self._cond:
      return self._wait_locked(self._has_room, timeout)

  def claim_room(self) -> bool:
    """Waits for room, then claims a slot for this thread's next chunk.

    An actor that calls this before it starts an unroll acts with the weights of
    when its slot came free, and its `put` never waits: a chunk waits in the
    queue, never in the actor's hands. Where the actors outpace the learner this
    lowers the policy lag (docs/design.md, "The input pipeline"); where they do
    not, there is room and this returns at once. Returns False when stopped. A
    thread that ends holding a claim must `release_claim`.
    """
    with self._cond:
      if self._holds_claim():
        return True
      if not self._wait_locked(self._has_room):
        return False
      self._claims += 1
      self._holder.claimed = True
      return True

  def _release_locked(self):
    self._claims -= 1
    self._holder.claimed = False
    self._cond.notify_all()

  def release_claim(self):
    """Gives back this thread's claim, if it holds one (an actor that ends)."""
    with self._cond:
      if self._holds_claim():
        self._release_locked()

  def put_then_wait_for_room(self, chunk: Arrays, *, claim: bool) -> bool:
    """`put`, then `claim_room` (`claim` True) or only `wait_for_room` (False).

    The thread actors' emit callback; `claim` is --claim_queue_slots, given
    explicitly so that a caller cannot claim slots by omission.
    """
    return self.put(chunk) and (self.claim_room() if claim else self.wait_for_room())

  def get(self) -> Optional[Arrays]:
    """Returns the next chunk, or None when stopped.

    Raises:
      LearnerQueueTimeout: when nothing arrived for `timeout` seconds.
    """
    with self._cond:
      if not self._wait_locked(lambda: bool(self._items), self._timeout):
        if self._stop.is_set():
          return None
        raise LearnerQueueTimeout(
            f'no unroll reached the learner for {self._timeout:g} s '
            '(--learner_queue_timeout): the actors are stalled or too slow; check '
            'the env, or raise --learner_queue_timeout')
      chunk = self._items.popleft()
      self.num_got += 1
      self._cond.notify_all()
      return chunk


def unroll_signature(observation_shape: Sequence[int], observation_dtype,
                     num_actions: int, unroll_length: int,
                     state_sizes: Sequence[int] = ()) -> Dict[str, tf.TensorSpec]:
  """The tf.data signature of a chunk of unrolls `[N, T + 1, ...]` (N unknown)."""
  t1 = unroll_length + 1
  spec = {
      'observation': tf.TensorSpec([None, t1] + list(observation_shape),
                                   tf.as_dtype(observation_dtype)),
      'reward': tf.TensorSpec([None, t1], tf.float32),
      'terminated': tf.TensorSpec([None, t1], tf.bool),
      'truncated': tf.TensorSpec([None, t1], tf.bool),
      'first': tf.TensorSpec([None, t1], tf.bool),
      'prev_action': tf.TensorSpec([None, t1], tf.int32),
      'action': tf.TensorSpec([None, t1], tf.int32),
      'behaviour_logits': tf.TensorSpec([None, t1, num_actions], tf.float32),
      'policy_version': tf.TensorSpec([None], tf.int64),
      'unroll_id': tf.TensorSpec([None], tf.int64),
      'replayed': tf.TensorSpec([None], tf.bool),
  }
  for i, size in enumerate(state_sizes):
    spec[f'core_state_{i}'] = tf.TensorSpec([None, size], tf.float32)
  return spec


class ChunkSource:
  """Reads the learner queue for the loaders and mixes in replay.

  Counts fresh and replayed unrolls it hands to tf.data (`num_fresh`,
  `num_replayed`). Errors (e.g. LearnerQueueTimeout) are kept in `error` for the
  driver, and end the dataset.
  """

  def __init__(self, get_chunk: Callable[[], Optional[Arrays]],
               replay: Optional[replay_lib.ReplayBuffer]):
    self._get = get_chunk
    self._replay = replay
    self._lock = threading.Lock()
    self.num_fresh = 0
    self.num_replayed = 0
    # Generators executing now (not suspended at a yield): the driver waits for 0
    # before destroying the iterator at shutdown.
    self.active = 0
    self.error: Optional[BaseException] = None

  def generator(self, loader_index=0):
    del loader_index  # All loaders read the same queue.
    chunks = self._chunks()
    while True:
      with self._lock:
        self.active += 1
      try:
        chunk = next(chunks, None)
      finally:
        with self._lock:
          self.active -= 1
      if chunk is None:
        return
      yield chunk

  def _chunks(self):
    while True:
      try:
        chunk = self._get()
      except Exception as e:  # pylint: disable=broad-except
        self.error = e
        return
      if chunk is None:
        return
      # `is not None`: an empty ReplayBuffer has len() 0, so it is falsy.
      replays = (self._replay.add_and_sample(chunk) if self._replay is not None
                 else None)
      with self._lock:
        self.num_fresh += len(chunk['replayed'])
        self.num_replayed += 0 if replays is None else len(replays['replayed'])
      if replays is not None:
        chunk = {k: np.concatenate([v, replays[k]]) for k, v in chunk.items()}
      yield chunk


def _loader_fn(source: ChunkSource, signature: Dict[str, tf.TensorSpec],
               num_loaders: int) -> Callable[[tf.Tensor], tf.data.Dataset]:
  """`loader(i)`: the dataset of `source.generator(i)`'s chunks, to its end.

  Each element is read by one `tf.numpy_function` call, with a bool that is False
  once the generator has ended (`take_while` then ends the dataset). This is
  `Dataset.from_generator` without its per-element Python checks and its
  finalization on a tf.data thread: 200-350 us less CPU per chunk
  (docs/benchmarks.md).
  """
  keys = list(signature)
  specs = [signature[k] for k in keys]
  dtypes = [s.dtype.as_numpy_dtype for s in specs]
  ended = [np.zeros([0] + s.shape[1:].as_list(), d) for s, d in zip(specs, dtypes)]
  chunks = [source.generator(i) for i in range(num_loaders)]

  def fetch(i):
    chunk = next(chunks[int(i)], None)
    if chunk is None:
      return ended + [np.bool_(False)]
    return [np.asarray(chunk[k], d) for k, d in zip(keys, dtypes)] + [np.bool_(True)]

  def read(i):
    out = tf.numpy_function(fetch, [i], [s.dtype for s in specs] + [tf.bool],
                            stateful=True)
    for tensor, spec in zip(out, specs):
      tensor.set_shape(spec.shape)
    out[-1].set_shape([])
    return dict(zip(keys, out[:-1])), out[-1]

  def loader(i):
    return (tf.data.Dataset.from_tensors(i).repeat().map(read)
            .take_while(lambda chunk, more: more).map(lambda chunk, more: chunk))
  return loader


def build_dataset(source: ChunkSource, signature: Dict[str, tf.TensorSpec], *,
                  batch_size: int, num_loaders: int = 1, num_sgd_iter: int = 1,
                  minibatch_buffer_size: int = 1, num_replicas: int = 1,
                  prefetch: int = 1) -> tf.data.Dataset:
  """The pipeline of the module docstring, up to per-replica shards.

  Args:
    source: yields chunks `[N, T + 1, ...]` matching `signature`.
    signature: from `unroll_signature`.
    batch_size: unrolls per learner batch (all replicas together).
    num_loaders: parallel generator readers (num_data_loader_buffers).
    num_sgd_iter: uses of each batch.
    minibatch_buffer_size: batches in the reuse ring.
    num_replicas: N; batch_size must be divisible by N.
    prefetch: per-replica shards prefetched.

  Returns:
    A dataset of per-replica shards `[batch_size / N, T + 1, ...]`, in replica order
    (element k goes to replica k mod N), plus `reuse` int32 `[batch_size / N]`.
  """
  if batch_size % num_replicas:
    raise ValueError(f'batch_size={batch_size}: must be divisible by the '
                     f'{num_replicas} learner replicas')
  loader = _loader_fn(source, signature, num_loaders)
  if num_loaders == 1:
    ds = loader(tf.constant(0, tf.int64))
  else:
    ds = tf.data.Dataset.range(num_loaders).interleave(
        loader, cycle_length=num_loaders, block_length=1,
        num_parallel_calls=num_loaders, deterministic=False)
  ds = ds.unbatch().batch(batch_size, drop_remainder=True)
  if num_sgd_iter > 1 or minibatch_buffer_size > 1:
    def reuse_group(group):
      def one_use(k):
        g = dict(group)
        g['reuse'] = tf.fill([minibatch_buffer_size, batch_size], tf.cast(k, tf.int32))
        return tf.data.Dataset.from_tensor_slices(g)
      return tf.data.Dataset.range(num_sgd_iter).flat_map(one_use)
    # Load the next group while this one is reused: without this, the batch after
    # each group's last use is fetched (through the Python generator, which competes
    # for the GIL with the actor threads) while the learner waits. It adds at most
    # one group of lag, to data that reuse makes stale anyway.
    ds = ds.batch(minibatch_buffer_size, drop_remainder=True).prefetch(1)
    ds = ds.flat_map(reuse_group)
  else:
    ds = ds.map(lambda b: dict(b, reuse=tf.zeros([batch_size], tf.int32)))
  if num_replicas > 1:
    per = batch_size // num_replicas
    def split(b):
      return tf.data.Dataset.from_tensor_slices(
          {k: tf.reshape(v, [num_replicas, per] + v.shape[1:].as_list())
           for k, v in b.items()})
    ds = ds.flat_map(split)
  options = tf.data.Options()
  # Every buffered batch adds to the policy lag: keep only the explicit prefetch.
  options.experimental_optimization.inject_prefetch = False
  options.autotune.enabled = False
  return ds.prefetch(prefetch * num_replicas).with_options(options)


def distribute(strategy: tf.distribute.Strategy, make_dataset: Callable[[], tf.data.Dataset]):
  """Feeds each replica its shard through `distribute_datasets_from_function`.

  Args:
    strategy: the learner's strategy (N replicas on one worker, or on each of
      several workers).
    make_dataset: returns the dataset of `build_dataset` for this worker's
      replicas. With several workers each worker calls it once, in its own
      process, on its own actors' data (its batch is its share of the global one).

  Returns:
    A distributed dataset whose elements are PerReplica values of shards; with
    one replica on this host's CPU, the dataset itself plus one prefetched
    element (its elements are that replica's shard: there is nothing to split
    or copy, and the distributed iterator's per-element work is a noticeable
    share of a CartPole learner step, docs/benchmarks.md). `strategy.run` and
    `experimental_local_results` take either.
  """
  devices = strategy.extended.worker_devices
  if (strategy.num_replicas_in_sync == 1 and len(devices) == 1 and
      tf.DeviceSpec.from_string(devices[0]).device_type == 'CPU'):
    # One more element buffered, as the distributed iterator's per-device
    # buffer did (2 measured no better; each adds to the policy lag).
    return make_dataset().prefetch(1)

  def dataset_fn(input_context: tf.distribute.InputContext):
    del input_context  # Each worker's dataset reads its own actors.
    return make_dataset()
  return strategy.distribute_datasets_from_function(
      dataset_fn,
      options=tf.distribute.InputOptions(experimental_fetch_to_device=True))
