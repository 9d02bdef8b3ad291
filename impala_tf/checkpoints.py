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

SavedModel (`save_policy`): writes the serving model described below, which loads
with TensorFlow alone (`tf.saved_model.load(path)`); no impala_tf import needed.
`save_policy` lives here rather than in `impala_tf.export` (which re-exports it) so
that the driver, which knows no flags, does not import the export command line.
"""

import json
import os
from typing import Optional, Tuple

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

  def restore_latest(self) -> Optional[str]:
    """Restores the newest checkpoint, if any; returns its path or None.

    Raises:
      CheckpointMismatchError: a trackable has no value in the checkpoint, or one of
        another shape (e.g. the network flags changed between runs).
    """
    path = self._manager.latest_checkpoint
    self.not_restored = []
    if path:
      checkpoint = self._checkpoint
      if self._optional:
        saved = {name.split('/')[0] for name, _ in tf.train.list_variables(path)}
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
    return path

  def save(self, step: int) -> str:
    """Writes a checkpoint numbered `step`; returns its path."""
    return self._manager.save(checkpoint_number=step)


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


def build_network(config: config_lib.Config) -> networks.AgentNetwork:
  """A freshly initialised network of the shape a run of `config` trains."""
  obs_space, action_space = environments.env_spaces(config.env, **env_kwargs(config))
  return networks.make_network(config, obs_space, action_space)


def restore_network(logdir: str, checkpoint: Optional[str] = None
                    ) -> Tuple[config_lib.Config, networks.AgentNetwork, str]:
  """Rebuilds a run's network from config.json and restores checkpointed weights.

  Args:
    logdir: the run directory.
    checkpoint: a checkpoint path prefix; None for the latest under
      `logdir/checkpoints`.

  Returns:
    (config, network, checkpoint path). Only the network is restored (the optimizer
    and counters in the checkpoint are ignored).

  Raises:
    RunDirError: as `load_config`, or no checkpoint, or a checkpoint that does not
      hold this network.
  """
  config = load_config(logdir)
  path = checkpoint or latest_checkpoint(logdir)
  if not path:
    raise RunDirError(
        f'--logdir={logdir}: has no checkpoint in {CHECKPOINT_SUBDIR}/ (a run writes '
        'one every --checkpoint_interval_secs and when it stops)')
  network = build_network(config)
  try:
    status = tf.train.Checkpoint(network=network).read(path)
    status.assert_existing_objects_matched()
    status.expect_partial()  # The optimizer and counters are not needed here.
  except (AssertionError, ValueError, tf.errors.OpError) as e:
    raise RunDirError(f'{path}: cannot restore the network of {CONFIG_FILE} from '
                      f'it: {str(e).splitlines()[0] if str(e) else e!r}') from None
  return config, network, path


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
      self.serve = tf.function(self._serve_recurrent, input_signature=specs)
      self.initial_state = tf.function(
          self._initial_state, input_signature=[tf.TensorSpec([], tf.int32)])
    else:
      self.serve = tf.function(self._serve, input_signature=[obs])

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
    hidden = [layer.b.shape[0] for layer in getattr(network.torso, 'layers', [])]
    copy = networks.AgentNetwork(
        network.observation_shape, network.observation_dtype, network.num_actions,
        torso=network.torso_name, mlp_hidden_sizes=hidden or (64,),
        use_lstm=network.use_lstm, lstm_size=network.lstm_size)
  if len(copy.variables) != len(network.variables):
    raise ValueError(f'cannot copy network {network.name}: {len(network.variables)} '
                     f'variables, the rebuilt copy has {len(copy.variables)}')
  for dst, src in zip(copy.variables, network.variables):
    if dst.shape != src.shape:
      raise ValueError(f'cannot copy variable {src.name} {src.shape} into '
                       f'{dst.name} {dst.shape}')
    dst.assign(src.numpy())
  return copy
