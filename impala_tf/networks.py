"""Agent networks: MLP, IMPALA shallow and deep (ResNet) torsos, LSTM core, heads.

Everything here is built from `tf.Module`, `tf.Variable` and plain TF ops
(`tf.nn.conv2d`, `tf.nn.max_pool2d`, `tf.matmul`); nothing depends on Keras, so
the module works with Keras 3, with tf-keras and with `TF_USE_LEGACY_KERAS=1`.

Conventions (see `impala_tf/types.py`): sequences are time-major `[T, B, ...]`;
images are NHWC; observations keep the environment's dtype (uint8 pixels are
converted to float32 and divided by 255 inside the network); `prev_action` is
int32, `reward` float32, `first` bool.

All variables are created eagerly in the constructors (never lazily on the first
call), so a network built under `strategy.scope()` can be checkpoint-restored
before it is ever called.

Initialization (deterministic given `seed`; stateless RNG, so the values do not
depend on TF's global seed or on how many ops ran before):

* `Linear` and `Conv2D` kernels: Glorot (Xavier) uniform, limit
  `scale * sqrt(6 / (fan_in + fan_out))` with `fan = kh * kw * channels` for
  convolutions; biases zero. The policy-logits head uses `scale=0.01`, so the
  initial policy is close to uniform (maximum entropy); all other layers use 1.
* `LSTMCell`: input kernel Glorot uniform, recurrent kernel orthogonal, bias zero
  except the forget gate, which starts at 1.0 (a trainable bias initialised to the
  forget bias; the parameter count is that of a standard LSTM).

Parameter counts for an 84x84x4 input, 6 actions (worked out in
`tests/networks_test.py`): shallow 677,943; deep 1,091,031; an LSTM 256 core adds
532,480 (input 256 + 6 + 1 = 263: (263 + 256) * 1024 + 1024).
"""

import importlib
import math
import random
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import types

# With an LSTM core and a statically known unroll length T <= this, `unroll` runs the
# core with a Python loop (an unrolled graph inside tf.function); otherwise with
# tf.scan (a while loop). See `AgentNetwork.unroll`.
MAX_STATIC_UNROLL = 128

TORSOS = ('mlp', 'shallow', 'deep')


class _SeedStream:
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

  Variables: `w` float32 `[input_size, output_size]` (Glorot uniform times
  `init_scale`), `b` float32 `[output_size]` (zeros).
  """

  def __init__(self, input_size: int, output_size: int, seeds: _SeedStream,
               init_scale: float = 1.0, name: Optional[str] = None):
    super().__init__(name=name)
    self.input_size = int(input_size)
    self.output_size = int(output_size)
    with self.name_scope:
      self.w = tf.Variable(
          _glorot_uniform((self.input_size, self.output_size), self.input_size,
                          self.output_size, seeds(), init_scale), name='w')
      self.b = tf.Variable(tf.zeros([self.output_size]), name='b')

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, input_size]` to float32 `[N, output_size]`."""
    return tf.matmul(x, self.w) + self.b


class Conv2D(tf.Module):
  """2-D convolution on NHWC float32 tensors.

  Variables: `w` float32 `[kernel, kernel, in_channels, out_channels]` (Glorot
  uniform), `b` float32 `[out_channels]` (zeros).
  """

  def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int,
               padding: str, seeds: _SeedStream, name: Optional[str] = None):
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
          _glorot_uniform((self.kernel, self.kernel, self.in_channels,
                           self.out_channels), k2 * self.in_channels,
                          k2 * self.out_channels, seeds()), name='w')
      self.b = tf.Variable(tf.zeros([self.out_channels]), name='b')

  def output_size(self, size: int) -> int:
    """Output height (or width) for an input height (or width) `size`."""
    if self.padding == 'SAME':
      return -(-size // self.stride)
    return (size - self.kernel) // self.stride + 1

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, H, W, in_channels]` to `[N, H', W', out_channels]`."""
    y = tf.nn.conv2d(x, self.w, strides=self.stride, padding=self.padding)
    return tf.nn.bias_add(y, self.b)


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

  def __init__(self, input_size: int, hidden_size: int, seeds: _SeedStream,
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


class MLP(tf.Module):
  """Flatten, then fully connected ReLU layers.

  Input float32 `[N, *input_shape]`; output float32 `[N, hidden_sizes[-1]]`.
  """

  def __init__(self, input_shape: Sequence[int], hidden_sizes: Sequence[int],
               seeds: _SeedStream, name: Optional[str] = None):
    super().__init__(name=name)
    hidden_sizes = tuple(int(h) for h in hidden_sizes)
    if not hidden_sizes or min(hidden_sizes) < 1:
      raise ValueError(f'mlp_hidden_sizes={hidden_sizes}: must be one or more '
                       'integers >= 1')
    self.input_size = math.prod(input_shape)
    sizes = (self.input_size,) + hidden_sizes
    with self.name_scope:
      self.layers = [
          Linear(n_in, n_out, seeds, name=f'linear_{k}')
          for k, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]))
      ]
    self.output_size = sizes[-1]

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, *input_shape]` to float32 `[N, output_size]`."""
    x = tf.reshape(x, [-1, self.input_size])
    for layer in self.layers:
      x = tf.nn.relu(layer(x))
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
  FC 256, ReLU. Input float32 `[N, H, W, C]` (or `[N, H, W]`); output float32
  `[N, 256]`. For 84x84: 84 -> 20 -> 9, so the FC sees 9 * 9 * 32 = 2592 inputs.
  """

  def __init__(self, input_shape: Sequence[int], seeds: _SeedStream,
               name: Optional[str] = None):
    super().__init__(name=name)
    self.input_shape = _image_shape(input_shape, 'shallow')
    h, w, c = self.input_shape
    with self.name_scope:
      self.conv1 = Conv2D(c, 16, 8, 4, 'VALID', seeds, name='conv1')
      self.conv2 = Conv2D(16, 32, 4, 2, 'VALID', seeds, name='conv2')
      for conv in (self.conv1, self.conv2):
        h, w = conv.output_size(h), conv.output_size(w)
      if h < 1 or w < 1:
        raise ValueError(
            f'network=shallow: observation shape {list(input_shape)} is too small '
            'for its 8x8/4 and 4x4/2 VALID convolutions (needs H, W >= 20)')
      self.flat_size = h * w * 32
      self.fc = Linear(self.flat_size, 256, seeds, name='fc')
    self.output_size = 256

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, H, W, C]` to float32 `[N, 256]`."""
    x = tf.reshape(x, (-1,) + self.input_shape)
    x = tf.nn.relu(self.conv1(x))
    x = tf.nn.relu(self.conv2(x))
    x = tf.reshape(x, [-1, self.flat_size])
    return tf.nn.relu(self.fc(x))


class _ResidualBlock(tf.Module):
  """`x + conv(relu(conv(relu(x))))` with 3x3 SAME convs, `[N, H, W, C]` float32."""

  def __init__(self, channels: int, seeds: _SeedStream, name: Optional[str] = None):
    super().__init__(name=name)
    with self.name_scope:
      self.conv1 = Conv2D(channels, channels, 3, 1, 'SAME', seeds, name='conv1')
      self.conv2 = Conv2D(channels, channels, 3, 1, 'SAME', seeds, name='conv2')

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    y = self.conv1(tf.nn.relu(x))
    y = self.conv2(tf.nn.relu(y))
    return x + y


class _DeepSection(tf.Module):
  """3x3 conv stride 1, 3x3 max-pool stride 2 (SAME), two residual blocks."""

  def __init__(self, in_channels: int, channels: int, seeds: _SeedStream,
               name: Optional[str] = None):
    super().__init__(name=name)
    with self.name_scope:
      self.conv = Conv2D(in_channels, channels, 3, 1, 'SAME', seeds, name='conv')
      self.blocks = [_ResidualBlock(channels, seeds, name=f'residual_{k}')
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
  FC 256; ReLU. Input float32 `[N, H, W, C]` (or `[N, H, W]`); output float32
  `[N, 256]`. For 84x84: 84 -> 42 -> 21 -> 11, so the FC sees 11 * 11 * 32 = 3872
  inputs.
  """

  def __init__(self, input_shape: Sequence[int], seeds: _SeedStream,
               channels: Sequence[int] = (16, 32, 32), name: Optional[str] = None):
    super().__init__(name=name)
    self.input_shape = _image_shape(input_shape, 'deep')
    h, w, c = self.input_shape
    with self.name_scope:
      self.sections = []
      for k, ch in enumerate(channels):
        self.sections.append(_DeepSection(c, ch, seeds, name=f'section_{k}'))
        c = ch
        h, w = -(-h // 2), -(-w // 2)
      self.flat_size = h * w * c
      self.fc = Linear(self.flat_size, 256, seeds, name='fc')
    self.output_size = 256

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, H, W, C]` to float32 `[N, 256]`."""
    x = tf.reshape(x, (-1,) + self.input_shape)
    for section in self.sections:
      x = section(x)
    x = tf.reshape(tf.nn.relu(x), [-1, self.flat_size])
    return tf.nn.relu(self.fc(x))

# --- the user's own torso (--network=MODULE:FUNCTION) -------------------------


def _user_network_error(spec: str, what: str) -> config_lib.ConfigError:
  """A one-line ConfigError for field `network` (the CLI prints `--network=...`)."""
  return config_lib.ConfigError('network', spec, ' '.join(str(what).split()))


def _describe(e: Exception, limit: int = 300) -> str:
  """`Type: message` of an exception, on one line, at most `limit` characters."""
  text = ' '.join(f'{type(e).__name__}: {e}'.split())
  return text if len(text) <= limit else text[:limit] + '...'


def resolve_torso_fn(spec: str) -> Callable:
  """Imports `MODULE` and returns its `FUNCTION` for `spec` = 'MODULE:FUNCTION'.

  Cheap (an import; no TensorFlow op runs), so entry points call it while they
  validate flags, before any device is configured.

  Raises:
    ConfigError: naming `network` when the module cannot be imported (or fails
      while importing) or has no callable of that name.
  """
  if not config_lib.is_user_network(spec):
    raise _user_network_error(spec, config_lib.NETWORK_ALLOWED)
  module_name, fn_name = spec.split(':')
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise _user_network_error(
        spec, f'cannot import module {module_name!r} ({_describe(e)}); MODULE must '
        'be importable from sys.path (the current directory or PYTHONPATH)') from None
  except Exception as e:  # pylint: disable=broad-except
    raise _user_network_error(
        spec, f'importing module {module_name!r} failed: {_describe(e)}') from None
  fn = getattr(module, fn_name, None)
  if fn is None:
    raise _user_network_error(
        spec, f'module {module_name!r} ({getattr(module, "__file__", "?")}) has no '
        f'function {fn_name!r}')
  if not callable(fn):
    raise _user_network_error(
        spec, f'{module_name}.{fn_name} is not callable (type {type(fn).__name__}); '
        'it must be a function '
        'FUNCTION(observation_space, action_space) returning a torso')
  return fn


class _Untracked:
  """Holds objects out of sight of tf.Module and checkpoint tracking."""

  def __init__(self, **items):
    self.__dict__.update(items)


class UserTorso(tf.Module):
  """The torso `FUNCTION(observation_space, action_space)` builds, as a tf.Module.

  `FUNCTION` returns a Keras 3 model or layer, a tf-keras one (with
  `TF_USE_LEGACY_KERAS=1`), a tf.Module or any callable that maps float32
  `[N, *observation_shape]` (uint8 images already scaled to [0, 1]) to float32
  `[N, F]`. Both `FUNCTION` and a first call on a zero batch run here, inside a
  variable-creator scope that records every variable they create; those
  variables (plain or mirrored `tf.Variable`s, also the ones under Keras 3's
  `keras.Variable`s) become `torso_variables`, in creation order, except
  trainable variables of a non-float dtype, which nothing can train (tf-keras
  models' batch counters): those are neither trained nor checkpointed. So the
  variables exist before a checkpoint restore or an optimizer build, tf.Module's
  `variables` / `trainable_variables` and tf.train.Checkpoint see them whatever
  the framework, and the Keras object itself is not tracked (a SavedModel of the
  network loads with TensorFlow alone). `FUNCTION` must build a new torso at
  each call: impala_tf builds one for the learner, one per actor and one per
  export.

  Attributes:
    spec: 'MODULE:FUNCTION'.
    output_size: F.
    torso_variables: list of the torso's tf.Variables.
    spaces: `(observation_space, action_space)` it was built for.
    module: the object FUNCTION returned.

  Raises:
    ConfigError: naming `network` (one line) when FUNCTION cannot be imported,
      raises, returns something that is not callable, reuses variables that
      existed before the call, or whose output is not float `[N, F]`.
  """

  def __init__(self, spec: str, observation_space, action_space,
               observation_shape: Sequence[int], name: Optional[str] = None):
    super().__init__(name=name)
    fn = resolve_torso_fn(spec)
    self.spec = spec
    shape = tuple(int(d) for d in observation_shape)
    created = []

    def record(next_creator, **kwargs):
      v = next_creator(**kwargs)
      created.append(v)
      return v

    call = f'{spec.replace(":", ".")}(observation_space, action_space)'
    probe_batch = 2
    with tf.variable_creator_scope(record):
      try:
        torso = fn(observation_space, action_space)
      except Exception as e:  # pylint: disable=broad-except
        raise _user_network_error(
            spec, f'{call} raised {_describe(e)}') from None
      if not callable(torso):
        raise _user_network_error(
            spec, f'{call} returned {type(torso).__name__}, not a torso: return a '
            'Keras model or layer, a tf.Module or a callable mapping float32 '
            f'[B, {", ".join(map(str, shape))}] to [B, F]')
      try:
        out = torso(tf.zeros((probe_batch,) + shape, tf.float32))
        out = tf.convert_to_tensor(out)
      except Exception as e:  # pylint: disable=broad-except
        raise _user_network_error(
            spec, f'the torso of {call} failed on a float32 batch of shape '
            f'{[probe_batch, *shape]}: {_describe(e)}') from None
    if out.shape.rank != 2 or out.shape[0] != probe_batch or not out.shape[1]:
      raise _user_network_error(
          spec, f'the torso of {call} maps float32 {[probe_batch, *shape]} to '
          f'shape {out.shape.as_list() if out.shape.rank is not None else "?"} '
          f'(rank {out.shape.rank}); it must return features [B, F] of rank 2 with '
          'a known F >= 1 (flatten or pool the rest)')
    if not out.dtype.is_floating:
      raise _user_network_error(
          spec, f'the torso of {call} returns {out.dtype.name}; it must return '
          'floating-point features [B, F]')
    unique, untrained, seen = [], [], set()
    for v in created:
      if id(v) not in seen:
        seen.add(id(v))
        # A "trainable" integer variable cannot be trained: e.g. tf-keras models'
        # batch counters. They stay out of the network's variables.
        (untrained if v.trainable and not v.dtype.is_floating else unique).append(v)
    existing = getattr(torso, 'variables', None)
    try:
      num_existing = len(existing() if callable(existing) else existing or ())
    except TypeError:
      num_existing = 0
    if num_existing > len(unique) + len(untrained):
      raise _user_network_error(
          spec, f'{call} returned a torso whose variables existed before the call '
          f'({num_existing} variables, {len(unique)} created by it); FUNCTION must '
          'build a new torso at each call (impala_tf builds one for the learner '
          'and one per actor)')
    self.torso_variables = unique
    self.output_size = int(out.shape[1])
    self._held = _Untracked(module=torso, spaces=(observation_space, action_space),
                            untrained=untrained)

  @property
  def module(self):
    return self._held.module

  @property
  def spaces(self):
    return self._held.spaces

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, *observation_shape]` to float32 `[N, output_size]`."""
    return tf.cast(self._held.module(x), tf.float32)


class PopArt(tf.Module):
  """PopArt's running statistics of the value targets, one set per task.

  The value head predicts a normalised value `n(x)`; in return units the value is
  `V(x) = sigma * n(x) + mu`, with `sigma` the spread `sqrt(nu - mu**2)` of the
  statistics, kept at least `sigma_floor` times the largest spread so far (`peak`)
  and within `[SIGMA_MIN, SIGMA_MAX]`. The learner moves `mu` and `nu` towards the
  moments of each batch's V-trace targets (`updated`) and rescales the head's last
  layer so that `V(x)` is unchanged (`preserve`); docs/design.md has the math. The
  moments are debiased like Adam's: the k-th update (k = 1, 2, ...) uses the step
  size `beta / (1 - (1 - beta)**k)`, so the first batch sets them outright and the
  initial `mu = 0, nu = 1` leaves no trace.

  The floor is for targets that come to be all alike, e.g. every episode reaching
  a time limit: their spread, and with it sigma, would shrink towards 0 and scale
  the value errors (and the value head's weights) up by 1/sigma until the value
  term swamps the step. Relative to the peak spread, it depends on neither the
  scale nor the shift of the returns: returns `k * G + c` give `k` times the
  sigma of `G` (a floor relative to `|mu|` moved with `c`). `mu` and `nu` are
  float64: in float32, `nu - mu**2` loses the spread of targets near 1e5.

  Variables (non-trainable, checkpointed with the network): `mu` float64
  `[num_tasks]`, `nu` float64 `[num_tasks]`, `peak` float64 `[num_tasks]` (the
  largest spread after any update; 0 before the first), `updates` float32 `[]`
  (the number of updates so far, for the debiasing). Training uses one task
  (index 0); the leading task axis keeps per-task statistics possible.
  """

  SIGMA_MIN = 1e-4
  SIGMA_MAX = 1e6

  def __init__(self, num_tasks: int = 1, sigma_floor: float = 0.0,
               name: Optional[str] = None):
    super().__init__(name=name)
    self.num_tasks = int(num_tasks)
    self.sigma_floor = float(sigma_floor)
    with self.name_scope:
      self.mu = tf.Variable(tf.zeros([self.num_tasks], tf.float64), trainable=False,
                            name='mu')
      self.nu = tf.Variable(tf.ones([self.num_tasks], tf.float64), trainable=False,
                            name='nu')
      self.updates = tf.Variable(0.0, trainable=False, name='updates')
      self.peak = tf.Variable(tf.zeros([self.num_tasks], tf.float64),
                              trainable=False, name='sigma_peak')

  @staticmethod
  def spread_of(mu: tf.Tensor, nu: tf.Tensor) -> tf.Tensor:
    """`sqrt(max(nu - mu**2, 0))`, float64 (the shape of `mu`)."""
    return tf.sqrt(tf.maximum(nu - tf.square(mu), 0.0))

  def sigma_of(self, mu: tf.Tensor, nu: tf.Tensor,
               peak: Optional[tf.Tensor] = None) -> tf.Tensor:
    """sigma (float64, the shape of `mu`) of the statistics `mu`, `nu` (float64).

    Args:
      mu, nu: float64 `[num_tasks]`.
      peak: float64 `[num_tasks]`, the largest spread so far; None reads `peak`.

    Returns:
      `clip(max(spread, sigma_floor * max(peak, spread)), SIGMA_MIN, SIGMA_MAX)`.
    """
    spread = self.spread_of(mu, nu)
    peak = self.peak if peak is None else peak
    sigma = tf.maximum(spread, self.sigma_floor * tf.maximum(
        tf.cast(peak, tf.float64), spread))
    return tf.clip_by_value(sigma, self.SIGMA_MIN, self.SIGMA_MAX)

  @property
  def sigma(self) -> tf.Tensor:
    """float32 `[num_tasks]`."""
    return tf.cast(self.sigma_of(self.mu, self.nu), tf.float32)

  @property
  def mean(self) -> tf.Tensor:
    """mu as float32 `[num_tasks]`."""
    return tf.cast(self.mu, tf.float32)

  def updated(self, mean: tf.Tensor, mean_sq: tf.Tensor, beta: float):
    """The statistics after one update with a batch's target moments.

    Args:
      mean: float64 `[num_tasks]`, the batch mean of the V-trace targets.
      mean_sq: float64 `[num_tasks]`, the batch mean of their squares.
      beta: the step size (`popart_beta`).

    Returns:
      `(mu, nu, updates, peak)`: the new values of the variables (float64,
      float64, float32, float64; nothing is assigned).
    """
    updates = self.updates + 1.0
    step = tf.cast(beta / (1.0 - tf.pow(1.0 - beta, updates)), tf.float64)
    mu = (1.0 - step) * self.mu + step * tf.cast(mean, tf.float64)
    nu = (1.0 - step) * self.nu + step * tf.cast(mean_sq, tf.float64)
    peak = tf.maximum(self.peak, self.spread_of(mu, nu))
    return mu, nu, updates, peak

  @staticmethod
  def preserve(w: tf.Tensor, b: tf.Tensor, mu: tf.Tensor, sigma: tf.Tensor,
               new_mu: tf.Tensor, new_sigma: tf.Tensor):
    """The value head's last layer rescaled so `sigma * n(x) + mu` is unchanged.

    Args:
      w: float32 `[F, num_tasks]`, b: float32 `[num_tasks]`: the layer.
      mu, sigma, new_mu, new_sigma: `[num_tasks]` (any float dtype), old and new
        statistics.

    Returns:
      `(w', b')` (float32) with `w' = sigma / sigma' * w`, `b' = (sigma * b + mu -
      mu') / sigma'`, computed in float64.
    """
    f64 = lambda x: tf.cast(x, tf.float64)
    mu, sigma, new_mu, new_sigma = map(f64, (mu, sigma, new_mu, new_sigma))
    w_new = f64(w) * (sigma / new_sigma)
    b_new = (sigma * f64(b) + mu - new_mu) / new_sigma
    return tf.cast(w_new, tf.float32), tf.cast(b_new, tf.float32)


class AgentNetwork(tf.Module):
  """Actor-critic network: torso, optional LSTM core, policy and baseline heads.

  Attributes:
    observation_shape: tuple of int, one observation's shape.
    observation_dtype: tf.DType of observations (uint8 is scaled by 1/255).
    num_actions: int, A.
    use_lstm: bool.
    lstm_size: int, H (meaningful with `use_lstm`).
    torso_name: 'mlp', 'shallow', 'deep' or the user's 'MODULE:FUNCTION'.
    torso, core (LSTMCell or None), policy_head, baseline_head: the sub-modules
      (`torso` is a `UserTorso` for 'MODULE:FUNCTION').

  With an LSTM, the core input is `concat(torso_out, one_hot(prev_action, A),
  clip(reward, -1, 1))` and its state `(h, c)` (float32 `[B, H]` each) is reset to
  zeros at steps where `first` is True, before that step is processed. Without an
  LSTM, `prev_action`, `reward` and `first` are ignored and the state is `()`.
  """

  def __init__(self, observation_shape: Sequence[int], observation_dtype,
               num_actions: int, torso: str = 'mlp',
               mlp_hidden_sizes: Sequence[int] = (64, 64), use_lstm: bool = False,
               lstm_size: int = 256, seed: Optional[int] = None,
               name: str = 'agent', spaces: Optional[tuple] = None,
               popart: bool = False, shared_torso: bool = True,
               popart_sigma_floor: float = 0.0):
    """Builds the network and creates all its variables.

    Args:
      observation_shape: shape of one observation, e.g. `(4,)` or `(84, 84, 4)`.
      observation_dtype: dtype of observations (tf or numpy dtype, or name).
      num_actions: int >= 1, number of discrete actions A.
      torso: 'mlp' (any observation rank; flattened), 'shallow' or 'deep'
        (images `[H, W, C]` or `[H, W]`), or 'MODULE:FUNCTION', the user's torso
        (`UserTorso`; needs `spaces`).
      mlp_hidden_sizes: hidden layer sizes of the MLP torso.
      use_lstm: whether to add the LSTM core.
      lstm_size: LSTM hidden size H.
      seed: int seed for the initial weights; None for a random one.
      name: module name (variable-name prefix).
      spaces: `(observation_space, action_space)` passed to the user's FUNCTION.
      popart: whether the baseline head is PopArt-normalised (`popart` holds the
        statistics; `baseline` outputs stay in return units).
      popart_sigma_floor: `PopArt.sigma_floor` (sigma >= this times the largest
        spread so far).
      shared_torso: False gives the baseline head its own MLP torso
        (`value_torso`, same `mlp_hidden_sizes`); 'mlp' without LSTM only.

    Raises:
      ValueError: naming `network` for a torso that does not fit the observations
        (a ConfigError for a user torso).
    """
    super().__init__(name=name)
    user = config_lib.is_user_network(torso)
    if torso not in TORSOS and not user:
      raise ValueError(f'network={torso}: must be one of {", ".join(TORSOS)} or '
                       'MODULE:FUNCTION')
    if user and spaces is None:
      raise ValueError(f'network={torso}: a user torso needs spaces=(observation_'
                       'space, action_space) for its FUNCTION')
    if int(num_actions) < 1:
      raise ValueError(f'num_actions={num_actions}: must be >= 1')
    if not shared_torso and (torso != 'mlp' or use_lstm):
      raise ValueError(f'shared_torso=False: needs the mlp torso without an LSTM, '
                       f'got network={torso} use_lstm={use_lstm}')
    self.observation_shape = tuple(int(d) for d in observation_shape)
    self.observation_dtype = tf.as_dtype(observation_dtype)
    self.num_actions = int(num_actions)
    self.use_lstm = bool(use_lstm)
    self.lstm_size = int(lstm_size)
    self.torso_name = torso
    seeds = _SeedStream(seed)
    with self.name_scope:
      if user:
        self.torso = UserTorso(torso, spaces[0], spaces[1], self.observation_shape,
                               name='user_torso')
      elif torso == 'mlp':
        self.torso = MLP(self.observation_shape, mlp_hidden_sizes, seeds, name='mlp')
      elif torso == 'shallow':
        self.torso = ShallowTorso(self.observation_shape, seeds, name='shallow')
      else:
        self.torso = DeepTorso(self.observation_shape, seeds, name='deep')
      out_size = self.torso.output_size
      if self.use_lstm:
        self.core = LSTMCell(out_size + self.num_actions + 1, self.lstm_size, seeds,
                             name='lstm')
        out_size = self.lstm_size
      else:
        self.core = None
      self.policy_head = Linear(out_size, self.num_actions, seeds, init_scale=0.01,
                                name='policy_logits')
      self.value_torso = None
      if not shared_torso:
        self.value_torso = MLP(self.observation_shape, mlp_hidden_sizes, seeds,
                               name='value_mlp')
      self.baseline_head = Linear(
          self.value_torso.output_size if self.value_torso else out_size, 1, seeds,
          name='baseline')
      self.popart = (PopArt(1, popart_sigma_floor, name='popart') if popart
                     else None)

  # --- helpers -------------------------------------------------------------

  def initial_state(self, batch_size) -> tuple:
    """Returns the core state for `batch_size` (int or int32 scalar tensor).

    `(h, c)` float32 zeros `[batch_size, lstm_size]` each, or `()` without an LSTM.
    """
    if not self.use_lstm:
      return ()
    return self.core.initial_state(batch_size)

  def _check_observation(self, observation: tf.Tensor, lead_dims: int):
    obs_shape = tuple(observation.shape[lead_dims:])
    if observation.shape.rank is not None and (
        len(obs_shape) != len(self.observation_shape) or
        any(a is not None and a != b
            for a, b in zip(obs_shape, self.observation_shape))):
      raise ValueError(
          f'observation shape {observation.shape.as_list()}: expected '
          f'{lead_dims} leading dims then {list(self.observation_shape)}')

  def _embed(self, observation: tf.Tensor):
    """`[N, *observation_shape]` (any dtype) -> (torso float32 `[N, F]`, value
    torso float32 `[N, F_v]` or None when the torso is shared)."""
    if observation.dtype == tf.uint8:
      x = tf.cast(observation, tf.float32) / 255.0
    else:
      x = tf.cast(observation, tf.float32)
    return self.torso(x), (self.value_torso(x) if self.value_torso else None)

  def _core_input(self, torso_out, prev_action, reward) -> tf.Tensor:
    """float32 `[N, F]`, int32 `[N]`, float32 `[N]` -> float32 `[N, F + A + 1]`."""
    one_hot = tf.one_hot(tf.cast(prev_action, tf.int32), self.num_actions,
                         dtype=tf.float32)
    clipped = tf.clip_by_value(tf.cast(reward, tf.float32), -1.0, 1.0)
    return tf.concat([torso_out, one_hot, clipped[:, tf.newaxis]], axis=-1)

  def _heads(self, x: tf.Tensor, value_x: Optional[tf.Tensor] = None
             ) -> types.AgentOutput:
    """float32 `[N, F]` (and the value torso's `[N, F_v]`, if separate) ->
    AgentOutput(`[N, A]`, `[N]`), the baseline in return units."""
    value = self.baseline_head(x if value_x is None else value_x)  # [N, 1]
    if self.popart is not None:
      value = value * self.popart.sigma + self.popart.mean
    return types.AgentOutput(
        policy_logits=self.policy_head(x),
        baseline=tf.squeeze(value, axis=-1))

  # --- public API ----------------------------------------------------------

  def step(self, inputs: types.AgentInput, state=None):
    """One step for a batch.

    Args:
      inputs: AgentInput with `observation [B, *observation_shape]` (env dtype),
        `prev_action` int32 `[B]`, `reward` float32 `[B]`, `first` bool `[B]`.
      state: `initial_state(B)`-like: `(h, c)` float32 `[B, lstm_size]`, or `()`;
        None means `initial_state(B)`.

    Returns:
      `(AgentOutput(policy_logits float32 [B, A], baseline float32 [B]),
      new_state)`; `new_state` has the structure of `state`.
    """
    observation = tf.convert_to_tensor(inputs.observation)
    self._check_observation(observation, 1)
    x, value_x = self._embed(observation)
    if not self.use_lstm:
      return self._heads(x, value_x), ()
    x = self._core_input(x, inputs.prev_action, inputs.reward)
    keep = 1.0 - tf.cast(inputs.first, tf.float32)[:, tf.newaxis]
    h, c = state if state else self.initial_state(tf.shape(observation)[0])
    out, new_state = self.core(x, (h * keep, c * keep))
    return self._heads(out), new_state

  def unroll(self, inputs: types.AgentInput, state=None):
    """Runs the network over a time-major sequence.

    The torso (and the LSTM's input projection) run once, batched over all T * B
    observations. Without an LSTM there is no time loop at all. With an LSTM the
    recurrence runs over time: as a Python loop when T is static and
    <= MAX_STATIC_UNROLL (inside tf.function this unrolls the graph: no while-loop
    overhead per step, no TensorArrays in the gradient, and it is the faster
    choice for IMPALA's short unrolls of ~20-100 steps), else with tf.scan (works
    for an unknown T, e.g. an input_signature with `None` time, and keeps the graph
    small for long sequences). Both give the same result as repeated `step`.

    Args:
      inputs: AgentInput with `observation [T, B, *observation_shape]` (env dtype),
        `prev_action` int32 `[T, B]`, `reward` float32 `[T, B]`, `first` bool
        `[T, B]`.
      state: the core state before step 0: `(h, c)` float32 `[B, lstm_size]`, or
        `()`; None means `initial_state(B)`.

    Returns:
      `(AgentOutput(policy_logits float32 [T, B, A], baseline float32 [T, B]),
      final_state)`; `final_state` is the state after step T - 1.
    """
    observation = tf.convert_to_tensor(inputs.observation)
    self._check_observation(observation, 2)
    lead = tf.shape(observation)[:2]
    flat_obs = tf.reshape(observation, tf.concat(
        [[-1], tf.constant(self.observation_shape, tf.int32)], axis=0))
    x, value_x = self._embed(flat_obs)  # [T * B, F], [T * B, F_v] or None

    def unflatten(t, trailing):
      return tf.reshape(t, tf.concat([lead, trailing], axis=0))

    if not self.use_lstm:
      out = self._heads(x, value_x)
      return types.AgentOutput(
          policy_logits=unflatten(out.policy_logits, [self.num_actions]),
          baseline=unflatten(out.baseline, tf.zeros([0], tf.int32))), ()

    x = self._core_input(x, tf.reshape(inputs.prev_action, [-1]),
                         tf.reshape(inputs.reward, [-1]))
    x_proj = unflatten(self.core.project_input(x), [4 * self.lstm_size])
    keep = 1.0 - tf.cast(inputs.first, tf.float32)[..., tf.newaxis]  # [T, B, 1]
    h, c = state if state else self.initial_state(lead[1])
    num_steps = observation.shape[0]
    if num_steps is not None and num_steps <= MAX_STATIC_UNROLL:
      outputs = []
      for t in range(num_steps):
        out, (h, c) = self.core.step_projected(x_proj[t], (h * keep[t], c * keep[t]))
        outputs.append(out)
      hs = tf.stack(outputs) if outputs else tf.zeros(
          tf.concat([lead, [self.lstm_size]], axis=0))
      final_state = (h, c)
    else:
      def scan_fn(carry, elems):
        xp, k = elems
        _, new_carry = self.core.step_projected(xp, (carry[0] * k, carry[1] * k))
        return new_carry

      hs, cs = tf.scan(scan_fn, (x_proj, keep), initializer=(h, c))
      final_state = (hs[-1], cs[-1])
    out = self._heads(tf.reshape(hs, [-1, self.lstm_size]))
    return types.AgentOutput(
        policy_logits=unflatten(out.policy_logits, [self.num_actions]),
        baseline=unflatten(out.baseline, tf.zeros([0], tf.int32))), final_state


def _space_name(space) -> str:
  return repr(space)


def make_network(config, observation_space, action_space) -> AgentNetwork:
  """Builds the AgentNetwork a Config asks for.

  `config.network == 'auto'` picks 'mlp' for rank-1 observations and 'deep' for
  images (rank 2 `[H, W]` or rank 3 `[H, W, C]`). 'shallow'/'deep' with vector
  observations is an error. 'mlp' with images is allowed: the image is flattened
  (useful for tiny pixel test envs; for Atari-sized inputs use shallow or deep).
  'MODULE:FUNCTION' builds the user's torso (`UserTorso`) with the same heads and
  LSTM core as the built-in torsos.

  Spaces are duck-typed (gymnasium is not imported): the observation space needs
  `.shape` and `.dtype` (a Box), the action space must be a gymnasium Discrete
  (`.n`, start 0).

  Args:
    config: an `impala_tf.config.Config` (network, mlp_hidden_sizes, use_lstm,
      lstm_size, seed are read).
    observation_space: the env's single observation space (a Box).
    action_space: the env's single action space (Discrete(n)).

  Returns:
    An AgentNetwork with all variables created.

  Raises:
    ValueError: naming `network` when the torso does not fit the observations, or
      naming the action/observation space when it is not supported; a
      `ConfigError` (one line, field `network`) for a user torso that cannot be
      imported or does not map `[B, *obs_shape]` to `[B, F]`.
  """
  if (type(action_space).__name__ != 'Discrete' or
      not hasattr(action_space, 'n')):
    raise ValueError(
        f'action space {_space_name(action_space)} of env {config.env!r} is not '
        'supported: IMPALA here needs a gymnasium Discrete action space')
  if int(getattr(action_space, 'start', 0)) != 0:
    raise ValueError(
        f'action space {_space_name(action_space)} of env {config.env!r} is not '
        'supported: Discrete spaces must start at 0')
  shape = getattr(observation_space, 'shape', None)
  dtype = getattr(observation_space, 'dtype', None)
  if shape is None or dtype is None or len(shape) == 0:
    raise ValueError(
        f'observation space {_space_name(observation_space)} of env {config.env!r} '
        'is not supported: needs an array (Box) space with rank >= 1')
  rank = len(shape)
  network = config.network
  if network == 'auto':
    if rank == 1:
      network = 'mlp'
    elif rank in (2, 3):
      network = 'deep'
    else:
      raise ValueError(
          f'network=auto: cannot choose a torso for observation shape {list(shape)} '
          f'of env {config.env!r} (rank 1 -> mlp, rank 2/3 images -> deep); set '
          '--network=mlp to flatten it')
  elif config_lib.is_user_network(network):
    pass  # UserTorso checks what FUNCTION returns.
  elif network in ('shallow', 'deep') and rank not in (2, 3):
    raise ValueError(
        f'network={network}: needs image observations [H, W] or [H, W, C], but env '
        f'{config.env!r} has observation shape {list(shape)}; use network=mlp or '
        'auto')
  return AgentNetwork(
      observation_shape=shape,
      observation_dtype=dtype,
      num_actions=int(action_space.n),
      torso=network,
      mlp_hidden_sizes=config.mlp_hidden_sizes,
      use_lstm=config.use_lstm,
      lstm_size=config.lstm_size,
      seed=config.seed,
      spaces=(observation_space, action_space),
      popart=config.popart,
      shared_torso=config_lib.resolve_shared_torso(
          config.shared_torso, network, config.use_lstm),
      popart_sigma_floor=config.popart_sigma_floor)


class NumpyMLPPolicy:
  """The policy logits of a feed-forward MLP AgentNetwork, computed with numpy.

  Actors on the CPU act with tiny batches, where a TensorFlow call costs far more
  than the arithmetic and competes with the learner for TensorFlow's thread pools.
  For an MLP torso without a recurrent core this computes exactly what
  `AgentNetwork.step(...).policy_logits` computes (same layers, ReLU, float32), from
  the weights the learner publishes (numpy arrays in `network.variables` order).
  Tests check it against the TensorFlow network.

  Args:
    network: an AgentNetwork with `torso_name == 'mlp'` and `use_lstm == False`.

  Raises:
    ValueError: for other networks (use `supports(network)` to check first).
  """

  def __init__(self, network: 'AgentNetwork'):
    if not self.supports(network):
      raise ValueError('NumpyMLPPolicy needs an MLP network without an LSTM core, '
                       f'got torso={network.torso_name} use_lstm={network.use_lstm}')
    index = {v.ref(): i for i, v in enumerate(network.variables)}
    self._layer_index = [(index[l.w.ref()], index[l.b.ref()])
                         for l in network.torso.layers]
    self._head_index = (index[network.policy_head.w.ref()],
                        index[network.policy_head.b.ref()])
    self._input_size = network.torso.input_size
    self._scale = 1.0 / 255.0 if network.observation_dtype == tf.uint8 else None
    self._layers = None
    self._head = None

  @staticmethod
  def supports(network: 'AgentNetwork') -> bool:
    return network.torso_name == 'mlp' and not network.use_lstm

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
      x = np.maximum(x @ w + b, 0.0)
    w, b = self._head
    return x @ w + b
