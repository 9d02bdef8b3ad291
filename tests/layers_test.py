"""Tests for impala_tf.layers: shapes, initialisation and seeds of the layers."""

import math

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import layers


def test_seed_stream_is_deterministic_and_distinct():
  a, b = layers.SeedStream(3), layers.SeedStream(3)
  seeds_a = [a().numpy().tolist() for _ in range(3)]
  assert seeds_a == [b().numpy().tolist() for _ in range(3)]
  assert seeds_a == [[3, 1], [3, 2], [3, 3]]


def test_linear_shapes_and_glorot_limit():
  layer = layers.Linear(6, 10, layers.SeedStream(0), init_scale=0.5)
  assert layer.w.shape == (6, 10) and layer.b.shape == (10,)
  assert np.abs(layer.w.numpy()).max() <= 0.5 * math.sqrt(6.0 / 16)
  assert not layer.b.numpy().any()
  assert layer(tf.ones([3, 6])).shape == (3, 10)


@pytest.mark.parametrize('n_in,n_out', [(6, 4), (3, 5)])
def test_linear_orthogonal_is_orthonormal_times_the_gain(n_in, n_out):
  layer = layers.Linear(n_in, n_out, layers.SeedStream(0), init_scale=2.0,
                        init='orthogonal')
  w = layer.w.numpy() / 2.0
  # Orthonormal columns when out <= fan_in, orthonormal rows otherwise.
  gram = w.T @ w if n_out <= n_in else w @ w.T
  np.testing.assert_allclose(gram, np.eye(min(n_in, n_out)), atol=1e-5)
  assert not layer.b.numpy().any()
  again = layers.Linear(n_in, n_out, layers.SeedStream(0), init_scale=2.0,
                        init='orthogonal')
  np.testing.assert_array_equal(layer.w.numpy(), again.w.numpy())


def test_conv2d_orthogonal_filters_are_orthonormal_as_fan_in_vectors():
  conv = layers.Conv2D(4, 16, 8, 4, 'VALID', layers.SeedStream(1),
                       init='orthogonal', init_scale=layers.RELU_GAIN)
  # Each output filter, flattened over [kh, kw, in] (fan_in = 8 * 8 * 4 = 256),
  # is a vector of norm sqrt(2), orthogonal to the other 15.
  w = conv.w.numpy().reshape(256, 16)
  np.testing.assert_allclose(w.T @ w, 2.0 * np.eye(16), atol=1e-4)
  glorot = layers.Conv2D(4, 16, 8, 4, 'VALID', layers.SeedStream(1))
  assert np.abs(glorot.w.numpy()).max() <= math.sqrt(6.0 / (256 + 1024))


def test_unknown_init_is_an_error_naming_weight_init():
  with pytest.raises(ValueError,
                     match=r"weight_init='he': must be one of glorot, orthogonal"):
    layers.Linear(2, 2, layers.SeedStream(0), init='he')


@pytest.mark.parametrize('padding,size,want', [('SAME', 9, 5), ('VALID', 9, 4)])
def test_conv2d_output_size(padding, size, want):
  conv = layers.Conv2D(2, 4, 3, 2, padding, layers.SeedStream(0))
  assert conv.output_size(size) == want
  assert conv(tf.zeros([1, size, size, 2])).shape == (1, want, want, 4)
  with pytest.raises(ValueError, match='padding'):
    layers.Conv2D(2, 4, 3, 2, 'FULL', layers.SeedStream(0))


def test_lstm_cell_parameters_forget_bias_and_orthogonal_recurrence():
  cell = layers.LSTMCell(5, 3, layers.SeedStream(0), forget_bias=1.0)
  num = sum(int(np.prod(v.shape)) for v in cell.trainable_variables)
  assert num == (5 + 3) * 4 * 3 + 4 * 3
  np.testing.assert_array_equal(cell.b.numpy(), [0] * 3 + [1] * 3 + [0] * 6)
  for k in range(4):  # Each gate's recurrent kernel is orthogonal.
    w = cell.w_h.numpy()[:, 3 * k:3 * (k + 1)]
    np.testing.assert_allclose(w.T @ w, np.eye(3), atol=1e-5)
  out, (h, c) = cell(tf.ones([2, 5]), cell.initial_state(2))
  assert out.shape == h.shape == c.shape == (2, 3)


def _bfloat16_round(x):
  """float32 numpy -> the nearest bfloat16 values, as float64."""
  return tf.cast(tf.cast(x, tf.bfloat16), tf.float64).numpy()


def test_linear_and_conv2d_compute_in_their_inputs_dtype_with_float32_variables():
  rng = np.random.default_rng(0)
  seeds = layers.SeedStream(0)
  linear = layers.Linear(6, 5, seeds)
  conv = layers.Conv2D(2, 3, 3, 2, 'VALID', seeds)
  for layer in (linear, conv):
    layer.b.assign(rng.standard_normal(layer.b.shape).astype(np.float32))
  x_lin = rng.standard_normal((4, 6)).astype(np.float32)
  x_conv = rng.standard_normal((2, 7, 7, 2)).astype(np.float32)

  def by_hand(layer, x):  # float64, from bfloat16-rounded inputs and variables.
    x, w, b = _bfloat16_round(x), _bfloat16_round(layer.w), _bfloat16_round(layer.b)
    if layer is linear:
      return x @ w + b
    out = np.zeros((x.shape[0], 3, 3, 3))
    for i in range(3):
      for j in range(3):
        patch = x[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3, :]
        out[:, i, j] = np.einsum('nhwc,hwco->no', patch, w)
    return out + b

  for layer, x in ((linear, x_lin), (conv, x_conv)):
    full = layer(tf.constant(x))
    half = layer(tf.cast(x, tf.bfloat16))
    assert full.dtype == tf.float32 and half.dtype == tf.bfloat16
    assert layer.w.dtype == layer.b.dtype == tf.float32
    want = by_hand(layer, x)
    scale = np.abs(want).max()
    # bfloat16 keeps 8 significant bits: each output within a few of its ulps.
    np.testing.assert_allclose(tf.cast(half, tf.float64), want, rtol=2e-2,
                               atol=1e-2 * scale)
    np.testing.assert_allclose(full, want, rtol=2e-2, atol=1e-2 * scale)
    assert not np.array_equal(tf.cast(half, tf.float32).numpy(), full.numpy())
