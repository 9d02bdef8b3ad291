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
