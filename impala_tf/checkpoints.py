"""Checkpoints: tf.train.Checkpoint + CheckpointManager under `logdir/checkpoints`.

A checkpoint holds whatever trackables the driver hands in: the network, the optimizer
(its slots and iteration count), the learner counters (learner steps, consumed /
replayed / trained frames, which are also the schedules' position), the run counters
(env frames, episodes) and the actors' RNG states. A run started on a logdir that has
checkpoints restores the latest one before any training.
"""

import os
from typing import Optional

import tensorflow as tf


class Checkpointer:
  """Saves and restores a set of trackables.

  Args:
    logdir: run directory; files go to `logdir/checkpoints`.
    keep: checkpoints kept (keep_checkpoints).
    **trackables: objects to save (tf.Module, tf.Variable, tf.random.Generator).
  """

  def __init__(self, logdir: str, keep: int, **trackables):
    self.directory = os.path.join(logdir, 'checkpoints')
    self._checkpoint = tf.train.Checkpoint(**trackables)
    self._manager = tf.train.CheckpointManager(
        self._checkpoint, self.directory, max_to_keep=keep)

  @property
  def latest(self) -> Optional[str]:
    return self._manager.latest_checkpoint

  def restore_latest(self) -> Optional[str]:
    """Restores the newest checkpoint, if any; returns its path or None."""
    path = self._manager.latest_checkpoint
    if path:
      self._checkpoint.restore(path).assert_existing_objects_matched()
    return path

  def save(self, step: int) -> str:
    """Writes a checkpoint numbered `step`; returns its path."""
    return self._manager.save(checkpoint_number=step)
