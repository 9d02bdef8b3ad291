"""What the learner workers of one run decide together: stop, checkpoint, counts.

The learner loop asks at the end of each reuse ring whether to stop
(`Agreement.decide`); the answer also says whether to checkpoint now. With one
learner worker the answer comes from this process's own counters. With several (a
MultiWorkerMirroredStrategy), every `AGREE_EVERY_STEPS` learner steps (whole reuse
rings) the workers all-reduce one small vector (`distribute.sum_over_workers`):
stop requests, failed actors or data (one bit per worker), env frames and episode
statistics, and the chief's wish to checkpoint. Every worker gets the same sums at
the same learner step, so all of them stop, and checkpoint, at the same step (none
is left waiting in a collective), and they count frames and episodes over all
workers. Between two agreements the counters of a multi-worker run are those of the
last one.

At start (and after the restore) `check_same` makes the workers compare their
config fingerprint, learner step and weights checksum: replicas that start apart
would drift while they still all-reduce.

This module reads no flags.
"""

import dataclasses
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from impala_tf import distribute
from impala_tf import metrics as metrics_lib
from impala_tf import types

# Several learner workers agree (stop, checkpoint, summed counters) every this
# many learner steps, rounded up to whole reuse rings: the agreement is a
# collective of its own, and a CartPole run that made it every step lost about
# 30% of its frames per second (2 workers on 2 shared cores). A stop then waits up
# to this many steps more.
AGREE_EVERY_STEPS = 16

# Seconds a worker waits after `check_same` found a difference, before it returns
# the error that stops its run: the all-reduce that told it may still be sending
# this worker's part to a peer, and a process that exits at once closes the socket
# under that peer's receive (TensorFlow 2.12: `UnavailableError: Collective ops is
# aborted by: Socket closed` on the peer instead of the same one-line error).
DISAGREEMENT_GRACE_SECS = 2.0


@dataclasses.dataclass(frozen=True)
class Decision:
  """The answer of `Agreement.decide`, the same on every worker.

  Attributes:
    checkpoint: write a checkpoint now (several workers: the chief asked for one).
    stop: None to go on, else (reached_target, interrupted), as the loop returns.
    failed_workers: the other workers whose actors or data failed ('' if none):
      this worker stops because of them.
  """
  checkpoint: bool = False
  stop: Optional[Tuple[bool, bool]] = None
  failed_workers: str = ''


class Agreement:
  """The stop and checkpoint decisions, and the run's counters, of one worker."""

  def __init__(self, strategy: tf.distribute.Strategy, worker_index: int,
               num_workers: int, multi: bool, ring: int,
               episode_log: metrics_lib.EpisodeLog, repeat: int,
               total_environment_frames: int, target_return: Optional[float]):
    """Builds the agreement (no collective yet).

    Args:
      strategy: the learner's strategy (its collectives carry the sums).
      worker_index, num_workers: this worker and the run's learner workers.
      multi: whether the run has a cluster of workers (even of one).
      ring: learner steps of a reuse ring (minibatch_buffer_size x num_sgd_iter).
      episode_log: this worker's episodes.
      repeat: env frames per agent step (action repeat).
      total_environment_frames, target_return: the run's stop conditions.
    """
    self.worker_index = worker_index
    self.num_workers = num_workers
    self.multi = multi
    self.ring = ring
    self.rings_between = max(1, -(-AGREE_EVERY_STEPS // ring)) if multi else 1
    self.episode_log = episode_log
    self.repeat = repeat
    self.total_environment_frames = total_environment_frames
    self.target_return = target_return
    self._sum: Optional[Callable[[Sequence[float]], np.ndarray]] = (
        distribute.sum_over_workers(strategy) if multi else None)
    self.base_env_frames = self.base_episodes = 0
    self.agreed: Dict[str, object] = {}

  def check_same(self, values: Dict[str, int], what: str) -> Optional[str]:
    """The one-line error when the workers' `values` differ, else None.

    Every worker gets the same answer; on a difference it returns after
    `DISAGREEMENT_GRACE_SECS`, so that no worker's exit cuts the all-reduce short
    for another.

    Args:
      values: name -> integer, the same names on every worker.
      what: the message's tail; '{}' becomes the differing names.
    """
    if not self.multi:
      return None
    differ = distribute.workers_disagree_on(self._sum, values, self.num_workers)
    if not differ:
      return None
    time.sleep(DISAGREEMENT_GRACE_SECS)  # Let the peers' last receive finish.
    return (f'learner worker {self.worker_index}: the {self.num_workers} learner '
            f'workers differ in {what.format(", ".join(differ))}; nothing was '
            'trained')

  def start_from(self, env_frames: int, episodes: int):
    """Sets the counters restored from a checkpoint (0 for a new run)."""
    self.base_env_frames, self.base_episodes = env_frames, episodes
    self.episode_log.count = episodes
    self.agreed = {'env_frames': env_frames, 'summary': self.episode_log.summary()}

  def env_frames(self, pool_steps: int) -> int:
    """The run's env frames (several workers: the sum at the last agreement)."""
    if self.multi:
      return self.agreed['env_frames']
    return self.base_env_frames + pool_steps * self.repeat

  def episodes(self) -> int:
    return self.episode_summary()['episodes']

  def saved_episodes(self) -> Tuple[int, List[types.EpisodeStats]]:
    """What a checkpoint keeps: the run's episode count and this worker's window.

    One worker: both from one lock (see `EpisodeLog.snapshot`). Several: the count
    agreed last, and this worker's own episodes.
    """
    count, recent = self.episode_log.snapshot()
    return (self.agreed['summary']['episodes'] if self.multi else count), recent

  def episode_summary(self) -> Dict[str, object]:
    """`EpisodeLog.summary`'s keys (several workers: as agreed last)."""
    return self.agreed['summary'] if self.multi else self.episode_log.summary()

  def due(self, steps_run: int) -> bool:
    """Whether `decide` is to be called after `steps_run` steps of this call.

    At the end of a reuse ring (with learner_steps_per_call = k: at a multiple of
    both k and the ring); several workers every `rings_between` rings.
    """
    if steps_run % self.ring:
      return False
    return not (steps_run // self.ring) % self.rings_between

  def decide(self, stop_requested: bool, stopping: bool, pool_failed: bool,
             data_failed: bool, pool_steps: int, want_checkpoint: bool
             ) -> Decision:
    """Whether to stop (and, with several workers, to checkpoint) now.

    Args:
      stop_requested: the caller asked the run to stop (Ctrl-C, stop_event).
      stopping: the run stops for a reason of its own (the actors were stopped).
      pool_failed: this worker's actor pool failed.
      data_failed: this worker's data source failed (a loader timed out).
      pool_steps: agent steps of this worker's actors in this call.
      want_checkpoint: this worker wants a checkpoint (several workers: the
        chief's wish counts).

    Returns:
      The Decision. One worker: stop on a failed pool (not interrupted), on a
      stop request (interrupted) or a stop of its own (not interrupted), at
      total_environment_frames, and at target_return once the episode window is
      full; `checkpoint` is False (one worker checkpoints on its own clock).
    """
    if not self.multi:
      if pool_failed or stop_requested or stopping:
        return Decision(stop=(False, not pool_failed and stop_requested))
      if self.env_frames(pool_steps) >= self.total_environment_frames:
        return Decision(stop=(False, False))
      if self.target_return is not None:
        s = self.episode_log.summary()
        if (s['episodes_in_mean'] >= self.episode_log.window and
            s['episode_return_mean'] >= self.target_return):
          return Decision(stop=(True, False))
      return Decision()
    return self._all_reduce(stop_requested or stopping,
                            pool_failed or data_failed, pool_steps,
                            want_checkpoint)

  def _all_reduce(self, stop: bool, failed: bool, pool_steps: int,
                  want_checkpoint: bool) -> Decision:
    """One all-reduce over the workers; every worker takes the same decision."""
    s = self.episode_log.summary()
    n = s['episodes_in_mean']
    # A worker whose data stopped would otherwise step on with empty shards of
    # the batch while the others' data trains. Bit i: worker i failed (exact in
    # float64 up to 52).
    values = [
        float(stop),
        float(2 ** min(self.worker_index, 52)) if failed else 0.0,
        float(pool_steps * self.repeat),
        float(s['episodes'] - self.base_episodes),
        (s['episode_return_mean'] or 0.0) * n,
        (s['episode_length_mean'] or 0.0) * n,
        float(n),
        float(want_checkpoint),
    ]
    (stops, errors, frames, episodes, return_sum, length_sum, count,
     checkpoint) = self._sum(values)
    count = int(round(count))
    self.agreed = {
        'env_frames': self.base_env_frames + int(round(frames)),
        'summary': {
            'episode_return_mean': return_sum / count if count else None,
            'episode_length_mean': length_sum / count if count else None,
            'episodes_in_mean': count,
            'episodes': self.base_episodes + int(round(episodes))},
    }
    checkpoint = checkpoint > 0
    if errors > 0:
      names = ''
      if not failed:
        bits = int(round(errors))
        names = ', '.join(str(i) for i in range(min(self.num_workers, 53))
                          if bits >> i & 1)
      return Decision(checkpoint, (False, False), names)
    if stops > 0:
      return Decision(checkpoint, (False, True))
    if self.agreed['env_frames'] >= self.total_environment_frames:
      return Decision(checkpoint, (False, False))
    if self.target_return is not None:
      mean = self.agreed['summary']['episode_return_mean']
      if (count >= self.episode_log.window * self.num_workers and
          mean >= self.target_return):
        return Decision(checkpoint, (True, False))
    return Decision(checkpoint)
