"""The policies `episodes.run_episodes` plays: a network in this process or a SavedModel.

Both have `episodes`' policy interface: `policy(observation [B, ...], prev_action
int32 [B], reward float32 [B], first bool [B], state) -> (logits float32 [B, A]
numpy, new state)` and `initial_state(B)` (a tuple of float32 [B, H] tensors; ()
without a recurrent core).

* `NetworkPolicy(network)`: an `AgentNetwork` (restored from a checkpoint, or fed
  the learner's weights), stepped by one `tf.function`.
* `SavedModelPolicy(path)`: a SavedModel written by `saved_policy.save_policy`, used
  through its serving signature only (what a user without impala_tf has).
"""

from typing import Sequence

import numpy as np
import tensorflow as tf

from impala_tf import networks
from impala_tf import types


class NetworkPolicy:
  """An AgentNetwork's policy logits, one `tf.function` call per step.

  Args:
    network: the AgentNetwork (its current weights are used; `set_weights`
      replaces them).
  """

  def __init__(self, network: networks.AgentNetwork):
    self._network = network
    self._step = tf.function(self._step_fn, autograph=False)
    self.num_actions = network.num_actions

  def _step_fn(self, observation, prev_action, reward, first, state):
    out, new_state = self._network.step(
        types.AgentInput(observation, prev_action, reward, first), state)
    return out.policy_logits, new_state

  def set_weights(self, weights: Sequence[np.ndarray]) -> None:
    """Assigns `weights` (numpy arrays in `network.variables` order)."""
    for var, value in zip(self._network.variables, weights):
      var.assign(value)

  def initial_state(self, batch_size: int):
    return self._network.initial_state(batch_size)

  def __call__(self, observation, prev_action, reward, first, state):
    logits, new_state = self._step(observation, prev_action, reward, first, state)
    return logits.numpy(), new_state


class SavedModelPolicy:
  """A SavedModel from `saved_policy.save_policy`, called through its signature.

  Args:
    path: the SavedModel directory (e.g. `logdir/saved_policy`).
  """

  def __init__(self, path: str):
    self._model = tf.saved_model.load(path)
    self._fn = self._model.signatures['serving_default']
    _, inputs = self._fn.structured_input_signature
    self._state_specs = [inputs[k] for k in sorted(inputs)
                         if k.startswith('core_state_')]
    self._obs_dtype = inputs['observation'].dtype

  def initial_state(self, batch_size: int):
    return tuple(tf.zeros([batch_size, s.shape[-1]], s.dtype)
                 for s in self._state_specs)

  def __call__(self, observation, prev_action, reward, first, state):
    kwargs = {'observation': tf.convert_to_tensor(observation, self._obs_dtype)}
    if self._state_specs:
      kwargs.update(prev_action=tf.constant(prev_action, tf.int32),
                    reward=tf.constant(reward, tf.float32),
                    first=tf.constant(first, tf.bool))
      for i, s in enumerate(state):
        kwargs[f'core_state_{i}'] = s
    out = self._fn(**kwargs)
    new_state = tuple(out[f'core_state_{i}'] for i in range(len(self._state_specs)))
    return out['policy_logits'].numpy(), new_state
