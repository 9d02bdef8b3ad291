"""Checkpoints under `logdir/checkpoints`: save, restore, fallback; rebuilding a run's network.

Checkpoints (`Checkpointer`): tf.train.Checkpoint + CheckpointManager. A checkpoint
holds whatever trackables the driver hands in: the network, the optimizer (its slots
and iteration count), the learner counters (learner steps, consumed / replayed /
trained frames, which are also the schedules' position), the run counters (env
frames, episodes, wall time), the episodes of the 100-episode training mean
(`EpisodeWindow`) and the actors' RNG states. A run started on a logdir
that has checkpoints restores the latest one before any training. The manager
updates `checkpoints/checkpoint` (the index of what exists) only after a checkpoint's
files are complete, so a run killed with SIGKILL mid-save resumes from the previous
one.

Run directories (`load_config`, `restore_network`): rebuild a finished or running
run's policy network from `logdir/config.json` and its latest checkpoint, without
the learner, the optimizer or flags. `impala_tf.export` and `impala_tf.evaluate` use
them; so can your own code:

    cfg, net, path = checkpoints.restore_network('/tmp/impala_cartpole')
    out, state = net.step(types.AgentInput(obs, prev_action, reward, first), state)

Restore (`Checkpointer.restore_latest`): a checkpoint that does not hold this run's
variables is refused, naming the flags to use. A damaged checkpoint (truncated or
corrupted file, missing index or data file) is skipped with a one-line warning for
the newest readable one, and once that one restores, moved to
`checkpoints/skipped/` (the keep-N rotation would delete it, a later restore would
try it again); none readable is an error that touches nothing. Any other read
error (permissions, I/O, memory) is not taken for damage: it stops with one line
(`CheckpointReadError`), touching nothing. `restore_network` (so `evaluate` and
`export`) skips a damaged newest checkpoint the same way, moving nothing.

The SavedModel of the policy is written by `impala_tf.saved_policy.save_policy`,
and the run directory's other parts (logdir checks and lock, config.json, resume
checks) are `impala_tf.rundir`'s.
"""

import glob
import os
import re
import shutil
from typing import List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import environments
from impala_tf import errors
from impala_tf import networks
from impala_tf import rundir
from impala_tf import types

def _checkpoint_number(prefix: str) -> int:
  match = re.search(r'-(\d+)$', prefix)
  return int(match.group(1)) if match else -1


class Checkpointer:
  """Saves and restores a set of trackables.

  Args:
    logdir: run directory; files go to `logdir/checkpoints`.
    keep: checkpoints kept (keep_checkpoints); older ones are deleted.
    optional: names of trackables that may be missing from a checkpoint (they keep
      their initial state), e.g. the RNG of an actor added since the checkpoint.
    **trackables: objects to save (tf.Module, tf.Variable, tf.random.Generator,
      optimizers).
  """

  def __init__(self, logdir: str, keep: int, optional=(), **trackables):
    self.directory = os.path.join(logdir, rundir.CHECKPOINT_SUBDIR)
    self._trackables = trackables
    self._optional = frozenset(optional)
    self.not_restored = []  # Optional trackables the last restore did not find.
    self._keep = keep
    self._checkpoint = tf.train.Checkpoint(**trackables)
    self._manager = tf.train.CheckpointManager(
        self._checkpoint, self.directory, max_to_keep=keep)

  @property
  def latest(self) -> Optional[str]:
    """Path prefix of the newest checkpoint, or None."""
    return self._manager.latest_checkpoint

  @property
  def checkpoints(self):
    """Path prefixes of the kept checkpoints, oldest first."""
    return list(self._manager.checkpoints)

  def candidates(self) -> List[str]:
    """Checkpoint path prefixes on disk, newest (highest number) first.

    The manager's list, plus any `ckpt-N` whose files exist but which the
    `checkpoint` index file does not name (e.g. the index file was lost).
    """
    return checkpoint_candidates(self.directory, self._manager.checkpoints)

  def restore_latest(self) -> Optional[str]:
    """Restores the newest readable checkpoint, if any; returns its path or None.

    A damaged checkpoint (a truncated or corrupted file, a missing index or data
    file) is skipped with a one-line warning on stderr, and the next older one is
    tried; once one restores, the skipped ones are moved to
    `checkpoints/skipped/` (kept for inspection, out of the keep-N rotation and of
    later restores). Any other read error (permissions, I/O, memory) is not
    damage: it stops the restore and touches nothing.

    Raises:
      rundir.CheckpointMismatchError: a trackable has no value in the checkpoint,
        or one of
        another shape (e.g. the network flags changed between runs).
      rundir.CheckpointUnreadableError: there are checkpoint files but none can be read.
      CheckpointReadError: a checkpoint cannot be read for another reason than
        damage to its files.
    """
    self.not_restored = []
    candidates = self.candidates()
    errors, skipped = [], []
    for path in candidates:
      try:
        restored = self._restore(path)
      except _READ_ERRORS as e:
        _raise_unless_damaged(path, e)
        errors.append(_skip_unreadable(path, e))
        skipped.append(path)
        continue
      if skipped:
        self._set_aside(skipped, restored)
      return restored
    if candidates:
      raise rundir.CheckpointUnreadableError(
          f'no checkpoint in {self.directory} can be read ({"; ".join(errors)}); '
          'nothing was changed: move the directory away (or use a new --logdir) to '
          'start over')
    return None

  def _restore(self, path: str) -> str:
    """Restores `path`; raises one of `_READ_ERRORS` when it cannot be read."""
    _check_files(path)
    checkpoint = self._checkpoint
    listed = tf.train.list_variables(path)
    if self._optional:
      saved = {name.split('/')[0] for name, _ in listed}
      self.not_restored = sorted(n for n in self._optional
                                 if n in self._trackables and n not in saved)
      if self.not_restored:
        checkpoint = tf.train.Checkpoint(**{
            k: v for k, v in self._trackables.items()
            if k not in self.not_restored})
    try:
      checkpoint.restore(path).assert_existing_objects_matched()
    except (AssertionError, ValueError) as e:
      detail = errors.one_line(e)
      raise rundir.CheckpointMismatchError(
          f'cannot resume from {path}: it does not match this run\'s network or '
          f'optimizer ({detail}); rerun with the flags that wrote it (see '
          f'{rundir.CONFIG_FILE} next to it) or use a new --logdir') from None
    self._check_complete(path, listed)
    return path

  def _check_complete(self, path: str, listed):
    """Each restored tf.Module got all of its variables from `path`, no more.

    `assert_existing_objects_matched` accepts a checkpoint that holds more
    variables than the module (e.g. one more hidden layer); this does not.
    """
    for name, obj in self._trackables.items():
      if name in self.not_restored or not isinstance(obj, tf.Module):
        continue
      saved = sum(1 for key, _ in listed
                  if key.startswith(name + '/') and key.endswith('VARIABLE_VALUE'))
      if saved != len(obj.variables):
        raise rundir.CheckpointMismatchError(
            f'cannot resume from {path}: its {name} has {saved} variables, this '
            f'run\'s has {len(obj.variables)}; rerun with the flags that wrote it '
            f'(see {rundir.CONFIG_FILE} next to it) or use a new --logdir')

  def save(self, step: int) -> str:
    """Writes a checkpoint numbered `step`; returns its path."""
    return self._manager.save(checkpoint_number=step)

  def _set_aside(self, skipped: List[str], restored: str):
    """Moves the files of the `skipped` checkpoints to `checkpoints/skipped/`.

    Left in place, the manager's keep-N rotation would delete them (one may be
    good, unreadable only at the time) and a later restore would try them before
    the checkpoints this run writes. The index file then names the checkpoints
    that remain, `restored` the latest.
    """
    aside = os.path.join(self.directory, SKIPPED_SUBDIR)
    os.makedirs(aside, exist_ok=True)
    for path in skipped:
      for f in glob.glob(glob.escape(path) + '.*'):
        os.replace(f, os.path.join(aside, os.path.basename(f)))
      rundir.warn(f'moved the unreadable checkpoint {path} to {aside}/ (not '
                  'deleted: look at it, or delete it yourself)')
    state = tf.train.get_checkpoint_state(self.directory)
    if state is not None:  # Drop the moved ones from the index, keep the rest.
      moved = {os.path.basename(p) for p in skipped}
      paths = [os.path.basename(p) for p in state.all_model_checkpoint_paths]
      times = list(state.all_model_checkpoint_timestamps)
      if len(times) != len(paths):
        times = [None] * len(paths)
      kept = [(p, t) for p, t in zip(paths, times) if p not in moved]
      del state.all_model_checkpoint_paths[:]
      del state.all_model_checkpoint_timestamps[:]
      for p, t in kept:
        state.all_model_checkpoint_paths.append(p)
        if t is not None:  # The rotation deletes only the ones with a time.
          state.all_model_checkpoint_timestamps.append(t)
      state.model_checkpoint_path = os.path.basename(restored)
      rundir.write_text_atomic(os.path.join(self.directory, 'checkpoint'),
                               str(state))
    self._manager = tf.train.CheckpointManager(
        self._checkpoint, self.directory, max_to_keep=self._keep)


class _UnreadableError(Exception):
  """A checkpoint's files are missing (raised before TensorFlow reads them)."""


class CheckpointReadError(rundir.RunDirError):
  """A checkpoint cannot be read for another reason than damage to its files
  (permissions, I/O, memory): nothing is skipped, nothing is changed."""


SKIPPED_SUBDIR = 'skipped'

# What reading a checkpoint may raise.
_READ_ERRORS = (tf.errors.OpError, _UnreadableError, IndexError, OSError,
                MemoryError)

# How TensorFlow reports a damaged checkpoint (measured on truncated, emptied and
# overwritten .index and data files): an IndexError 'Read less bytes than
# requested', or an OpError (UNKNOWN or DATA_LOSS) naming a bad checksum or sstable.
_DAMAGE_MESSAGE = re.compile(
    r'checksum|sstable|corrupt|truncat|read less bytes|bad magic|too short|'
    r'data loss|unexpected end', re.IGNORECASE)


def _is_damage(error: BaseException) -> bool:
  """Whether a read error means the checkpoint's files are damaged or missing."""
  if isinstance(error, (_UnreadableError, IndexError, tf.errors.DataLossError)):
    return True
  if isinstance(error, tf.errors.OpError) and not isinstance(
      error, (tf.errors.PermissionDeniedError, tf.errors.ResourceExhaustedError,
              tf.errors.UnavailableError)):
    return bool(_DAMAGE_MESSAGE.search(error.message or ''))
  return False


def _raise_unless_damaged(path: str, error: BaseException) -> None:
  """Raises CheckpointReadError (one line) unless `error` is damage to `path`."""
  if not _is_damage(error):
    raise CheckpointReadError(
        f'checkpoint {path} cannot be read ({_short(error)}); that is not damage '
        'to its files, so no older checkpoint is used and nothing was changed: '
        'fix the cause (permissions, disk, memory) and rerun') from None


def checkpoint_candidates(directory: str, listed=()) -> List[str]:
  """Checkpoint path prefixes in `directory`, newest (highest number) first.

  Args:
    directory: a run's `checkpoints/` directory.
    listed: prefixes known from elsewhere (a CheckpointManager's list); by default
      those the `checkpoint` index file names.

  Returns:
    `listed` plus every `ckpt-N` whose files exist, also those the index file does
    not name (e.g. it was lost), newest first.
  """
  found = set(listed)
  if not listed:
    state = tf.train.get_checkpoint_state(directory)
    if state is not None:
      found.update(os.path.join(directory, os.path.basename(p))
                   for p in state.all_model_checkpoint_paths)
  for f in glob.glob(os.path.join(glob.escape(directory), 'ckpt-*')):
    match = re.match(r'^(ckpt-\d+)\.(index|data-.*)$', os.path.basename(f))
    if match:
      found.add(os.path.join(directory, match.group(1)))
  return sorted(found, key=_checkpoint_number, reverse=True)


def _check_files(path: str) -> None:
  """Raises _UnreadableError if the index or data file of `path` is missing."""
  if not os.path.isfile(path + '.index'):
    raise _UnreadableError('its .index file is missing')
  if not glob.glob(glob.escape(path) + '.data-*'):
    raise _UnreadableError('its data file is missing')


def _skip_unreadable(path: str, error: BaseException) -> str:
  """Warns in one line that `path` is skipped; returns `ckpt-N: reason`."""
  detail = _short(error)
  rundir.warn(f'checkpoint {path} cannot be read ({detail}); trying the previous one')
  return f'{os.path.basename(path)}: {detail}'


def _short(e: BaseException) -> str:
  text = ' '.join(str(e).split()) or type(e).__name__
  if isinstance(e, tf.errors.OpError):
    text = f'{type(e).__name__}: {" ".join(e.message.split())}'
  return errors.one_line(text)


# --- run directories ---------------------------------------------------------


def latest_checkpoint(logdir: str) -> Optional[str]:
  """Path prefix of the newest checkpoint under `logdir/checkpoints`, or None."""
  return tf.train.latest_checkpoint(os.path.join(logdir, rundir.CHECKPOINT_SUBDIR))


def build_network(config: config_lib.Config) -> networks.AgentNetwork:
  """A freshly initialised network of the shape a run of `config` trains."""
  obs_space, action_space = environments.env_spaces(
      config.env, **environments.env_kwargs(config))
  return networks.make_network(config, obs_space, action_space)


def restore_network(logdir: str, checkpoint: Optional[str] = None
                    ) -> Tuple[config_lib.Config, networks.AgentNetwork, str]:
  """Rebuilds a run's network from config.json and restores checkpointed weights.

  Args:
    logdir: the run directory.
    checkpoint: a checkpoint path prefix; None for the newest readable one under
      `logdir/checkpoints` (as a resumed run does, a truncated or corrupted newer
      one is skipped with a one-line warning on stderr).

  Returns:
    (config, network, checkpoint path). Only the network is restored (the optimizer
    and counters in the checkpoint are ignored).

  Raises:
    rundir.RunDirError: as `load_config`, or no checkpoint, or a checkpoint that does not
      hold this network, or none that can be read (rundir.CheckpointUnreadableError).
  """
  config = rundir.load_config(logdir)
  directory = os.path.join(logdir, rundir.CHECKPOINT_SUBDIR)
  paths = [checkpoint] if checkpoint else checkpoint_candidates(directory)
  if not paths:
    raise rundir.no_checkpoint_error(logdir)
  network = build_network(config)
  errors = []
  for path in paths:
    try:
      _check_files(path)
      status = tf.train.Checkpoint(network=network).read(path)
      status.assert_existing_objects_matched()
      status.expect_partial()  # The optimizer and counters are not needed here.
      return config, network, path
    except (AssertionError, ValueError) as e:
      raise rundir.RunDirError(
          f'{path}: cannot restore the network of {rundir.CONFIG_FILE} from '
          f'it: {str(e).splitlines()[0] if str(e) else e!r}') from None
    except _READ_ERRORS as e:
      if checkpoint:
        raise rundir.RunDirError(f'{path}: cannot be read ({_short(e)})') from None
      _raise_unless_damaged(path, e)
      errors.append(_skip_unreadable(path, e))
  raise rundir.CheckpointUnreadableError(
      f'--logdir={logdir}: no checkpoint in {rundir.CHECKPOINT_SUBDIR}/ can be read '
      f'({"; ".join(errors)})')


class RunState(tf.Module):
  """Run counters that live outside the learner's graph, for checkpoints."""

  def __init__(self):
    super().__init__(name='run_state')
    self.env_frames = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.episodes = tf.Variable(0, dtype=tf.int64, trainable=False)
    self.wall_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)


class EpisodeWindow(tf.Module):
  """The episodes of the 100-episode training mean, for checkpoints.

  A resumed run's mean goes on over the episodes before the stop instead of
  starting again from one episode. Holds up to `CAPACITY` episodes, oldest first:
  `returns` float64 [CAPACITY], `lengths` int64 [CAPACITY] (agent steps), the first
  `size` (int64 scalar) of them valid.
  """

  CAPACITY = 100

  def __init__(self):
    super().__init__(name='episode_window')
    self.returns = tf.Variable(tf.zeros([self.CAPACITY], tf.float64),
                               trainable=False)
    self.lengths = tf.Variable(tf.zeros([self.CAPACITY], tf.int64), trainable=False)
    self.size = tf.Variable(0, dtype=tf.int64, trainable=False)

  def assign(self, episodes: Sequence[types.EpisodeStats]):
    """Keeps the last `CAPACITY` of `episodes` (oldest first)."""
    episodes = list(episodes)[-self.CAPACITY:]
    pad = self.CAPACITY - len(episodes)
    self.returns.assign(np.array([float(e.episode_return) for e in episodes] +
                                 [0.0] * pad, np.float64))
    self.lengths.assign(np.array([int(e.length) for e in episodes] + [0] * pad,
                                 np.int64))
    self.size.assign(len(episodes))

  def episodes(self) -> List[types.EpisodeStats]:
    """The held episodes, oldest first (returns as float, lengths as int)."""
    n = int(self.size.numpy())
    returns, lengths = self.returns.numpy()[:n], self.lengths.numpy()[:n]
    return [types.EpisodeStats(float(r), int(l)) for r, l in zip(returns, lengths)]


def run_checkpointers(logdir: str, keep: int, learner, run_state: RunState,
                      resumes: tf.Variable, actor_rngs: List[tf.random.Generator],
                      worker_index: int = 0,
                      episode_window: Optional[EpisodeWindow] = None
                      ) -> Tuple['Checkpointer', 'Checkpointer', Optional[str]]:
  """What a training run checkpoints, and where each learner worker saves it.

  Args:
    logdir: the run directory.
    keep: checkpoints kept (`--keep_checkpoints`).
    learner: the `learner.Learner` (its network, optimizer and counters).
    run_state: the run's counters.
    resumes: the count of resumes.
    actor_rngs: the actors' sampling RNGs (the chief's are checkpointed).
    worker_index: this learner worker (0: the chief).
    episode_window: the episodes of the training mean (None: not checkpointed).

  Returns:
    (restore_from, save_to, tmpdir): every worker restores from the chief's
    checkpoints in `logdir`; the chief saves there, another worker (TensorFlow's
    protocol: every worker saves) to `logdir/workertemp_I` (TensorFlow's name),
    emptied here and to be deleted at the end (`tmpdir`; None for the chief).
    The actors' RNGs, `nonfinite_updates`, `resumes` and `episode_window` are
    optional (older checkpoints lack them); another worker's RNGs are its own,
    not restored.
  """
  trackables = dict(
      network=learner.network, optimizer=learner.optimizer,
      learner_steps=learner.learner_steps,
      consumed_frames=learner.consumed_frames,
      replayed_frames=learner.replayed_frames,
      trained_frames=learner.trained_frames, run_state=run_state,
      nonfinite_updates=learner.nonfinite_updates, resumes=resumes)
  optional = [f'actor_rng_{i}' for i in range(len(actor_rngs))] + [
      'nonfinite_updates', 'resumes', 'episode_window']
  if episode_window is not None:
    trackables['episode_window'] = episode_window
  if worker_index == 0:
    trackables.update({f'actor_rng_{i}': g for i, g in enumerate(actor_rngs)})
  restore_from = Checkpointer(logdir, keep, optional=optional, **trackables)
  if worker_index == 0:
    return restore_from, restore_from, None
  # A worker killed before it deleted the directory leaves it where the next run
  # replaces it.
  tmpdir = os.path.join(logdir, f'workertemp_{worker_index}')
  shutil.rmtree(tmpdir, ignore_errors=True)
  return restore_from, Checkpointer(tmpdir, 1, optional=optional,
                                    **trackables), tmpdir
