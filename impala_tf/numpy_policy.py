"""The policy of a feed-forward MLP network computed with numpy, for CPU actors.

Observations `[B, *observation_shape]` in the env's dtype (uint8 is scaled by
1/255 as the network does) map to float32 logits `[B, A]`; see
`impala_tf/types.py`.
"""

from typing import Sequence

import numpy as np
import tensorflow as tf

from impala_tf import layers
from impala_tf import torso_choice


class NumpyMLPPolicy:
  """The policy logits of a feed-forward MLP AgentNetwork, computed with numpy.

  Actors on the CPU act with tiny batches, where a TensorFlow call costs far more
  than the arithmetic and competes with the learner for TensorFlow's thread pools.
  For an MLP torso without a recurrent core this computes exactly what
  `AgentNetwork.step(...).policy_logits` computes (same layers, ReLU or leaky
  ReLU as `torso.activation` says, float32), from
  the weights the learner publishes (numpy arrays in `network.variables` order).
  Tests check it against the TensorFlow network.

  Args:
    network: an AgentNetwork with `torso_name == 'mlp'`, `use_lstm == False` and
      `compute_dtype == float32` (a bfloat16 torso acts with TensorFlow, so the
      actors' logits are the learner's).

  Raises:
    ValueError: for other networks (use `supports(network)` to check first).
  """

  def __init__(self, network: 'AgentNetwork'):
    if not self.supports(network):
      raise ValueError('NumpyMLPPolicy needs a float32 MLP network without an LSTM '
                       f'core, got torso={network.torso_name} use_lstm='
                       f'{network.use_lstm} compute_dtype={network.compute_dtype.name}')
    index = {v.ref(): i for i, v in enumerate(network.variables)}
    self._layer_index = [(index[l.w.ref()], index[l.b.ref()])
                         for l in network.torso.layers]
    self._head_index = (index[network.policy_head.w.ref()],
                        index[network.policy_head.b.ref()])
    self._input_size = network.torso.input_size
    # max(z, slope * z) is ReLU for slope 0 and leaky ReLU for 0 < slope < 1.
    self._slope = np.float32(layers.negative_slope(network.torso.activation))
    self._scale = 1.0 / 255.0 if network.observation_dtype == tf.uint8 else None
    self._layers = None
    self._head = None

  @staticmethod
  def supports(network: 'AgentNetwork') -> bool:
    return torso_choice.acts_with_numpy(network.torso_name, network.use_lstm,
                                        network.compute_dtype)

  def set_weights(self, weights: Sequence[np.ndarray]):
    """weights: numpy arrays in `network.variables` order (as the learner sends)."""
    self._layers = [(np.asarray(weights[w], np.float32),
                     np.asarray(weights[b], np.float32))
                    for w, b in self._layer_index]
    w, b = self._head_index
    self._head = (np.asarray(weights[w], np.float32), np.asarray(weights[b], np.float32))

  def __call__(self, observation: np.ndarray) -> np.ndarray:
    """observation `[B, *obs_shape]` (env dtype) -> logits float32 `[B, A]`."""
    x = np.asarray(observation, np.float32).reshape(len(observation), self._input_size)
    if self._scale is not None:
      x = x * np.float32(self._scale)
    for w, b in self._layers:
      z = x @ w + b
      x = np.maximum(z, self._slope * z)
    w, b = self._head
    return x @ w + b
