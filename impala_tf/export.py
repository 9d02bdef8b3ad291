"""SavedModel export of a policy; `python -m impala_tf.export --logdir=DIR`.

`save_policy(network, path)` writes a SavedModel whose `serving_default` signature maps
a batch of observations `[B, *obs_shape]` (the env's dtype) to
`{'action': int32 [B] (sampled), 'greedy_action': int32 [B], 'policy_logits':
float32 [B, A], 'baseline': float32 [B]}`. With a recurrent core it also takes
`prev_action` int32 [B], `reward` float32 [B], `first` bool [B] and `core_state_0..k`
float32 [B, S], and returns the new `core_state_*`. Loading needs TensorFlow only:
`tf.saved_model.load(path).signatures['serving_default'](observation=...)`.

The command-line form restores the latest checkpoint of a run directory and writes
`logdir/saved_policy` (or `--output`).
"""

import tensorflow as tf

from impala_tf import networks
from impala_tf import types


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
    if state_specs:
      specs = [obs, tf.TensorSpec([None], tf.int32, name='prev_action'),
               tf.TensorSpec([None], tf.float32, name='reward'),
               tf.TensorSpec([None], tf.bool, name='first')] + state_specs
      self.serve = tf.function(self._serve_recurrent, input_signature=specs)
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


def save_policy(network, path: str):
  """Writes the SavedModel described in the module docstring to `path`.

  Args:
    network: an `impala_tf.networks.AgentNetwork` (variables may be mirrored).
    path: output directory (replaced if it exists).
  """
  policy = _Policy(_plain_copy(network))
  tf.saved_model.save(policy, path,
                      signatures={'serving_default': policy.serve})


def _plain_copy(network):
  """A copy of `network` with plain (non-mirrored) variables on the CPU."""
  with tf.device('/cpu:0'):
    hidden = [layer.b.shape[0] for layer in getattr(network.torso, 'layers', [])]
    copy = networks.AgentNetwork(
        network.observation_shape, network.observation_dtype, network.num_actions,
        torso=network.torso_name, mlp_hidden_sizes=hidden or (64,),
        use_lstm=network.use_lstm, lstm_size=network.lstm_size)
  for dst, src in zip(copy.variables, network.variables):
    dst.assign(src.numpy())
  return copy
