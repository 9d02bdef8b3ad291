"""Tests for impala_tf.torsos: the built-in torsos' shapes, activations and errors."""

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import layers
from impala_tf import torsos


@pytest.mark.parametrize('make,input_shape,flat_size', [
    (torsos.ShallowTorso, (84, 84, 4), 9 * 9 * 32),
    (torsos.DeepTorso, (84, 84, 4), 11 * 11 * 32),
    (torsos.DeepTorso, (12, 12), 2 * 2 * 32),
])
def test_image_torsos_map_images_to_256_features(make, input_shape, flat_size):
  torso = make(input_shape, layers.SeedStream(0))
  assert torso.flat_size == flat_size and torso.output_size == 256
  assert torso(tf.zeros((3,) + input_shape)).shape == (3, 256)


def test_mlp_flattens_and_checks_its_sizes():
  mlp = torsos.MLP((2, 3), (8, 5), layers.SeedStream(0))
  assert mlp.input_size == 6 and mlp.output_size == 5
  assert mlp(tf.ones([4, 2, 3])).shape == (4, 5)
  with pytest.raises(ValueError, match='mlp_hidden_sizes'):
    torsos.MLP((3,), (), layers.SeedStream(0))


def test_image_torsos_refuse_vectors():
  for make, name in ((torsos.ShallowTorso, 'shallow'), (torsos.DeepTorso, 'deep')):
    with pytest.raises(ValueError, match=f'network={name}: needs image'):
      make((4,), layers.SeedStream(0))


def _leaky(z):
  return np.where(z > 0, z, 0.01 * z)


@pytest.mark.parametrize('activation,act', [
    ('relu', lambda z: np.maximum(z, 0.0)), ('leaky_relu', _leaky)])
def test_shallow_torso_against_numpy_layer_by_layer(activation, act):
  torso = torsos.ShallowTorso((24, 24, 2), layers.SeedStream(3),
                              activation=activation)
  x = tf.random.stateless_normal([2, 24, 24, 2], seed=[1, 2])
  w1, b1 = torso.conv1.w.numpy(), torso.conv1.b.numpy()
  w2, b2 = torso.conv2.w.numpy(), torso.conv2.b.numpy()

  def conv(h, w, b, stride):  # VALID, NHWC, written out with numpy.
    k, n = w.shape[0], (h.shape[1] - w.shape[0]) // stride + 1
    out = np.zeros((h.shape[0], n, n, w.shape[3]), np.float64)
    for i in range(n):
      for j in range(n):
        patch = h[:, i * stride:i * stride + k, j * stride:j * stride + k, :]
        out[:, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [0, 1, 2]))
    return out + b

  h = act(conv(x.numpy(), w1, b1, 4))  # 24 -> 5
  assert (h < 0).any() == (activation == 'leaky_relu')
  h = act(conv(h, w2, b2, 2))  # 5 -> 1
  h = act(h.reshape(2, -1) @ torso.fc.w.numpy() + torso.fc.b.numpy())
  np.testing.assert_allclose(torso(x).numpy(), h, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('make,shape', [
    (lambda s, **k: torsos.MLP(s, (8, 8), layers.SeedStream(0), **k), (5,)),
    (lambda s, **k: torsos.ShallowTorso(s, layers.SeedStream(0), **k), (20, 20, 1)),
    (lambda s, **k: torsos.DeepTorso(s, layers.SeedStream(0), **k), (8, 8, 1)),
])
def test_leaky_torsos_pass_gradient_where_relu_passes_none(make, shape):
  # Every bias pushed far below zero: ReLU units are all dead, leaky ones are not.
  x = tf.random.stateless_uniform((3,) + shape, seed=[0, 1])
  grads = {}
  for activation in ('relu', 'leaky_relu'):
    torso = make(shape, activation=activation)
    for v in torso.trainable_variables:
      if v.shape.rank == 1:
        v.assign(tf.fill(v.shape, -100.0))
    kernel = next(v for v in torso.trainable_variables if v.shape.rank > 1)
    with tf.GradientTape() as tape:
      y = tf.reduce_sum(torso(x))
    grads[activation] = float(tf.norm(tape.gradient(y, kernel)))
  assert grads['relu'] == 0.0 and grads['leaky_relu'] > 0.0


def test_unknown_activation_is_an_error_naming_the_flag():
  with pytest.raises(ValueError,
                     match="torso_activation='gelu': must be one of relu, leaky_relu"):
    torsos.ShallowTorso((84, 84, 4), layers.SeedStream(0), activation='gelu')
