"""The agent network users build: a torso, an optional LSTM core, and the heads.

`AgentNetwork` assembles its parts: a torso (`impala_tf.torsos`: mlp, shallow,
deep; or the user's `MODULE:FUNCTION`, `impala_tf.user_torso`), an LSTM core and
the policy and baseline heads (`impala_tf.layers`), and PopArt's statistics
(`impala_tf.popart`). `make_network` builds the one a Config asks for. The parts
documented as this module's API (the layers, the torsos, `UserTorso`,
`resolve_torso_fn`, `PopArt` and the actors' `NumpyMLPPolicy`, from
`impala_tf.numpy_policy`) are importable from here too.

Everything is built from `tf.Module`, `tf.Variable` and plain TF ops
(`tf.nn.conv2d`, `tf.nn.max_pool2d`, `tf.matmul`); nothing depends on Keras, so
the module works with Keras 3, with tf-keras and with `TF_USE_LEGACY_KERAS=1`.

Conventions (see `impala_tf/types.py`): sequences are time-major `[T, B, ...]`;
images are NHWC; observations keep the environment's dtype (uint8 pixels are
converted to float32 and divided by 255 inside the network); `prev_action` is
int32, `reward` float32, `first` bool.

All variables are created eagerly in the constructors (never lazily on the first
call), so a network built under `strategy.scope()` can be checkpoint-restored
before it is ever called.

Initialization is deterministic given `seed` (`impala_tf.layers` describes it).
`weight_init='glorot'` (the default): Glorot-uniform kernels, the policy-logits
head scaled by 0.01, so the initial policy is close to uniform (maximum entropy).
`weight_init='orthogonal'` (Baselines', CleanRL's and SB3's): orthogonal kernels
with gain sqrt(2) in the torso, 0.01 for the policy logits and 1 for the baseline.
The LSTM core's kernels are drawn as `layers.LSTMCell` says either way, and a
user torso initialises itself. `torso_activation` ('relu', the paper's, or
'leaky_relu') is the built-in torsos' nonlinearity (`layers.activation`).

Precision: `compute_dtype='float32'` (the default) computes everything in
float32. 'bfloat16' is mixed precision for the built-in torsos: the observation is
cast to bfloat16 (uint8 pixels straight to bfloat16, then divided by 255), each
layer casts its float32 variables to bfloat16 for the product, and the torso's
output is cast back to float32 before the LSTM core and the heads, so the logits
and the baseline are float32 and every variable and gradient stays float32.

Parameter counts for an 84x84x4 input, 6 actions (worked out in
`tests/networks_test.py`): shallow 677,943; deep 1,091,031; an LSTM 256 core adds
532,480 (input 256 + 6 + 1 = 263: (263 + 256) * 1024 + 1024).
"""

from typing import Optional, Sequence

import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import layers
from impala_tf import numpy_policy
from impala_tf import popart as popart_lib
from impala_tf import torso_choice
from impala_tf import torsos
from impala_tf import types
from impala_tf import user_torso

# With an LSTM core and a statically known unroll length T <= this, `unroll` runs the
# core with a Python loop (an unrolled graph inside tf.function); otherwise with
# tf.scan (a while loop). See `AgentNetwork.unroll`.
MAX_STATIC_UNROLL = 128

# The network's parts documented as `impala_tf.networks` API (docs/library.md,
# docs/design.md); each lives in the module named.
Linear = layers.Linear
Conv2D = layers.Conv2D
LSTMCell = layers.LSTMCell
MLP = torsos.MLP
ShallowTorso = torsos.ShallowTorso
DeepTorso = torsos.DeepTorso
UserTorso = user_torso.UserTorso
resolve_torso_fn = user_torso.resolve_torso_fn
PopArt = popart_lib.PopArt
NumpyMLPPolicy = numpy_policy.NumpyMLPPolicy


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
               popart_sigma_floor: float = 0.0, weight_init: str = 'glorot',
               torso_activation: str = 'relu', compute_dtype: str = 'float32'):
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
      weight_init: 'glorot' or 'orthogonal' (the module docstring).
      torso_activation: 'relu' or 'leaky_relu' (the module docstring); the
        built-in torsos and the value MLP only.
      compute_dtype: 'float32' or 'bfloat16', the built-in torsos' precision
        (the module docstring); a user torso needs 'float32'.

    Raises:
      ValueError: naming `network` for a torso that does not fit the observations
        (a ConfigError for a user torso).
    """
    super().__init__(name=name)
    user = config_lib.is_user_network(torso)
    if torso not in torso_choice.TORSOS and not user:
      raise ValueError(f'network={torso}: must be one of '
                       f'{", ".join(torso_choice.TORSOS)} or MODULE:FUNCTION')
    if user and spaces is None:
      raise ValueError(f'network={torso}: a user torso needs spaces=(observation_'
                       'space, action_space) for its FUNCTION')
    if int(num_actions) < 1:
      raise ValueError(f'num_actions={num_actions}: must be >= 1')
    layers.check_init(weight_init)
    layers.check_activation(torso_activation)
    if compute_dtype not in config_lib.COMPUTE_DTYPES:
      raise ValueError(f'compute_dtype={compute_dtype!r}: must be one of '
                       f'{", ".join(config_lib.COMPUTE_DTYPES)}')
    if user and compute_dtype != 'float32':
      raise ValueError(f'compute_dtype={compute_dtype!r}: a user torso '
                       f'(network={torso}) needs float32; it chooses its own '
                       'precision')
    if not shared_torso and (torso != 'mlp' or use_lstm):
      raise ValueError(f'shared_torso=False: needs the mlp torso without an LSTM, '
                       f'got network={torso} use_lstm={use_lstm}')
    self.observation_shape = tuple(int(d) for d in observation_shape)
    self.observation_dtype = tf.as_dtype(observation_dtype)
    self.num_actions = int(num_actions)
    self.use_lstm = bool(use_lstm)
    self.lstm_size = int(lstm_size)
    self.torso_name = torso
    self.compute_dtype = tf.as_dtype(compute_dtype)
    seeds = layers.SeedStream(seed)
    with self.name_scope:
      if user:
        self.torso = user_torso.UserTorso(torso, spaces[0], spaces[1],
                                          self.observation_shape, name='user_torso')
      elif torso == 'mlp':
        self.torso = torsos.MLP(self.observation_shape, mlp_hidden_sizes, seeds,
                                name='mlp', weight_init=weight_init,
                                activation=torso_activation)
      elif torso == 'shallow':
        self.torso = torsos.ShallowTorso(self.observation_shape, seeds,
                                         name='shallow', weight_init=weight_init,
                                         activation=torso_activation)
      else:
        self.torso = torsos.DeepTorso(self.observation_shape, seeds, name='deep',
                                      weight_init=weight_init,
                                      activation=torso_activation)
      out_size = self.torso.output_size
      if self.use_lstm:
        self.core = layers.LSTMCell(out_size + self.num_actions + 1, self.lstm_size,
                                    seeds, name='lstm')
        out_size = self.lstm_size
      else:
        self.core = None
      self.policy_head = layers.Linear(out_size, self.num_actions, seeds,
                                       init_scale=0.01, name='policy_logits',
                                       init=weight_init)
      self.value_torso = None
      if not shared_torso:
        self.value_torso = torsos.MLP(self.observation_shape, mlp_hidden_sizes,
                                      seeds, name='value_mlp',
                                      weight_init=weight_init,
                                      activation=torso_activation)
      self.baseline_head = layers.Linear(
          self.value_torso.output_size if self.value_torso else out_size, 1, seeds,
          name='baseline', init=weight_init)
      self.popart = (popart_lib.PopArt(1, popart_sigma_floor, name='popart')
                     if popart else None)

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

  def scale_observation(self, observation: tf.Tensor) -> tf.Tensor:
    """Observations (any shape, any dtype) -> `compute_dtype`, the same shape.

    uint8 pixels are divided by 255; other dtypes are only cast. A tensor
    already in `compute_dtype` comes back unchanged, so scaling before `unroll`
    or `step` (as the learner does once per batch it reuses) gives the same
    outputs as passing the observations as they are.
    """
    x = tf.cast(observation, self.compute_dtype)
    if observation.dtype == tf.uint8:
      x = x / tf.constant(255.0, self.compute_dtype)
    return x

  def _embed(self, observation: tf.Tensor):
    """`[N, *observation_shape]` (any dtype) -> (torso float32 `[N, F]`, value
    torso float32 `[N, F_v]` or None when the torso is shared), computed in
    `compute_dtype` (`scale_observation`)."""
    x = self.scale_observation(observation)
    out = lambda torso: tf.cast(torso(x), tf.float32)
    return out(self.torso), (out(self.value_torso) if self.value_torso else None)

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
      inputs: AgentInput with `observation [B, *observation_shape]` (env dtype,
        or `scale_observation`'s),
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
      inputs: AgentInput with `observation [T, B, *observation_shape]` (env dtype,
        or `scale_observation`'s),
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
  images (rank 2 `[H, W]` or rank 3 `[H, W, C]`; `torso_choice.resolve_torso`).
  'shallow'/'deep' with vector observations is an error. 'mlp' with images is allowed: the image is flattened
  (useful for tiny pixel test envs; for Atari-sized inputs use shallow or deep).
  'MODULE:FUNCTION' builds the user's torso (`UserTorso`) with the same heads and
  LSTM core as the built-in torsos.

  Spaces are duck-typed (gymnasium is not imported): the observation space needs
  `.shape` and `.dtype` (a Box), the action space must be a gymnasium Discrete
  (`.n`, start 0).

  Args:
    config: an `impala_tf.config.Config` (network, mlp_hidden_sizes, use_lstm,
      lstm_size, seed, weight_init, torso_activation, compute_dtype are read).
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
  if config.network == 'auto' and rank not in (1, 2, 3):
    raise ValueError(
        f'network=auto: cannot choose a torso for observation shape {list(shape)} '
        f'of env {config.env!r} (rank 1 -> mlp, rank 2/3 images -> deep); set '
        '--network=mlp to flatten it')
  network = torso_choice.resolve_torso(config.network, shape)
  if config_lib.is_user_network(network):
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
      popart_sigma_floor=config.popart_sigma_floor,
      weight_init=config.weight_init,
      torso_activation=config.torso_activation,
      compute_dtype=config.compute_dtype)
