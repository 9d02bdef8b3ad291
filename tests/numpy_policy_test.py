"""Tests for impala_tf.numpy_policy: the actors' numpy forward pass."""

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import networks
from impala_tf import numpy_policy
from impala_tf import types


@pytest.mark.parametrize('activation', ['relu', 'leaky_relu'])
@pytest.mark.parametrize('dtype,shape', [(tf.float32, (4,)), (tf.uint8, (6, 5, 2))])
def test_numpy_mlp_policy_matches_tensorflow_logits(dtype, shape, activation):
  learner_net = networks.AgentNetwork(shape, dtype, 3, mlp_hidden_sizes=(16, 8),
                                      seed=1, torso_activation=activation)
  actor_net = networks.AgentNetwork(shape, dtype, 3, mlp_hidden_sizes=(16, 8),
                                    seed=2, torso_activation=activation)
  policy = numpy_policy.NumpyMLPPolicy(actor_net)
  # Weights come from another instance, in `variables` order, as the learner sends.
  policy.set_weights([v.numpy() for v in learner_net.variables])
  rng = np.random.default_rng(0)
  obs = (rng.random((7,) + shape) * (255 if dtype == tf.uint8 else 3)).astype(
      dtype.as_numpy_dtype)
  out, _ = learner_net.step(types.AgentInput(
      obs, np.zeros(7, np.int32), np.zeros(7, np.float32), np.zeros(7, bool)), ())
  np.testing.assert_allclose(policy(obs), out.policy_logits.numpy(), rtol=1e-5,
                             atol=1e-6)


def test_numpy_mlp_policy_refuses_recurrent_and_conv_networks():
  lstm = networks.AgentNetwork((4,), tf.float32, 2, mlp_hidden_sizes=(8,),
                               use_lstm=True, lstm_size=4)
  conv = networks.AgentNetwork((36, 36, 2), tf.uint8, 2, torso='deep')
  bf16 = networks.AgentNetwork((4,), tf.float32, 2, mlp_hidden_sizes=(8,),
                               compute_dtype='bfloat16')
  assert numpy_policy.NumpyMLPPolicy.supports(
      networks.AgentNetwork((4,), tf.float32, 2, mlp_hidden_sizes=(8,)))
  for net in (lstm, conv, bf16):
    assert not numpy_policy.NumpyMLPPolicy.supports(net)
    with pytest.raises(ValueError, match='float32 MLP network without an LSTM'):
      numpy_policy.NumpyMLPPolicy(net)
