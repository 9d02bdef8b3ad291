"""Tests of impala_tf/agreement.py: the decisions of one worker and of several."""

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import agreement as agreement_lib
from impala_tf import metrics as metrics_lib
from impala_tf import types


def _agreement(multi=False, ring=2, total=1000, target=None, index=0, workers=1,
               window=2):
  log = metrics_lib.EpisodeLog(window)
  a = agreement_lib.Agreement(tf.distribute.get_strategy(), index, workers, multi,
                              ring, log, repeat=4, total_environment_frames=total,
                              target_return=target)
  return a, log


def _decide(a, **kw):
  args = dict(stop_requested=False, stopping=False, pool_failed=False,
              data_failed=False, pool_steps=0, want_checkpoint=False)
  args.update(kw)
  return a.decide(**args)


def test_one_worker_counts_its_own_frames_from_the_restored_ones():
  a, log = _agreement()
  a.start_from(env_frames=100, episodes=3)
  assert log.count == 3
  assert a.env_frames(pool_steps=10) == 100 + 10 * 4
  log.add([types.EpisodeStats(5.0, 7)])
  assert a.episodes() == 4
  assert a.episode_summary() == log.summary()
  assert a.saved_episodes() == (4, [types.EpisodeStats(5.0, 7)])


@pytest.mark.parametrize('kw,stop', [
    (dict(), None),
    (dict(stop_requested=True), (False, True)),
    (dict(stopping=True), (False, False)),
    (dict(pool_failed=True, stop_requested=True), (False, False)),
    (dict(data_failed=True), None),  # One worker: the data's end stops the loop.
    (dict(pool_steps=225), (False, False)),  # 100 + 225 x 4 = 1000 frames.
    (dict(pool_steps=224), None),
])
def test_one_worker_stops_on_its_own_conditions(kw, stop):
  a, _ = _agreement()
  a.start_from(100, 0)
  decision = _decide(a, **kw)
  assert decision.stop == stop
  assert not decision.checkpoint and not decision.failed_workers


def test_one_worker_stops_at_the_target_once_the_window_is_full():
  a, log = _agreement(target=10.0, window=2)
  a.start_from(0, 0)
  log.add([types.EpisodeStats(20.0, 5)])
  assert _decide(a).stop is None  # One episode of the two the mean needs.
  log.add([types.EpisodeStats(5.0, 5)])
  assert log.summary()['episode_return_mean'] == 12.5
  assert _decide(a).stop == (True, False)  # Mean 12.5 >= 10 over a full window.
  a2, log2 = _agreement(target=13.0, window=2)
  a2.start_from(0, 0)
  log2.add([types.EpisodeStats(20.0, 5)])
  log2.add([types.EpisodeStats(5.0, 5)])
  assert _decide(a2).stop is None  # ...12.5 < 13 goes on.


def test_due_at_ring_ends_and_several_workers_every_agree_steps(monkeypatch):
  monkeypatch.setattr(agreement_lib.distribute, 'sum_over_workers',
                      lambda strategy: None)
  a, _ = _agreement(ring=3)
  assert [s for s in range(1, 13) if a.due(s)] == [3, 6, 9, 12]
  rings = -(-agreement_lib.AGREE_EVERY_STEPS // 3)
  m, _ = _agreement(multi=True, ring=3)
  assert m.rings_between == rings
  assert [s for s in range(1, 3 * rings * 2 + 1) if m.due(s)] == [
      3 * rings, 6 * rings]


def test_several_workers_sum_and_decide_alike(monkeypatch):
  """The all-reduce's sums (here: another worker's vector added) decide."""
  other = np.zeros(8)

  def fake_sum(strategy):
    del strategy
    return lambda values: np.asarray(values, np.float64) + other

  monkeypatch.setattr(agreement_lib.distribute, 'sum_over_workers', fake_sum)
  a, log = _agreement(multi=True, index=0, workers=2, total=10_000, target=None)
  a.start_from(env_frames=1000, episodes=10)
  log.add([types.EpisodeStats(4.0, 20)])
  # The other worker: 50 agent steps x 4 frames, 1 episode of return 6, length 30.
  other[:] = [0, 0, 200, 1, 6.0, 30.0, 1, 1]
  decision = _decide(a, pool_steps=25)
  assert decision == agreement_lib.Decision(checkpoint=True)  # The chief's wish.
  assert a.env_frames(pool_steps=999) == 1000 + 25 * 4 + 200  # As agreed.
  assert a.episodes() == 10 + 1 + 1
  log.add([types.EpisodeStats(8.0, 9)])  # After the agreement: the chief's own.
  assert a.saved_episodes() == (12, [types.EpisodeStats(4.0, 20),
                                     types.EpisodeStats(8.0, 9)])
  assert a.episode_summary() == {'episode_return_mean': 5.0,
                                 'episode_length_mean': 25.0,
                                 'episodes_in_mean': 2, 'episodes': 12}
  other[:] = [0, 2.0, 0, 0, 0, 0, 0, 0]  # Worker 1's actors or data failed.
  assert _decide(a) == agreement_lib.Decision(False, (False, False), '1')
  assert _decide(a, pool_failed=True).failed_workers == ''  # Its own failure.
  other[:] = [1, 0, 0, 0, 0, 0, 0, 0]  # Worker 1 was asked to stop.
  assert _decide(a).stop == (False, True)


def test_check_same_names_what_differs_after_the_grace(monkeypatch):
  slept = []
  monkeypatch.setattr(agreement_lib.time, 'sleep', slept.append)
  a, _ = _agreement()
  assert a.check_same({'weights': 1}, '{}') is None  # One worker: nothing to do.
  differ = [['weights']]
  monkeypatch.setattr(agreement_lib.distribute, 'workers_disagree_on',
                      lambda fn, values, n: differ[0])
  monkeypatch.setattr(agreement_lib.distribute, 'sum_over_workers',
                      lambda strategy: None)
  m, _ = _agreement(multi=True, index=1, workers=2)
  assert m.check_same({'weights': 1}, '{} after the restore') == (
      'learner worker 1: the 2 learner workers differ in weights after the '
      'restore; nothing was trained')
  # The error comes after the grace (the peers' last receive), an agreement at once.
  assert slept == [agreement_lib.DISAGREEMENT_GRACE_SECS] and slept[0] >= 1.0
  differ[0] = []
  assert m.check_same({'weights': 1}, '{}') is None
  assert slept == [agreement_lib.DISAGREEMENT_GRACE_SECS]
