"""Bounded FIFO replay of unrolls, with RLlib's mix-in semantics.

After each fresh unroll is added, `floor(p)` replayed unrolls are emitted, plus one
more with probability `frac(p)` (p = replay_proportion), each drawn uniformly from the
FIFO of the last `num_slots` fresh unrolls (the one just added included). Replayed
unrolls are never re-added and are marked `replayed=True`.

Unrolls travel as dicts of numpy arrays whose leading axis indexes unrolls (`[N, ...]`,
see `impala_tf.types.Unroll`); the replay works on a whole chunk of N fresh unrolls at
once with numpy (no per-unroll Python), yet gives exactly the result of adding them one
at a time. Memory is `num_slots` unrolls, allocated on the first add. Thread-safe.
"""

import math
import threading
from typing import Dict, Optional

import numpy as np

Arrays = Dict[str, np.ndarray]


class ReplayBuffer:
  """FIFO of the last `num_slots` fresh unrolls, sampled uniformly."""

  def __init__(self, num_slots: int, replay_proportion: float, seed: int = 0):
    """Creates an empty buffer.

    Args:
      num_slots: int >= 1 when replay_proportion > 0; unrolls kept.
      replay_proportion: float >= 0, replayed unrolls per fresh unroll on average.
      seed: int, seeds the sampling.
    """
    if not (math.isfinite(replay_proportion) and replay_proportion >= 0):
      raise ValueError(f'replay_proportion={replay_proportion}: must be finite and '
                       '>= 0')
    if replay_proportion > 0 and num_slots < 1:
      raise ValueError(f'replay_buffer_num_slots={num_slots}: must be >= 1 when '
                       f'replay_proportion={replay_proportion} > 0')
    self._num_slots = num_slots
    self._whole = int(math.floor(replay_proportion))
    self._frac = replay_proportion - self._whole
    self._rng = np.random.default_rng(seed)
    self._lock = threading.Lock()
    self._ring: Optional[Arrays] = None
    self.num_added = 0  # Fresh unrolls added so far.
    self.num_replayed = 0  # Replayed unrolls emitted so far.

  @property
  def enabled(self) -> bool:
    return self._whole > 0 or self._frac > 0

  def __len__(self) -> int:
    return min(self.num_added, self._num_slots)

  def add_and_sample(self, fresh: Arrays) -> Optional[Arrays]:
    """Adds a chunk of fresh unrolls and returns the replays they trigger.

    Args:
      fresh: dict of arrays `[N, ...]`, N fresh unrolls in arrival order.

    Returns:
      dict of arrays `[M, ...]` (copies, `replayed` set True), or None when M = 0 or
      replay is disabled. The replays of fresh unroll i come before those of i + 1.
    """
    if not self.enabled:
      return None
    n = len(next(iter(fresh.values())))
    with self._lock:
      counts = np.full(n, self._whole, np.int64)
      if self._frac > 0:
        counts += self._rng.random(n) < self._frac
      start = self.num_added
      # Global index of the newest unroll when fresh unroll i is added, per replay.
      newest = np.repeat(start + np.arange(n), counts)
      window = np.minimum(newest + 1, self._num_slots)
      picks = newest - (self._rng.random(len(newest)) * window).astype(np.int64)
      replayed = None
      if len(picks):
        from_chunk = picks >= start
        replayed = {}
        for key, value in fresh.items():
          out = np.empty((len(picks),) + value.shape[1:], value.dtype)
          out[from_chunk] = value[picks[from_chunk] - start]
          if not from_chunk.all():
            out[~from_chunk] = self._ring[key][picks[~from_chunk] % self._num_slots]
          replayed[key] = out
        replayed['replayed'] = np.ones_like(replayed['replayed'], dtype=bool)
      self._write(fresh, start, n)
      self.num_added += n
      self.num_replayed += len(picks)
    return replayed

  def _write(self, fresh: Arrays, start: int, n: int):
    if self._ring is None:
      self._ring = {k: np.zeros((self._num_slots,) + v.shape[1:], v.dtype)
                    for k, v in fresh.items()}
    keep = min(n, self._num_slots)
    slots = (start + np.arange(n - keep, n)) % self._num_slots
    for key, value in fresh.items():
      self._ring[key][slots] = value[n - keep:]
