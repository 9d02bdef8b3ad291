"""Tests for impala_tf.torsos: the built-in torsos' shapes and errors."""

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
