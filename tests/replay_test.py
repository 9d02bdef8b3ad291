"""Tests for impala_tf.replay: RLlib mix-in semantics of the ReplayBuffer.

Fresh unrolls are tagged with consecutive `unroll_id`s 0, 1, 2, ... (the global index
of the unroll in arrival order), so the id of a replay says where it came from.
"""

import math
import threading

import numpy as np
import pytest

from impala_tf import replay


def _chunk(start, n, t1=3):
  """n fresh unrolls with ids start..start+n-1; observation rows hold the id."""
  ids = np.arange(start, start + n, dtype=np.int64)
  return {
      'observation': np.repeat(ids[:, None, None], t1, 1).repeat(2, 2).astype(
          np.float32),
      'action': np.repeat(ids[:, None], t1, 1).astype(np.int32),
      'core_state_0': np.repeat(ids[:, None], 4, 1).astype(np.float32),
      'unroll_id': ids,
      'replayed': np.zeros(n, bool),
  }


def _feed(buf, num_unrolls, chunk_size):
  """Adds ids 0..num_unrolls-1 in chunks; returns [(chunk_start, n, replays)]."""
  out = []
  for start in range(0, num_unrolls, chunk_size):
    n = min(chunk_size, num_unrolls - start)
    out.append((start, n, buf.add_and_sample(_chunk(start, n))))
  return out


def _count(r):
  return 0 if r is None else len(r['unroll_id'])


@pytest.mark.parametrize('p', [0.3, 1.5, 2.75])
def test_counts_per_fresh_unroll_are_floor_or_floor_plus_one(p):
  buf = replay.ReplayBuffer(num_slots=16, replay_proportion=p, seed=3)
  counts = np.array([_count(r) for _, _, r in _feed(buf, 10000, 1)])
  lo = math.floor(p)
  assert set(np.unique(counts)) == {lo, lo + 1}
  # Mean of 10000 Bernoulli(frac) draws: sd <= 0.005; allow 6 sd.
  assert abs(counts.mean() - p) < 0.03, counts.mean()
  assert buf.num_added == 10000
  assert buf.num_replayed == counts.sum()


@pytest.mark.parametrize('p', [1, 2.0, 3])
@pytest.mark.parametrize('chunk_size', [1, 5])
def test_integer_proportion_is_exact(p, chunk_size):
  buf = replay.ReplayBuffer(num_slots=4, replay_proportion=p, seed=0)
  for _, n, r in _feed(buf, 40, chunk_size):
    assert _count(r) == int(p) * n
  assert buf.num_replayed == 40 * int(p)


def test_chunk_counts_are_bounded_and_average_p():
  p = 0.6
  buf = replay.ReplayBuffer(num_slots=8, replay_proportion=p, seed=1)
  total = 0
  for _, n, r in _feed(buf, 21000, 7):
    assert 0 <= _count(r) <= n
    total += _count(r)
  assert abs(total / 21000 - p) < 0.02
  assert buf.num_replayed == total


@pytest.mark.parametrize('num_slots', [1, 3, 5])
def test_one_at_a_time_replays_come_from_the_last_num_slots(num_slots):
  buf = replay.ReplayBuffer(num_slots=num_slots, replay_proportion=1.7, seed=2)
  seen_ages = set()
  for start, _, r in _feed(buf, 300, 1):
    if r is None:
      continue
    ids = r['unroll_id']
    # Window: the unroll just added and the num_slots - 1 before it.
    assert ids.max() <= start
    assert ids.min() >= max(0, start - num_slots + 1)
    seen_ages.update((start - ids).tolist())
  # Every slot of the window is used (not only the newest).
  assert seen_ages == set(range(num_slots))
  assert len(buf) == num_slots


def _assert_assignable(replays_ids, start, n, num_slots, max_per_position):
  """Replays of position i precede those of i+1 and lie in i's window."""
  pos = start
  used = 0
  for rid in replays_ids:
    want = max(pos, rid)  # Earliest position whose window contains rid.
    if want != pos:
      pos, used = want, 0
    if used == max_per_position:
      pos, used = pos + 1, 0
    assert pos < start + n, (replays_ids, start, n)
    assert pos - num_slots + 1 <= rid <= pos, (replays_ids, start, n)
    used += 1


@pytest.mark.parametrize('chunk_size', [3, 11])
def test_chunk_replays_lie_in_the_window_of_their_position(chunk_size):
  num_slots, p = 4, 1.4
  buf = replay.ReplayBuffer(num_slots=num_slots, replay_proportion=p, seed=5)
  for start, n, r in _feed(buf, 400, chunk_size):
    if r is not None:
      assert len(r['unroll_id']) >= n  # floor(p) = 1 per position at least.
      _assert_assignable(r['unroll_id'], start, n, num_slots, 2)


@pytest.mark.parametrize('chunk_size', [2, 7])
def test_chunk_integer_proportion_positions_are_exact(chunk_size):
  # With p = 2 the replays of position i are exactly rows 2i and 2i + 1.
  num_slots = 5
  buf = replay.ReplayBuffer(num_slots=num_slots, replay_proportion=2, seed=7)
  for start, n, r in _feed(buf, 200, chunk_size):
    positions = start + np.repeat(np.arange(n), 2)
    ids = r['unroll_id']
    assert np.all(ids <= positions)
    assert np.all(ids >= np.maximum(positions - num_slots + 1, 0))


@pytest.mark.parametrize('chunk_size', [1, 3, 10])
def test_age_distribution_is_uniform_over_the_window(chunk_size):
  """Same distribution whether unrolls come one by one or in chunks.

  p = 1 so each position has exactly one replay, whose age (position - id) must be
  uniform over 0..num_slots-1 once the window is full. A chunk of 10 > num_slots
  exercises picks from the chunk itself and from the ring at once.
  """
  num_slots, num = 4, 6000
  buf = replay.ReplayBuffer(num_slots=num_slots, replay_proportion=1.0, seed=11)
  ages = []
  for start, n, r in _feed(buf, num, chunk_size):
    ages.append(start + np.arange(n) - r['unroll_id'])
  ages = np.concatenate(ages)[num_slots:]
  freq = np.bincount(ages, minlength=num_slots) / len(ages)
  assert len(freq) == num_slots
  # sd of each frequency ~ sqrt(.25 * .75 / 6000) = 0.0056.
  np.testing.assert_allclose(freq, 1.0 / num_slots, atol=0.03)


def test_replays_are_never_re_added():
  num_slots = 3
  buf = replay.ReplayBuffer(num_slots=num_slots, replay_proportion=2.5, seed=0)
  for start in range(0, 52, 4):
    n = 4
    r = buf.add_and_sample(_chunk(start, n))
    # The ring holds exactly the last num_slots fresh unrolls, none replayed.
    newest = start + n
    ring = buf._ring  # pylint: disable=protected-access
    assert newest >= num_slots
    assert sorted(ring['unroll_id'].tolist()) == list(
        range(newest - num_slots, newest))
    assert not ring['replayed'].any()
    # Later replays only ever contain fresh data (observation rows == their id).
    np.testing.assert_array_equal(
        r['observation'][:, 0, 0], r['unroll_id'].astype(np.float32))
  assert buf.num_added == 52
  assert len(buf) == num_slots


def test_replayed_flag_and_contents_are_copies():
  buf = replay.ReplayBuffer(num_slots=4, replay_proportion=3, seed=0)
  fresh = _chunk(0, 2)
  out = buf.add_and_sample(fresh)
  assert out['replayed'].dtype == np.bool_ and out['replayed'].all()
  assert not fresh['replayed'].any()  # The caller's chunk is not flagged.
  for key in fresh:
    assert out[key].dtype == fresh[key].dtype
    assert out[key].shape[1:] == fresh[key].shape[1:]
    assert not np.shares_memory(out[key], fresh[key]), key
  for key in ('observation', 'action', 'core_state_0'):
    ids = out['unroll_id']
    np.testing.assert_array_equal(out[key], fresh[key][ids])
  # Scribbling on the returned replays or on the caller's chunk after the add
  # must not change what the buffer replays later.
  out['observation'][:] = -5
  fresh['observation'][:] = -7
  fresh['unroll_id'][:] = -1
  later = buf.add_and_sample(_chunk(2, 1))
  np.testing.assert_array_equal(later['observation'][:, 0, 0],
                                later['unroll_id'].astype(np.float32))
  assert set(later['unroll_id'].tolist()) <= {0, 1, 2}


def test_same_seed_same_replays():
  a = replay.ReplayBuffer(num_slots=5, replay_proportion=0.7, seed=9)
  b = replay.ReplayBuffer(num_slots=5, replay_proportion=0.7, seed=9)
  c = replay.ReplayBuffer(num_slots=5, replay_proportion=0.7, seed=10)
  ra = [r for _, _, r in _feed(a, 60, 3)]
  rb = [r for _, _, r in _feed(b, 60, 3)]
  rc = [r for _, _, r in _feed(c, 60, 3)]
  ids = lambda rs: [None if r is None else r['unroll_id'].tolist() for r in rs]
  assert ids(ra) == ids(rb)
  assert ids(ra) != ids(rc)


@pytest.mark.parametrize('num_slots', [0, 4])
def test_disabled_at_zero_proportion(num_slots):
  buf = replay.ReplayBuffer(num_slots=num_slots, replay_proportion=0.0)
  assert not buf.enabled
  for _, _, r in _feed(buf, 10, 3):
    assert r is None
  assert buf.num_replayed == 0
  assert replay.ReplayBuffer(num_slots=1, replay_proportion=0.01).enabled


@pytest.mark.parametrize('kwargs, pattern', [
    (dict(num_slots=4, replay_proportion=-0.5), 'replay_proportion=-0.5'),
    (dict(num_slots=4, replay_proportion=float('nan')), 'replay_proportion=nan'),
    (dict(num_slots=4, replay_proportion=float('inf')), 'replay_proportion=inf'),
    (dict(num_slots=0, replay_proportion=0.5), 'replay_buffer_num_slots=0'),
    (dict(num_slots=-2, replay_proportion=1), 'replay_buffer_num_slots=-2'),
])
def test_bad_arguments_name_the_argument(kwargs, pattern):
  with pytest.raises(ValueError, match=pattern):
    replay.ReplayBuffer(**kwargs)


def test_concurrent_adds_keep_counts_consistent():
  buf = replay.ReplayBuffer(num_slots=8, replay_proportion=1, seed=0)
  results = []

  def work(base):
    for i in range(50):
      r = buf.add_and_sample(_chunk(base + 2 * i, 2))
      results.append(len(r['unroll_id']))

  threads = [threading.Thread(target=work, args=(1000 * k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert buf.num_added == 400
  assert buf.num_replayed == sum(results) == 400
