"""Tests for impala_tf.data: learner queue, ChunkSource and the tf.data pipeline.

Chunks are synthetic numpy dicts matching `data.unroll_signature` with tiny shapes;
every unroll has a unique `unroll_id` and its observation/action rows hold that id,
so a batch says exactly which unrolls it carries.
"""

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import data
from impala_tf import replay as replay_lib

import helpers

_REPO = str(helpers.REPO)
T, A, OBS = 3, 2, (2,)
SIG = data.unroll_signature(OBS, np.float32, A, T)


def _chunk(ids, version=0):
  ids = np.asarray(ids, np.int64)
  n, t1 = len(ids), T + 1
  return {
      'observation': np.broadcast_to(ids[:, None, None], (n, t1) + OBS).astype(
          np.float32),
      'reward': np.ones((n, t1), np.float32),
      'terminated': np.zeros((n, t1), bool),
      'truncated': np.zeros((n, t1), bool),
      'first': np.zeros((n, t1), bool),
      'prev_action': np.zeros((n, t1), np.int32),
      'action': np.broadcast_to(ids[:, None], (n, t1)).astype(np.int32),
      'behaviour_logits': np.zeros((n, t1, A), np.float32),
      'policy_version': np.full(n, version, np.int64),
      'unroll_id': ids,
      'replayed': np.zeros(n, bool),
  }


def _list_source(chunks, replay=None):
  """A ChunkSource reading `chunks` in order, then None (end of stream)."""
  pending = list(chunks)
  lock = threading.Lock()

  def get():
    with lock:
      return pending.pop(0) if pending else None

  return data.ChunkSource(get, replay)


def _chunks(num_chunks, per_chunk):
  return [_chunk(range(i * per_chunk, (i + 1) * per_chunk))
          for i in range(num_chunks)]


def _elements(ds):
  out = [{k: v.numpy() for k, v in e.items()} for e in ds]
  for e in out:
    # Every unroll's rows still hold its own id (no mixing of fields/unrolls).
    np.testing.assert_array_equal(
        e['observation'][:, :, 0], np.repeat(e['unroll_id'][:, None], T + 1, 1))
    np.testing.assert_array_equal(
        e['action'], np.repeat(e['unroll_id'][:, None], T + 1, 1))
  return out


def test_unroll_signature():
  sig = data.unroll_signature((4, 5), np.uint8, 3, 7, state_sizes=(6, 6))
  assert sig['observation'].shape.as_list() == [None, 8, 4, 5]
  assert sig['observation'].dtype == tf.uint8
  assert sig['behaviour_logits'].shape.as_list() == [None, 8, 3]
  assert sig['action'].dtype == tf.int32 and sig['prev_action'].dtype == tf.int32
  assert sig['unroll_id'].dtype == tf.int64 and sig['policy_version'].dtype == tf.int64
  assert sig['core_state_1'].shape.as_list() == [None, 6]
  assert 'core_state_2' not in sig


def test_no_unroll_lost_or_duplicated_one_loader():
  source = _list_source(_chunks(10, 3))  # 30 unrolls.
  ds = data.build_dataset(source, SIG, batch_size=4)
  els = _elements(ds)
  assert len(els) == 7  # 28 unrolls; the last incomplete batch (2) is dropped.
  for e in els:
    assert e['observation'].shape == (4, T + 1) + OBS
    assert e['observation'].dtype == np.float32
    assert e['behaviour_logits'].shape == (4, T + 1, A)
    assert e['reward'].shape == (4, T + 1)
    np.testing.assert_array_equal(e['reuse'], np.zeros(4, np.int32))
    assert e['reuse'].dtype == np.int32
  ids = np.concatenate([e['unroll_id'] for e in els])
  np.testing.assert_array_equal(ids, np.arange(28))  # One loader keeps order.
  assert source.num_fresh == 30 and source.num_replayed == 0
  assert source.error is None


def test_loader_gives_the_chunks_values_in_the_signatures_dtypes_to_their_end():
  chunks = _chunks(3, 2)
  chunks[1] = dict(chunks[1], reward=chunks[1]['reward'].astype(np.float64))
  source = _list_source(chunks)
  ds = data.build_dataset(source, SIG, batch_size=2)
  for key, spec in SIG.items():  # Static shapes: the batch's, then the signature's.
    assert ds.element_spec[key].dtype == spec.dtype, key
    assert ds.element_spec[key].shape.as_list() == [2] + spec.shape[1:].as_list(), key
  els = _elements(ds)
  assert len(els) == 3  # Every chunk, then the end (no error, no hang).
  for e, chunk in zip(els, chunks):
    for key in SIG:
      np.testing.assert_array_equal(e[key], chunk[key].astype(e[key].dtype))
  assert els[1]['reward'].dtype == np.float32  # float64 from an actor: cast.
  assert source.error is None and source.active == 0


def test_no_unroll_lost_or_duplicated_two_loaders():
  source = _list_source(_chunks(12, 3))  # 36 unrolls = 9 batches of 4.
  ds = data.build_dataset(source, SIG, batch_size=4, num_loaders=2)
  els = _elements(ds)
  ids = np.concatenate([e['unroll_id'] for e in els])
  assert sorted(ids.tolist()) == list(range(36))
  # A chunk's unrolls stay together in arrival order (unbatch keeps them).
  source = _list_source(_chunks(7, 3))  # 21 unrolls: 5 batches, 1 dropped.
  els = _elements(data.build_dataset(source, SIG, batch_size=4, num_loaders=2))
  ids = np.concatenate([e['unroll_id'] for e in els])
  assert len(ids) == 20 and len(set(ids.tolist())) == 20
  assert set(ids.tolist()) <= set(range(21))
  assert source.num_fresh == 21


def test_minibatch_reuse_ring_order():
  # Batches of 2: b0=[0,1] b1=[2,3] b2=[4,5] b3=[6,7]; S=2, K=2.
  source = _list_source(_chunks(4, 2))
  els = _elements(data.build_dataset(source, SIG, batch_size=2, num_sgd_iter=2,
                                     minibatch_buffer_size=2))
  got = [(e['unroll_id'].tolist(), e['reuse'].tolist()) for e in els]
  assert got == [
      ([0, 1], [0, 0]), ([2, 3], [0, 0]), ([0, 1], [1, 1]), ([2, 3], [1, 1]),
      ([4, 5], [0, 0]), ([6, 7], [0, 0]), ([4, 5], [1, 1]), ([6, 7], [1, 1]),
  ]


def test_minibatch_reuse_single_slot_three_iters():
  source = _list_source(_chunks(2, 2))
  els = _elements(data.build_dataset(source, SIG, batch_size=2, num_sgd_iter=3))
  got = [(e['unroll_id'].tolist(), int(e['reuse'][0])) for e in els]
  assert got == [([0, 1], 0), ([0, 1], 1), ([0, 1], 2),
                 ([2, 3], 0), ([2, 3], 1), ([2, 3], 2)]


def test_replay_mix_in_ratio_and_flags():
  replay = replay_lib.ReplayBuffer(num_slots=8, replay_proportion=0.5, seed=0)
  source = _list_source(_chunks(200, 4), replay)  # 800 fresh unrolls.
  batch, s, k = 4, 2, 2
  els = _elements(data.build_dataset(source, SIG, batch_size=batch, num_sgd_iter=k,
                                     minibatch_buffer_size=s))
  assert source.num_fresh == 800
  # Binomial(800, 0.5): sd ~ 14; allow ~5 sd.
  assert abs(source.num_replayed - 400) < 72, source.num_replayed
  first_use = [e for e in els if e['reuse'][0] == 0]
  flags = np.concatenate([e['replayed'] for e in first_use])
  ids = np.concatenate([e['unroll_id'] for e in first_use])
  # Fresh ids appear once (as fresh); replayed ones are ids seen before.
  fresh_ids = ids[~flags]
  assert len(set(fresh_ids.tolist())) == len(fresh_ids)
  assert abs(flags.sum() / (~flags).sum() - 0.5) < 0.09
  # Dropped at the end: less than one ring of batches.
  total = source.num_fresh + source.num_replayed
  assert total - batch * s < len(flags) <= total
  assert len(flags) % (batch * s) == 0
  # Trained-frames identity: every unroll that made it into a full ring is used
  # exactly k times.
  assert sum(len(e['unroll_id']) for e in els) == len(flags) * k
  for e in els:
    assert set(e['reuse'].tolist()) <= set(range(k))
  # A replay follows its chunk of 4 and comes from the window (last 8 fresh) of
  # one of the chunk's positions (ids are arrival order here, one loader).
  newest = -1
  for rid, rep in zip(ids, flags):
    if rep:
      assert newest - 8 - 3 < rid <= newest
    else:
      newest = max(newest, rid)


def test_trained_unrolls_identity_on_ring_boundary():
  # p = 1: each chunk of 2 fresh brings exactly 2 replays (4 unrolls). 6 chunks =
  # 24 unrolls = 3 rings of S=2 batches of 4; each used K=3 times.
  replay = replay_lib.ReplayBuffer(num_slots=3, replay_proportion=1, seed=0)
  source = _list_source(_chunks(6, 2), replay)
  els = _elements(data.build_dataset(source, SIG, batch_size=4, num_sgd_iter=3,
                                     minibatch_buffer_size=2))
  fresh, replayed = source.num_fresh, source.num_replayed
  assert (fresh, replayed) == (12, 12)
  assert sum(len(e['unroll_id']) for e in els) == (fresh + replayed) * 3
  first = [e for e in els if e['reuse'][0] == 0]
  assert sum(int(e['replayed'].sum()) for e in first) == replayed
  assert sum(int((~e['replayed']).sum()) for e in first) == fresh
  # Replays follow their chunk: chunk i's 2 fresh then its 2 replays.
  flags = np.concatenate([e['replayed'] for e in first])
  np.testing.assert_array_equal(flags, np.tile([False, False, True, True], 6))


def test_per_replica_shards_in_order():
  source = _list_source(_chunks(4, 4))  # 16 unrolls, batches of 8.
  els = _elements(data.build_dataset(source, SIG, batch_size=8, num_replicas=2,
                                     num_sgd_iter=2))
  got = [(e['unroll_id'].tolist(), int(e['reuse'][0])) for e in els]
  assert got == [
      ([0, 1, 2, 3], 0), ([4, 5, 6, 7], 0), ([0, 1, 2, 3], 1), ([4, 5, 6, 7], 1),
      ([8, 9, 10, 11], 0), ([12, 13, 14, 15], 0),
      ([8, 9, 10, 11], 1), ([12, 13, 14, 15], 1),
  ]
  for e in els:
    assert e['observation'].shape == (4, T + 1) + OBS
    assert e['reuse'].shape == (4,)


@pytest.mark.parametrize('batch_size, replicas', [(6, 4), (3, 2)])
def test_batch_not_divisible_by_replicas(batch_size, replicas):
  source = _list_source([])
  with pytest.raises(ValueError, match=f'batch_size={batch_size}'):
    data.build_dataset(source, SIG, batch_size=batch_size, num_replicas=replicas)


_DISTRIBUTE_SCRIPT = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, {repo!r})
    import tensorflow as tf
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices('CPU')[0],
        [tf.config.LogicalDeviceConfiguration()] * 2)
    sys.path.insert(0, {tests!r})
    import data_test as dt
    from impala_tf import data

    strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
    source = dt._list_source(dt._chunks(3, 4))  # 12 unrolls, batches of 4.
    dist = data.distribute(strategy, lambda: data.build_dataset(
        source, dt.SIG, batch_size=4, num_replicas=2))
    out = []
    for el in dist:
      ids = strategy.experimental_local_results(el['unroll_id'])
      obs = strategy.experimental_local_results(el['observation'])
      out.append({{'ids': [t.numpy().tolist() for t in ids],
                   'obs0': [t.numpy()[:, 0, 0].tolist() for t in obs],
                   'devices': [t.device for t in ids]}})
    print('RESULT ' + json.dumps(out))
''')


@pytest.mark.e2e
def test_distribute_gives_shard_k_to_replica_k(tmp_path):
  script = tmp_path / 'distribute_check.py'
  script.write_text(_DISTRIBUTE_SCRIPT.format(
      repo=_REPO, tests=os.path.join(_REPO, 'tests')))
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', CUDA_VISIBLE_DEVICES='')
  proc = subprocess.run([sys.executable, str(script)], capture_output=True,
                        text=True, timeout=240, env=env, cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith('RESULT ')][-1]
  out = json.loads(line[len('RESULT '):])
  assert [e['ids'] for e in out] == [
      [[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
  assert [e['obs0'] for e in out] == [
      [[0.0, 1.0], [2.0, 3.0]], [[4.0, 5.0], [6.0, 7.0]], [[8.0, 9.0], [10.0, 11.0]]]
  for e in out:
    assert 'CPU:0' in e['devices'][0] and 'CPU:1' in e['devices'][1], e['devices']


def test_distribute_gives_one_cpu_replica_the_dataset_itself():
  # One replica on the host CPU: nothing to split, so no distributed iterator.
  strategy = tf.distribute.MirroredStrategy(['/cpu:0'])
  source = _list_source(_chunks(2, 4))
  ds = data.distribute(strategy, lambda: data.build_dataset(
      source, SIG, batch_size=4, num_replicas=1))
  assert isinstance(ds, tf.data.Dataset)
  ids = [el['unroll_id'].numpy().tolist() for el in ds]
  assert ids == [[0, 1, 2, 3], [4, 5, 6, 7]]
  # The strategy runs on its elements as on a distributed batch's.
  el = next(iter(data.distribute(strategy, lambda: data.build_dataset(
      _list_source(_chunks(1, 4)), SIG, batch_size=4, num_replicas=1))))
  out = strategy.run(lambda b: tf.reduce_sum(b['unroll_id']), args=(el,))
  assert [int(x) for x in strategy.experimental_local_results(out)] == [6]


def test_learner_queue_put_blocks_when_full_and_stops():
  stop = threading.Event()
  q = data.LearnerQueue(maxsize=1, timeout=5.0, stop_event=stop)
  assert q.maxsize == 1
  assert q.put(_chunk([0])) is True
  result = []
  writer = threading.Thread(target=lambda: result.append(q.put(_chunk([1]))))
  writer.start()
  time.sleep(0.4)
  assert writer.is_alive() and q.qsize() == 1  # Back-pressure: blocked.
  assert q.get()['unroll_id'].tolist() == [0]
  writer.join(timeout=5)
  assert not writer.is_alive() and result == [True]
  assert q.get()['unroll_id'].tolist() == [1]
  assert (q.num_put, q.num_got) == (2, 2)
  # Full again, then stopped: a blocked put returns False promptly.
  assert q.put(_chunk([2]))
  writer = threading.Thread(target=lambda: result.append(q.put(_chunk([3]))))
  writer.start()
  time.sleep(0.3)
  assert writer.is_alive()
  stop.set()
  writer.join(timeout=5)
  assert not writer.is_alive() and result == [True, False]
  assert q.qsize() == 1 and q.num_put == 3
  assert q.put(_chunk([4])) is False
  assert q.get() is None  # Stopped readers get None, not the chunk.


def test_put_then_wait_for_room_returns_only_when_the_chunk_is_taken():
  stop = threading.Event()
  q = data.LearnerQueue(maxsize=1, timeout=5.0, stop_event=stop)
  result, go_on = [], threading.Event()

  def writer():
    result.append(q.put_then_wait_for_room(_chunk([0]), claim=True))
    go_on.wait(timeout=10)
    result.append(q.put(_chunk([1])))  # Into its claimed slot: no wait.
    result.append(q.put_then_wait_for_room(_chunk([2]), claim=True))

  thread = threading.Thread(target=writer)
  thread.start()
  time.sleep(0.4)
  # The chunk is queued, and its writer waits for room before its next unroll.
  assert thread.is_alive() and q.qsize() == 1 and q.num_put == 1 and q.claims == 0
  assert q.get()['unroll_id'].tolist() == [0]
  deadline = time.monotonic() + 5
  while not result and time.monotonic() < deadline:
    time.sleep(0.01)
  # It returned holding the free slot: nobody else may fill it meanwhile.
  assert result == [True] and q.claims == 1 and q.qsize() == 0
  assert q.wait_for_room(timeout=0.2) is False
  go_on.set()
  deadline = time.monotonic() + 5
  while q.num_put < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
  assert q.num_put == 2 and q.claims == 0 and q.qsize() == 1
  # Full, then stopped: the waiting writer returns False promptly.
  time.sleep(0.3)
  assert thread.is_alive() and q.qsize() == 1
  stop.set()
  thread.join(timeout=5)
  assert not thread.is_alive() and result == [True, True, False]
  assert q.wait_for_room() is False and q.claim_room() is False


def test_a_claimed_slot_is_the_claimers_until_it_puts_or_releases():
  stop = threading.Event()
  q = data.LearnerQueue(maxsize=2, timeout=5.0, stop_event=stop)
  assert q.claim_room() and q.claim_room()  # The second call keeps the one claim.
  assert q.claims == 1
  assert q.put(_chunk([0])) and q.claims == 0  # Put into the claimed slot.
  assert q.claim_room() and (q.qsize(), q.claims) == (1, 1)
  # Every slot full or claimed: another thread's put and claim wait ...
  other = []
  putter = threading.Thread(target=lambda: other.append(q.put(_chunk([1]))))
  putter.start()
  time.sleep(0.3)
  assert putter.is_alive() and q.qsize() == 1
  # ... until the claim is given back (an actor that ends), not only on a take.
  q.release_claim()
  putter.join(timeout=5)
  assert other == [True] and (q.qsize(), q.claims) == (2, 0)
  q.release_claim()  # Holding none: nothing changes.
  assert q.claims == 0
  assert [q.get()['unroll_id'].tolist() for _ in range(2)] == [[0], [1]]
  # A claim held when the run stops: its put returns False and frees the slot.
  assert q.claim_room()
  stop.set()
  assert q.put(_chunk([2])) is False and q.claims == 0 and q.num_put == 2


def test_put_then_wait_for_room_without_claim_leaves_the_slot_free():
  stop = threading.Event()
  q = data.LearnerQueue(maxsize=1, timeout=5.0, stop_event=stop)
  result = []
  writer = threading.Thread(
      target=lambda: result.append(
          q.put_then_wait_for_room(_chunk([0]), claim=False)))
  writer.start()
  time.sleep(0.3)
  assert writer.is_alive() and q.qsize() == 1  # Waits for room after its put.
  assert q.get()['unroll_id'].tolist() == [0]
  writer.join(timeout=5)
  # It returned on room, holding no claim: another writer may take the slot.
  assert result == [True] and q.claims == 0
  assert q.wait_for_room(timeout=0.2) is True
  stop.set()


def test_writers_never_hold_more_chunks_than_the_queue_has_slots():
  stop = threading.Event()
  q = data.LearnerQueue(maxsize=2, timeout=5.0, stop_event=stop)
  in_hand = []  # Chunks collected (claimed or not) and not yet taken.
  lock = threading.Lock()
  worst = [0]

  def writer(wid):
    if not q.claim_room():
      return
    for i in range(40):
      with lock:
        in_hand.append((wid, i))
        worst[0] = max(worst[0], len(in_hand))
      if not q.put_then_wait_for_room(_chunk([wid * 100 + i]), claim=True):
        return
    q.release_claim()

  threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
  for t in threads:
    t.start()
  taken = []
  while len(taken) < 160:
    taken.append(int(q.get()['unroll_id'][0]))
    with lock:
      in_hand.remove((taken[-1] // 100, taken[-1] % 100))
      assert q.qsize() + q.claims <= 2
    time.sleep(0.001)
  for t in threads:
    t.join(timeout=5)
  # Four writers, two slots: never more than two chunks collected ahead.
  assert worst[0] <= 2 and sorted(taken) == sorted(
      w * 100 + i for w in range(4) for i in range(40))
  assert q.claims == 0


def test_wait_for_room_with_a_timeout_gives_up_when_it_passes():
  stop = threading.Event()
  q = data.LearnerQueue(maxsize=1, timeout=5.0, stop_event=stop)
  assert q.wait_for_room(timeout=0.0) is True  # Room: True even with no time.
  assert q.put(_chunk([0]))
  start = time.monotonic()
  assert q.wait_for_room(timeout=0.25) is False  # Still full when it passed.
  assert 0.25 <= time.monotonic() - start < 5.0
  # Room appearing while it waits: True as soon as the chunk is taken.
  taker = threading.Timer(0.2, q.get)
  taker.start()
  start = time.monotonic()
  assert q.wait_for_room(timeout=10.0) is True
  assert time.monotonic() - start < 5.0
  taker.join()
  assert q.put(_chunk([1]))
  stop.set()
  assert q.wait_for_room(timeout=10.0) is False  # Stopped: False at once.


def test_learner_queue_get_times_out_with_flag_name():
  q = data.LearnerQueue(maxsize=2, timeout=0.3, stop_event=threading.Event())
  start = time.monotonic()
  with pytest.raises(data.LearnerQueueTimeout, match='--learner_queue_timeout'):
    q.get()
  assert 0.25 <= time.monotonic() - start < 5.0
  assert isinstance(data.LearnerQueueTimeout('x'), RuntimeError)


def test_chunk_source_records_timeout_and_ends_dataset():
  q = data.LearnerQueue(maxsize=4, timeout=0.3, stop_event=threading.Event())
  q.put(_chunk([0, 1]))
  q.put(_chunk([2, 3, 4]))
  source = data.ChunkSource(q.get, None)
  els = _elements(data.build_dataset(source, SIG, batch_size=2))
  ids = np.concatenate([e['unroll_id'] for e in els]).tolist()
  assert ids == [0, 1, 2, 3]
  assert isinstance(source.error, data.LearnerQueueTimeout)
  assert '--learner_queue_timeout' in str(source.error)
  assert source.num_fresh == 5


def test_chunk_source_ends_on_none_without_error():
  stop = threading.Event()
  q = data.LearnerQueue(maxsize=4, timeout=30.0, stop_event=stop)
  q.put(_chunk([0, 1]))
  source = data.ChunkSource(q.get, None)
  gen = source.generator(0)
  assert next(gen)['unroll_id'].tolist() == [0, 1]
  stop.set()
  with pytest.raises(StopIteration):
    next(gen)
  assert source.error is None
