"""The SavedModel of a run's policy (`logdir/saved_policy`), loadable with TensorFlow
alone (`tf.saved_model.load(path)`; no impala_tf import needed).

`save_policy(network, path)` writes it; the serving signatures are described
there. It lives in its own module, not in `impala_tf.export`, so that the driver,
which knows no flags, does not import the export command line.
"""

import tensorflow as tf

from impala_tf import networks
from impala_tf import rundir
from impala_tf import types
from impala_tf import user_torso



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
  """Writes a SavedModel of `network`'s policy to `path` (replaced atomically).

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
  # Written beside `path`, then renamed into place: a reader (or a run killed
  # mid-export) never finds a half-written SavedModel there.
  rundir.replace_dir_atomic(
      path, lambda tmp: tf.saved_model.save(policy, tmp, signatures=signatures))


def _plain_copy(network):
  """A copy of `network` with plain (non-mirrored) variables on the CPU."""
  with tf.device('/cpu:0'):
    user = isinstance(network.torso, user_torso.UserTorso)
    hidden = [] if user else [
        layer.b.shape[0] for layer in getattr(network.torso, 'layers', [])]
    copy = networks.AgentNetwork(
        network.observation_shape, network.observation_dtype, network.num_actions,
        torso=network.torso_name, mlp_hidden_sizes=hidden or (64,),
        use_lstm=network.use_lstm, lstm_size=network.lstm_size,
        spaces=network.torso.spaces if user else None,
        popart=network.popart is not None,
        popart_sigma_floor=(network.popart.sigma_floor if network.popart
                            else 0.0),
        shared_torso=network.value_torso is None,
        torso_activation='relu' if user else network.torso.activation,
        compute_dtype=network.compute_dtype.name)
  if len(copy.variables) != len(network.variables):
    raise ValueError(f'cannot copy network {network.name}: {len(network.variables)} '
                     f'variables, the rebuilt copy has {len(copy.variables)}')
  for dst, src in zip(copy.variables, network.variables):
    if dst.shape != src.shape:
      raise ValueError(f'cannot copy variable {src.name} {src.shape} into '
                       f'{dst.name} {dst.shape}')
    dst.assign(src.numpy())
  return copy
