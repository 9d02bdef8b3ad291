"""The built-in torsos: MLP (`network=mlp`), IMPALA shallow and deep (ResNet).

A torso maps float32 observations `[N, *observation_shape]` (N is e.g. T * B of
a time-major sequence, see `impala_tf/types.py`; uint8 images already divided by
255 by the network) to float32 features `[N, output_size]`. Images are NHWC
(`[N, H, W, C]`, or `[N, H, W]` for one channel). Built from `impala_tf.layers`;
variables are created in the constructors. Which torso a `network` value names
('auto' resolved) is `torso_choice.resolve_torso`.

`weight_init` ('glorot' or 'orthogonal', `layers.WEIGHT_INITS`) draws every
kernel of a torso; orthogonal kernels get the ReLU gain sqrt(2) (`layers`).
`activation` ('relu' or 'leaky_relu', `layers.activation`) is the nonlinearity
wherever the paper's networks have a ReLU.
"""

import math
from typing import Optional, Sequence, Tuple

import tensorflow as tf

from impala_tf import layers


def _init(weight_init: str) -> dict:
  """The `init` / `init_scale` keyword arguments of a torso's ReLU layers."""
  layers.check_init(weight_init)
  gain = layers.RELU_GAIN if weight_init == 'orthogonal' else 1.0
  return {'init': weight_init, 'init_scale': gain}


class MLP(tf.Module):
  """Flatten, then fully connected layers, each followed by `activation`.

  Input float32 `[N, *input_shape]`; output float32 `[N, hidden_sizes[-1]]`.
  """

  def __init__(self, input_shape: Sequence[int], hidden_sizes: Sequence[int],
               seeds: layers.SeedStream, name: Optional[str] = None,
               weight_init: str = 'glorot', activation: str = 'relu'):
    super().__init__(name=name)
    init = _init(weight_init)
    self.activation = activation
    self._act = layers.activation(activation)
    hidden_sizes = tuple(int(h) for h in hidden_sizes)
    if not hidden_sizes or min(hidden_sizes) < 1:
      raise ValueError(f'mlp_hidden_sizes={hidden_sizes}: must be one or more '
                       'integers >= 1')
    self.input_size = math.prod(input_shape)
    sizes = (self.input_size,) + hidden_sizes
    with self.name_scope:
      self.layers = [
          layers.Linear(n_in, n_out, seeds, name=f'linear_{k}', **init)
          for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]))
      ]
    self.output_size = sizes[-1]

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, *input_shape]` to float32 `[N, output_size]`."""
    x = tf.reshape(x, [-1, self.input_size])
    for layer in self.layers:
      x = self._act(layer(x))
    return x


def _image_shape(input_shape: Sequence[int], torso: str) -> Tuple[int, int, int]:
  """`[H, W]` or `[H, W, C]` -> `(H, W, C)`; ValueError naming `network` else."""
  shape = tuple(int(d) for d in input_shape)
  if len(shape) == 2:
    shape += (1,)
  if len(shape) != 3:
    raise ValueError(
        f'network={torso}: needs image observations [H, W] or [H, W, C], got '
        f'observation shape {list(input_shape)}; use network=mlp for vectors')
  return shape


class ShallowTorso(tf.Module):
  """IMPALA shallow torso (paper Fig. 3, left).

  conv 16 8x8 stride 4 VALID, ReLU; conv 32 4x4 stride 2 VALID, ReLU; flatten;
  FC 256, ReLU (each ReLU `activation`). Input float32 `[N, H, W, C]` (or `[N, H, W]`); output float32
  `[N, 256]`. For 84x84: 84 -> 20 -> 9, so the FC sees 9 * 9 * 32 = 2592 inputs.
  """

  def __init__(self, input_shape: Sequence[int], seeds: layers.SeedStream,
               name: Optional[str] = None, weight_init: str = 'glorot',
               activation: str = 'relu'):
    super().__init__(name=name)
    init = _init(weight_init)
    self.activation = activation
    self._act = layers.activation(activation)
    self.input_shape = _image_shape(input_shape, 'shallow')
    h, w, c = self.input_shape
    with self.name_scope:
      self.conv1 = layers.Conv2D(c, 16, 8, 4, 'VALID', seeds, name='conv1', **init)
      self.conv2 = layers.Conv2D(16, 32, 4, 2, 'VALID', seeds, name='conv2', **init)
      for conv in (self.conv1, self.conv2):
        h, w = conv.output_size(h), conv.output_size(w)
      if h < 1 or w < 1:
        raise ValueError(
            f'network=shallow: observation shape {list(input_shape)} is too small '
            'for its 8x8/4 and 4x4/2 VALID convolutions (needs H, W >= 20)')
      self.flat_size = h * w * 32
      self.fc = layers.Linear(self.flat_size, 256, seeds, name='fc', **init)
    self.output_size = 256

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, H, W, C]` to float32 `[N, 256]`."""
    x = tf.reshape(x, (-1,) + self.input_shape)
    x = self._act(self.conv1(x))
    x = self._act(self.conv2(x))
    x = tf.reshape(x, [-1, self.flat_size])
    return self._act(self.fc(x))


class _ResidualBlock(tf.Module):
  """`x + conv(act(conv(act(x))))` with 3x3 SAME convs, `[N, H, W, C]` float32."""

  def __init__(self, channels: int, seeds: layers.SeedStream,
               name: Optional[str] = None, init: Optional[dict] = None,
               activation: str = 'relu'):
    super().__init__(name=name)
    init = init or {}
    self._act = layers.activation(activation)
    with self.name_scope:
      self.conv1 = layers.Conv2D(channels, channels, 3, 1, 'SAME', seeds,
                                 name='conv1', **init)
      self.conv2 = layers.Conv2D(channels, channels, 3, 1, 'SAME', seeds,
                                 name='conv2', **init)

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    y = self.conv1(self._act(x))
    y = self.conv2(self._act(y))
    return x + y


class _DeepSection(tf.Module):
  """3x3 conv stride 1, 3x3 max-pool stride 2 (SAME), two residual blocks."""

  def __init__(self, in_channels: int, channels: int, seeds: layers.SeedStream,
               name: Optional[str] = None, init: Optional[dict] = None,
               activation: str = 'relu'):
    super().__init__(name=name)
    init = init or {}
    with self.name_scope:
      self.conv = layers.Conv2D(in_channels, channels, 3, 1, 'SAME', seeds,
                                name='conv', **init)
      self.blocks = [_ResidualBlock(channels, seeds, name=f'residual_{k}', init=init,
                                    activation=activation)
                     for k in range(2)]

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, H, W, C]` to `[N, ceil(H/2), ceil(W/2), channels]`."""
    x = self.conv(x)
    x = tf.nn.max_pool2d(x, ksize=3, strides=2, padding='SAME')
    for block in self.blocks:
      x = block(x)
    return x


class DeepTorso(tf.Module):
  """IMPALA deep (ResNet) torso (paper Fig. 3, right).

  Three sections with 16, 32, 32 channels (see `_DeepSection`); ReLU; flatten;
  FC 256; ReLU (each ReLU `activation`). Input float32 `[N, H, W, C]` (or `[N, H, W]`); output float32
  `[N, 256]`. For 84x84: 84 -> 42 -> 21 -> 11, so the FC sees 11 * 11 * 32 = 3872
  inputs.
  """

  def __init__(self, input_shape: Sequence[int], seeds: layers.SeedStream,
               channels: Sequence[int] = (16, 32, 32), name: Optional[str] = None,
               weight_init: str = 'glorot', activation: str = 'relu'):
    super().__init__(name=name)
    init = _init(weight_init)
    self.activation = activation
    self._act = layers.activation(activation)
    self.input_shape = _image_shape(input_shape, 'deep')
    h, w, c = self.input_shape
    with self.name_scope:
      self.sections = []
      for k, ch in enumerate(channels):
        self.sections.append(_DeepSection(c, ch, seeds, name=f'section_{k}',
                                          init=init, activation=activation))
        c = ch
        h, w = -(-h // 2), -(-w // 2)
      self.flat_size = h * w * c
      self.fc = layers.Linear(self.flat_size, 256, seeds, name='fc', **init)
    self.output_size = 256

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, H, W, C]` to float32 `[N, 256]`."""
    x = tf.reshape(x, (-1,) + self.input_shape)
    for section in self.sections:
      x = section(x)
    x = tf.reshape(self._act(x), [-1, self.flat_size])
    return self._act(self.fc(x))
