"""Layers of the agent networks: Linear, Conv2D, an LSTM cell, and their seeds.

Everything here is built from `tf.Module`, `tf.Variable` and plain TF ops
(`tf.nn.conv2d`, `tf.matmul`); nothing depends on Keras. All variables are created
eagerly in the constructors (never lazily on the first call).

Initialization (deterministic given the seed of the `SeedStream`; stateless RNG,
so the values do not depend on TF's global seed or on how many ops ran before):

* `Linear` and `Conv2D` kernels, `init='glorot'` (the default): Glorot (Xavier)
  uniform, limit `scale * sqrt(6 / (fan_in + fan_out))` with
  `fan = kh * kw * channels` for convolutions. `init='orthogonal'` (the init of
  OpenAI Baselines, CleanRL and SB3): the kernel as a `[fan_in, out]` matrix
  (`[kh * kw * in_channels, out_channels]` for convolutions) with orthonormal
  columns (rows where out > fan_in), times `scale` (the gain: `RELU_GAIN` for a
  ReLU layer, 0.01 for policy logits). Biases zero either way.
* `LSTMCell`: input kernel Glorot uniform, recurrent kernel orthogonal, bias zero
  except the forget gate, which starts at 1.0 (a trainable bias initialised to the
  forget bias; the parameter count is that of a standard LSTM).

Shapes: layers map a flat batch `[N, ...]` (N is e.g. T * B of a time-major
sequence, see `impala_tf/types.py`); images are NHWC. Variables are float32;
`Linear` and `Conv2D` compute in their input's dtype (float32, or bfloat16 in a
torso built with `compute_dtype='bfloat16'`), the LSTM cell in float32.
"""

import math
import random
from typing import Optional, Sequence, Tuple

import tensorflow as tf

from impala_tf.config import TORSO_ACTIVATIONS  # ('relu', 'leaky_relu')
from impala_tf.config import WEIGHT_INITS  # ('glorot', 'orthogonal')
# Orthogonal init's gain for a layer followed by a ReLU (He et al., 2015).
RELU_GAIN = math.sqrt(2.0)
# Slope of `leaky_relu` below zero (tf.nn.leaky_relu's default, Maas et al., 2013).
LEAKY_RELU_SLOPE = 0.01


def check_activation(name: str) -> None:
  """ValueError naming torso_activation unless `name` is in `TORSO_ACTIVATIONS`."""
  if name not in TORSO_ACTIVATIONS:
    raise ValueError(f'torso_activation={name!r}: must be one of '
                     f'{", ".join(TORSO_ACTIVATIONS)}')


def activation(name: str):
  """The elementwise op `name` names: float32 tensor -> same shape and dtype.

  'relu': max(x, 0). 'leaky_relu': x where x > 0, else `LEAKY_RELU_SLOPE * x`
  (a unit whose input stays below zero still passes a gradient, so it can come
  back; a ReLU unit there is dead for good).
  """
  if negative_slope(name) == 0.0:
    return tf.nn.relu
  return lambda x: tf.nn.leaky_relu(x, alpha=LEAKY_RELU_SLOPE)


def negative_slope(name: str) -> float:
  """The slope of activation `name` below zero: 0.0 for 'relu'; ValueError else."""
  check_activation(name)
  return 0.0 if name == 'relu' else LEAKY_RELU_SLOPE


class SeedStream:
  """Hands out distinct stateless-RNG seeds, `[seed, counter]` int32 `[2]`."""

  def __init__(self, seed: Optional[int]):
    if seed is None:
      seed = random.SystemRandom().randrange(2**31)
    self._seed = int(seed)
    self._count = 0

  def __call__(self) -> tf.Tensor:
    self._count += 1
    return tf.constant([self._seed, self._count], dtype=tf.int32)


def _glorot_uniform(shape: Sequence[int], fan_in: int, fan_out: int,
                    seed: tf.Tensor, scale: float = 1.0) -> tf.Tensor:
  """Glorot-uniform float32 tensor of `shape`."""
  limit = scale * math.sqrt(6.0 / (fan_in + fan_out))
  return tf.random.stateless_uniform(
      shape, seed=seed, minval=-limit, maxval=limit, dtype=tf.float32)


def check_init(init: str) -> None:
  """ValueError naming weight_init unless `init` is one of `WEIGHT_INITS`."""
  if init not in WEIGHT_INITS:
    raise ValueError(f'weight_init={init!r}: must be one of {", ".join(WEIGHT_INITS)}')


def kernel_init(shape: Sequence[int], fan_in: int, fan_out: int, seed: tf.Tensor,
                init: str = 'glorot', scale: float = 1.0) -> tf.Tensor:
  """A float32 kernel of `shape` (`[fan_in, out]`, or `[kh, kw, in, out]`).

  Args:
    shape: the kernel's shape; its last dimension is the output size.
    fan_in: inputs per output unit (`kh * kw * in` for a convolution).
    fan_out: `kh * kw * out` for a convolution, `out` otherwise (Glorot only).
    seed: int32 `[2]` stateless seed.
    init: one of `WEIGHT_INITS` (the module docstring says what each draws).
    scale: Glorot's limit factor, or the orthogonal gain.

  Raises:
    ValueError: `init` is not one of `WEIGHT_INITS`.
  """
  check_init(init)
  if init == 'glorot':
    return _glorot_uniform(shape, fan_in, fan_out, seed, scale)
  matrix = _orthogonal((int(fan_in), int(shape[-1])), seed)
  return scale * tf.reshape(matrix, shape)


def _orthogonal(shape: Tuple[int, int], seed: tf.Tensor) -> tf.Tensor:
  """Orthogonal float32 matrix of 2-D `shape` (QR of a Gaussian, sign-fixed)."""
  rows, cols = shape
  a = tf.random.stateless_normal((max(rows, cols), min(rows, cols)), seed=seed)
  q, r = tf.linalg.qr(a)
  q *= tf.sign(tf.linalg.diag_part(r))[tf.newaxis, :]
  if rows < cols:
    q = tf.transpose(q)
  return q


class Linear(tf.Module):
  """Affine layer `y = x @ w + b`.

  Variables: `w` float32 `[input_size, output_size]` (`kernel_init` of `init`
  with scale `init_scale`), `b` float32 `[output_size]` (zeros).
  """

  def __init__(self, input_size: int, output_size: int, seeds: SeedStream,
               init_scale: float = 1.0, name: Optional[str] = None,
               init: str = 'glorot'):
    super().__init__(name=name)
    self.input_size = int(input_size)
    self.output_size = int(output_size)
    with self.name_scope:
      self.w = tf.Variable(
          kernel_init((self.input_size, self.output_size), self.input_size,
                      self.output_size, seeds(), init, init_scale), name='w')
      self.b = tf.Variable(tf.zeros([self.output_size]), name='b')

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps `[N, input_size]` to `[N, output_size]` in `x`'s dtype.

    float32, or bfloat16 in a bfloat16 torso: the variables stay float32 and are
    cast to `x`'s dtype for the product (a no-op for float32).
    """
    return tf.matmul(x, tf.cast(self.w, x.dtype)) + tf.cast(self.b, x.dtype)


class Conv2D(tf.Module):
  """2-D convolution on NHWC float32 tensors.

  Variables: `w` float32 `[kernel, kernel, in_channels, out_channels]`
  (`kernel_init` of `init` with scale `init_scale`), `b` float32 `[out_channels]`
  (zeros).
  """

  def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int,
               padding: str, seeds: SeedStream, name: Optional[str] = None,
               init: str = 'glorot', init_scale: float = 1.0):
    super().__init__(name=name)
    if padding not in ('SAME', 'VALID'):
      raise ValueError(f'padding={padding!r}: must be SAME or VALID')
    self.in_channels = int(in_channels)
    self.out_channels = int(out_channels)
    self.kernel = int(kernel)
    self.stride = int(stride)
    self.padding = padding
    k2 = self.kernel * self.kernel
    with self.name_scope:
      self.w = tf.Variable(
          kernel_init((self.kernel, self.kernel, self.in_channels,
                       self.out_channels), k2 * self.in_channels,
                      k2 * self.out_channels, seeds(), init, init_scale), name='w')
      self.b = tf.Variable(tf.zeros([self.out_channels]), name='b')

  def output_size(self, size: int) -> int:
    """Output height (or width) for an input height (or width) `size`."""
    if self.padding == 'SAME':
      return -(-size // self.stride)
    return (size - self.kernel) // self.stride + 1

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps `[N, H, W, in_channels]` to `[N, H', W', out_channels]`, `x`'s dtype.

    float32 or bfloat16, as `Linear`: the variables are cast to `x`'s dtype.
    """
    y = tf.nn.conv2d(x, tf.cast(self.w, x.dtype), strides=self.stride,
                     padding=self.padding)
    return tf.nn.bias_add(y, tf.cast(self.b, x.dtype))


class LSTMCell(tf.Module):
  """Standard LSTM cell with gates in the order i, f, g, o.

  `z = x @ w_x + h @ w_h + b`; `i, f, g, o = split(z, 4)`;
  `c' = sigmoid(f) * c + sigmoid(i) * tanh(g)`; `h' = sigmoid(o) * tanh(c')`.

  Variables: `w_x` float32 `[input_size, 4 * hidden_size]` (Glorot uniform),
  `w_h` float32 `[hidden_size, 4 * hidden_size]` (orthogonal per gate), `b` float32
  `[4 * hidden_size]` (zeros; the forget-gate slice starts at `forget_bias`).
  Parameters: `(input_size + hidden_size) * 4 * hidden_size + 4 * hidden_size`.

  The input projection is separate (`project_input`) so a sequence can be
  projected in one big matmul outside the time loop.
  """

  def __init__(self, input_size: int, hidden_size: int, seeds: SeedStream,
               forget_bias: float = 1.0, name: Optional[str] = None):
    super().__init__(name=name)
    self.input_size = int(input_size)
    self.hidden_size = int(hidden_size)
    hs = self.hidden_size
    with self.name_scope:
      self.w_x = tf.Variable(
          _glorot_uniform((self.input_size, 4 * hs), self.input_size, 4 * hs,
                          seeds()), name='w_x')
      self.w_h = tf.Variable(
          tf.concat([_orthogonal((hs, hs), seeds()) for _ in range(4)], axis=1),
          name='w_h')
      self.b = tf.Variable(
          tf.concat([tf.zeros([hs]), tf.fill([hs], float(forget_bias)),
                     tf.zeros([2 * hs])], axis=0), name='b')

  def initial_state(self, batch_size) -> Tuple[tf.Tensor, tf.Tensor]:
    """Returns `(h, c)`, float32 zeros `[batch_size, hidden_size]` each."""
    zeros = tf.zeros([batch_size, self.hidden_size], tf.float32)
    return (zeros, zeros)

  def project_input(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, input_size]` to the input part of the gates `[N, 4H]`."""
    return tf.matmul(x, self.w_x) + self.b

  def step_projected(self, x_proj: tf.Tensor, state):
    """One step from projected input.

    Args:
      x_proj: float32 `[B, 4 * hidden_size]`, `project_input` of the input.
      state: `(h, c)`, float32 `[B, hidden_size]` each.

    Returns:
      `(h', (h', c'))`, float32 `[B, hidden_size]` each.
    """
    h, c = state
    z = x_proj + tf.matmul(h, self.w_h)
    i, f, g, o = tf.split(z, 4, axis=-1)
    c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
    h = tf.sigmoid(o) * tf.tanh(c)
    return h, (h, c)

  def __call__(self, x: tf.Tensor, state):
    """One step: float32 `x [B, input_size]`, `state (h, c)` -> `(h', (h', c'))`."""
    return self.step_projected(self.project_input(x), state)
