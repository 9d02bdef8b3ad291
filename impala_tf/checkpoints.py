"""What a run persists: checkpoints under `logdir/checkpoints`, and the SavedModel policy.

Checkpoints (`Checkpointer`): tf.train.Checkpoint + CheckpointManager. A checkpoint
holds whatever trackables the driver hands in: the network, the optimizer (its slots
and iteration count), the learner counters (learner steps, consumed / replayed /
trained frames, which are also the schedules' position), the run counters (env
frames, episodes, wall time) and the actors' RNG states. A run started on a logdir
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

Resume checks (`check_resume`, `Checkpointer.restore_latest`): a run refuses a
checkpoint written with other shape-relevant flags (the network, the LSTM, the
optimizer kind, the env's spaces), naming the flags and both values, before anything
is written; a checkpoint that cannot be read (truncated data file, missing index) is
skipped with a one-line warning for the newest readable one; none readable is an
error that touches nothing. `restore_network` (so `evaluate` and `export`) skips an
unreadable newest checkpoint the same way. `check_logdir` refuses a logdir that cannot be written.

SavedModel (`save_policy`): writes the serving model described below, which loads
with TensorFlow alone (`tf.saved_model.load(path)`); no impala_tf import needed.
`save_policy` lives here rather than in `impala_tf.export` (which re-exports it) so
that the driver, which knows no flags, does not import the export command line.
"""

import glob
import json
import os
import re
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import environments
from impala_tf import networks
from impala_tf import types

CHECKPOINT_SUBDIR = 'checkpoints'
CONFIG_FILE = 'config.json'
SAVED_POLICY_SUBDIR = 'saved_policy'


class RunDirError(ValueError):
  """A run directory lacks what is asked of it (config.json, a checkpoint)."""


class CheckpointMismatchError(RunDirError):
  """The latest checkpoint does not fit the objects to restore (e.g. the network
  flags changed between the run that wrote it and this one)."""


class CheckpointUnreadableError(RunDirError):
  """No checkpoint of a run directory can be read (all truncated or corrupted)."""


def _checkpoint_number(prefix: str) -> int:
  match = re.search(r'-(\d+)$', prefix)
  return int(match.group(1)) if match else -1


def _warn(message: str):
  sys.stderr.write(f'impala_tf: warning: {" ".join(message.split())}\n')
  sys.stderr.flush()


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
    self.directory = os.path.join(logdir, CHECKPOINT_SUBDIR)
    self._trackables = trackables
    self._optional = frozenset(optional)
    self.not_restored = []  # Optional trackables the last restore did not find.
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

    A checkpoint whose files cannot be read (a truncated or corrupted data file, a
    missing index) is skipped with a one-line warning on stderr, and the next older
    one is tried.

    Raises:
      CheckpointMismatchError: a trackable has no value in the checkpoint, or one of
        another shape (e.g. the network flags changed between runs).
      CheckpointUnreadableError: there are checkpoint files but none can be read.
    """
    self.not_restored = []
    candidates = self.candidates()
    errors = []
    for path in candidates:
      try:
        return self._restore(path)
      except _UNREADABLE as e:
        errors.append(_skip_unreadable(path, e))
    if candidates:
      raise CheckpointUnreadableError(
          f'no checkpoint in {self.directory} can be read ({"; ".join(errors)}); '
          'nothing was changed: move the directory away (or use a new --logdir) to '
          'start over')
    return None

  def _restore(self, path: str) -> str:
    """Restores `path`; raises one of `_UNREADABLE` when it cannot be read."""
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
      detail = ' '.join(str(e).split())
      if len(detail) > 300:
        detail = detail[:300] + '...'
      raise CheckpointMismatchError(
          f'cannot resume from {path}: it does not match this run\'s network or '
          f'optimizer ({detail}); rerun with the flags that wrote it (see '
          f'{CONFIG_FILE} next to it) or use a new --logdir') from None
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
        raise CheckpointMismatchError(
            f'cannot resume from {path}: its {name} has {saved} variables, this '
            f'run\'s has {len(obj.variables)}; rerun with the flags that wrote it '
            f'(see {CONFIG_FILE} next to it) or use a new --logdir')

  def save(self, step: int) -> str:
    """Writes a checkpoint numbered `step`; returns its path."""
    return self._manager.save(checkpoint_number=step)


class _UnreadableError(Exception):
  """A checkpoint's files are missing (raised before TensorFlow reads them)."""


# What reading a truncated or corrupted checkpoint raises: TensorFlow reports a
# truncated file as an OpError (DataLoss, NotFound, ...) or an IndexError ('Read less
# bytes than requested').
_UNREADABLE = (tf.errors.OpError, _UnreadableError, IndexError, OSError)


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
  _warn(f'checkpoint {path} cannot be read ({detail}); trying the previous one')
  return f'{os.path.basename(path)}: {detail}'


def _short(e: BaseException) -> str:
  text = ' '.join(str(e).split()) or type(e).__name__
  if isinstance(e, tf.errors.OpError):
    text = f'{type(e).__name__}: {" ".join(e.message.split())}'
  return text[:200] + ('...' if len(text) > 200 else '')


# --- run directories ---------------------------------------------------------


def load_config(logdir: str) -> config_lib.Config:
  """The Config a run wrote to `logdir/config.json`.

  Raises:
    RunDirError: no such directory, no config.json, or a config.json that does not
      parse into a valid Config.
  """
  if not os.path.isdir(logdir):
    raise RunDirError(f'--logdir={logdir}: no such directory')
  path = os.path.join(logdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise RunDirError(f'--logdir={logdir}: has no {CONFIG_FILE}; is it the --logdir '
                      'of an impala_tf.train run?')
  try:
    with open(path, encoding='utf-8') as f:
      d = json.load(f)
    if not isinstance(d, dict):
      raise ValueError('not a JSON object')
    if isinstance(d.get('mlp_hidden_sizes'), list):
      d['mlp_hidden_sizes'] = tuple(d['mlp_hidden_sizes'])
    return config_lib.Config.from_dict(d)
  except ValueError as e:  # json.JSONDecodeError and ConfigError are ValueErrors.
    raise RunDirError(f'{path}: not a valid impala_tf config: {e}') from None


def latest_checkpoint(logdir: str) -> Optional[str]:
  """Path prefix of the newest checkpoint under `logdir/checkpoints`, or None."""
  return tf.train.latest_checkpoint(os.path.join(logdir, CHECKPOINT_SUBDIR))


def env_kwargs(config: config_lib.Config) -> dict:
  """The keyword arguments of `environments.make_vector_env` a Config implies."""
  return dict(noop_max=config.noop_max, frame_stack=config.frame_stack,
              episodic_life=config.episodic_life,
              max_episode_frames=config.max_episode_frames,
              use_lstm=config.use_lstm)


def _flag_value(value) -> str:
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (list, tuple)):
    return ','.join(str(v) for v in value)
  return str(value)


def _torso(network: str, observation_space) -> str:
  """The torso `networks.make_network` builds for `network` ('auto' resolved)."""
  if network != 'auto':
    return network
  return 'mlp' if len(observation_space.shape) == 1 else 'deep'


def _spaces_key(obs_space, action_space):
  return (tuple(obs_space.shape), str(obs_space.dtype), int(action_space.n))


def resume_differences(saved: Dict[str, object], config: config_lib.Config,
                       obs_space, action_space) -> List[Tuple[str, object, object]]:
  """The shape-relevant flags in which `config` differs from a saved config.

  Shape-relevant: what changes the variables a checkpoint holds, i.e. the torso
  (`network`, with 'auto' resolved), `mlp_hidden_sizes` (mlp torso), `use_lstm`,
  `lstm_size` (with an LSTM), `optimizer`, `rmsprop_momentum` being 0 or not (its
  slot), and the env's spaces (`env`, `frame_stack`, `use_lstm` for Atari).

  Args:
    saved: the dict of a run's config.json (missing keys take Config's defaults).
    config: this run's Config.
    obs_space, action_space: this run's single-env spaces.

  Returns:
    (flag, saved value, value now) for each difference, in Config's field order.
  """
  defaults = config_lib.Config().to_dict()
  old = lambda k: saved.get(k, defaults[k])
  diffs = {}
  def differ(field, old_value, new_value):
    if old_value != new_value:
      diffs[field] = (field, old_value, new_value)

  old_obs, old_act = obs_space, action_space
  space_fields = ('env', 'frame_stack', 'use_lstm')
  if any(old(k) != getattr(config, k) for k in space_fields):
    try:
      old_cfg = config.replace(**{k: old(k) for k in space_fields})
      old_obs, old_act = environments.env_spaces(old_cfg.env,
                                                 **env_kwargs(old_cfg))
    except Exception:  # pylint: disable=broad-except
      old_obs = old_act = None  # The old env cannot be built here: compare ids.
    if (old_obs is None or _spaces_key(old_obs, old_act) !=
        _spaces_key(obs_space, action_space)):
      for k in space_fields:
        differ(k, old(k), getattr(config, k))
      if old_obs is None:
        old_obs = obs_space
  old_torso = _torso(old('network'), old_obs)
  new_torso = _torso(config.network, obs_space)
  if old_torso != new_torso:
    differ('network', old('network'), config.network)
  if old_torso == new_torso == 'mlp':
    differ('mlp_hidden_sizes', tuple(old('mlp_hidden_sizes')),
           tuple(config.mlp_hidden_sizes))
  differ('use_lstm', old('use_lstm'), config.use_lstm)
  if old('use_lstm') and config.use_lstm:
    differ('lstm_size', old('lstm_size'), config.lstm_size)
  differ('optimizer', old('optimizer'), config.optimizer)
  if old('optimizer') == config.optimizer == 'rmsprop':
    if (old('rmsprop_momentum') > 0) != (config.rmsprop_momentum > 0):
      diffs['rmsprop_momentum'] = ('rmsprop_momentum', old('rmsprop_momentum'),
                                   config.rmsprop_momentum)
  order = list(defaults)
  return sorted(diffs.values(), key=lambda d: order.index(d[0]))


def check_resume(config: config_lib.Config, obs_space, action_space) -> None:
  """Refuses to resume a run whose checkpoints were written with other shapes.

  Reads `config.logdir/config.json` when the logdir has checkpoint files; writes
  nothing.

  Raises:
    CheckpointMismatchError: naming each differing flag with its saved value and
      its value now (one line).
  """
  directory = os.path.join(config.logdir, CHECKPOINT_SUBDIR)
  if not glob.glob(os.path.join(glob.escape(directory), 'ckpt-*')):
    return
  path = os.path.join(config.logdir, CONFIG_FILE)
  try:
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
  except (OSError, ValueError):
    return  # No readable config.json: the checkpoint itself is checked on restore.
  if not isinstance(saved, dict):
    return
  diffs = resume_differences(saved, config, obs_space, action_space)
  if diffs:
    what = '; '.join(f'--{k}={_flag_value(a)} there, {_flag_value(b)} now'
                     for k, a, b in diffs)
    raise CheckpointMismatchError(
        f'cannot resume from the checkpoints in {directory}: they were written with '
        f'other network or optimizer flags ({what}); rerun with the flags in {path} '
        'or use a new --logdir')


def check_logdir(logdir: str) -> None:
  """Checks that `logdir` is (or can be made) a writable directory; writes nothing
  that stays (a probe file is created and removed).

  Raises:
    ConfigError: for field 'logdir', saying why.
  """
  path = os.path.abspath(logdir)
  existing = path
  while not os.path.exists(existing):
    parent = os.path.dirname(existing)
    if parent == existing:
      break
    existing = parent
  if not os.path.isdir(existing):
    where = 'is a file' if existing == path else f'{existing} is a file'
    raise config_lib.ConfigError(
        'logdir', logdir, f'{where}, not a directory; use another --logdir')
  try:
    fd, probe = tempfile.mkstemp(prefix='.impala_tf_probe_', dir=existing)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise config_lib.ConfigError(
        'logdir', logdir,
        f'cannot be written ({existing}: {e.strerror or e}); use another --logdir '
        'or fix its permissions') from None


def build_network(config: config_lib.Config) -> networks.AgentNetwork:
  """A freshly initialised network of the shape a run of `config` trains."""
  obs_space, action_space = environments.env_spaces(config.env, **env_kwargs(config))
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
    RunDirError: as `load_config`, or no checkpoint, or a checkpoint that does not
      hold this network, or none that can be read (CheckpointUnreadableError).
  """
  config = load_config(logdir)
  directory = os.path.join(logdir, CHECKPOINT_SUBDIR)
  paths = [checkpoint] if checkpoint else checkpoint_candidates(directory)
  if not paths:
    raise RunDirError(
        f'--logdir={logdir}: has no checkpoint in {CHECKPOINT_SUBDIR}/ (a run writes '
        'one every --checkpoint_interval_secs and when it stops)')
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
      raise RunDirError(f'{path}: cannot restore the network of {CONFIG_FILE} from '
                        f'it: {str(e).splitlines()[0] if str(e) else e!r}') from None
    except _UNREADABLE as e:
      if checkpoint:
        raise RunDirError(f'{path}: cannot be read ({_short(e)})') from None
      errors.append(_skip_unreadable(path, e))
  raise CheckpointUnreadableError(
      f'--logdir={logdir}: no checkpoint in {CHECKPOINT_SUBDIR}/ can be read '
      f'({"; ".join(errors)})')


# --- SavedModel ------------------------------------------------------------------


class _Policy(tf.Module):
  """A tf.Module holding the network and the serving function."""

  def __init__(self, network):
    super().__init__(name='policy')
    self.network = network
    obs = tf.TensorSpec([None] + list(network.observation_shape),
                        tf.as_dtype(network.observation_dtype), name='observation')
    state_specs = [tf.TensorSpec([None, int(s.shape[-1])], tf.float32,
                                 name=f'core_state_{i}')
                   for i, s in enumerate(network.initial_state(1))]
    self.num_state = len(state_specs)
    if state_specs:
      specs = [obs, tf.TensorSpec([None], tf.int32, name='prev_action'),
               tf.TensorSpec([None], tf.float32, name='reward'),
               tf.TensorSpec([None], tf.bool, name='first')] + state_specs
      self.serve = tf.function(self._serve_recurrent, input_signature=specs,
                               autograph=False)
      self.initial_state = tf.function(
          self._initial_state, input_signature=[tf.TensorSpec([], tf.int32)],
          autograph=False)
    else:
      # No AutoGraph (nothing data-dependent in Python): converting the network's
      # code took most of the export's seconds at the end of every run.
      self.serve = tf.function(self._serve, input_signature=[obs], autograph=False)

  def _outputs(self, out):
    logits = out.policy_logits
    return {
        'action': tf.random.categorical(logits, 1, dtype=tf.int32)[:, 0],
        'greedy_action': tf.argmax(logits, axis=-1, output_type=tf.int32),
        'policy_logits': logits,
        'baseline': out.baseline,
    }

  def _serve(self, observation):
    b = tf.shape(observation)[0]
    inputs = types.AgentInput(observation, tf.zeros([b], tf.int32),
                              tf.zeros([b], tf.float32), tf.zeros([b], tf.bool))
    out, _ = self.network.step(inputs, ())
    return self._outputs(out)

  def _serve_recurrent(self, observation, prev_action, reward, first, *state):
    inputs = types.AgentInput(observation, prev_action, reward, first)
    out, new_state = self.network.step(inputs, tuple(state))
    result = self._outputs(out)
    for i, s in enumerate(new_state):
      result[f'core_state_{i}'] = s
    return result

  def _initial_state(self, batch_size):
    return {f'core_state_{i}': s
            for i, s in enumerate(self.network.initial_state(batch_size))}


def save_policy(network, path: str):
  """Writes a SavedModel of `network`'s policy to `path` (replaced if it exists).

  Its `serving_default` signature maps a batch of observations `[B, *obs_shape]`
  (the env's dtype: float32 vectors, uint8 images) to `{'action': int32 [B]
  (sampled), 'greedy_action': int32 [B], 'policy_logits': float32 [B, A],
  'baseline': float32 [B]}`. With a recurrent core it also takes `prev_action`
  int32 [B], `reward` float32 [B], `first` bool [B] (True resets the state) and
  `core_state_0..k` float32 [B, S] (zeros at the start; the `initial_state`
  signature, `batch_size` int32 -> zeros, gives them), and also returns the new
  `core_state_*`. Loading needs TensorFlow only:
  `tf.saved_model.load(path).signatures['serving_default'](observation=...)`.

  Args:
    network: an `impala_tf.networks.AgentNetwork` (variables may be mirrored).
    path: output directory.
  """
  policy = _Policy(_plain_copy(network))
  signatures = {'serving_default': policy.serve}
  if policy.num_state:
    signatures['initial_state'] = policy.initial_state
  tf.saved_model.save(policy, path, signatures=signatures)


def _plain_copy(network):
  """A copy of `network` with plain (non-mirrored) variables on the CPU."""
  with tf.device('/cpu:0'):
    user = isinstance(network.torso, networks.UserTorso)
    hidden = [] if user else [
        layer.b.shape[0] for layer in getattr(network.torso, 'layers', [])]
    copy = networks.AgentNetwork(
        network.observation_shape, network.observation_dtype, network.num_actions,
        torso=network.torso_name, mlp_hidden_sizes=hidden or (64,),
        use_lstm=network.use_lstm, lstm_size=network.lstm_size,
        spaces=network.torso.spaces if user else None)
  if len(copy.variables) != len(network.variables):
    raise ValueError(f'cannot copy network {network.name}: {len(network.variables)} '
                     f'variables, the rebuilt copy has {len(copy.variables)}')
  for dst, src in zip(copy.variables, network.variables):
    if dst.shape != src.shape:
      raise ValueError(f'cannot copy variable {src.name} {src.shape} into '
                       f'{dst.name} {dst.shape}')
    dst.assign(src.numpy())
  return copy
