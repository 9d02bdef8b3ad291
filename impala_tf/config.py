"""The validated configuration of a training run.

`Config` is a frozen dataclass; every field is also an absl flag of the same name
(`impala_tf/flags.py`). Construction validates every field and every cross-field rule
and raises `ConfigError` (a `ValueError`) whose message names the field, the value and
what is allowed, e.g. `batch_size=30: must be divisible by the 4 learner replicas ...`.
Values must have the field's Python type: `int` fields take an int (not a bool, a
float or a string), `float` fields an int or a float, `Optional[float]` fields also
None, `bool` fields a bool (`Optional[bool]` also None), `str` fields a string, `mlp_hidden_sizes` a tuple or list
of ints (a list is stored as a tuple). A value of another type is a ConfigError
naming the field, like a value out of range.
Checks that need the outside world (does the env id exist, are the GPUs there) live
in `environments.check_env_id()` and `distribute.check_gpus()`, so a Config can be
built on a machine without them.
"""

import dataclasses
import difflib
import json
import math
import re
from typing import Optional, Tuple

OPTIMIZERS = ('rmsprop', 'adam')
RMSPROP_STYLES = ('tf1', 'torch')
NETWORKS = ('auto', 'mlp', 'shallow', 'deep')
NETWORK_ALLOWED = (
    f'must be one of {", ".join(NETWORKS)}, or MODULE:FUNCTION naming your own torso '
    '(e.g. my_pkg.nets:torso, FUNCTION(observation_space, action_space) returning '
    'a Keras model or layer, a tf.Module or a callable)')
_USER_NETWORK_RE = re.compile(r'^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$')
REWARD_CLIPPINGS = ('abs_one', 'soft_asymmetric', 'none')
LOSS_REDUCTIONS = ('sum', 'mean')
ENV_VECTORIZATIONS = ('auto', 'sync', 'async')
ENV_BACKENDS = ('auto', 'gymnasium', 'envpool')
ACTOR_BACKENDS = ('threads', 'processes', 'ray')
LEARNER_BACKENDS = ('local', 'ray')
LEARNER_JIT = ('auto', 'on', 'off')

RESOURCES_ALLOWED = (
    'must be a JSON object of Ray resource names to numbers >= 0, e.g. '
    '\'{"CPU": 1}\' or \'{"CPU": 1, "actor_node": 1}\' (CPU, GPU and memory are '
    "Ray's built-in resources, other names are custom resources given to "
    '`ray start --resources`)')

SCHEDULE_ALLOWED = (
    "must be 'constant', 'linear' or piecewise-linear points "
    "'FRAMES:VALUE,FRAMES:VALUE,...' with strictly increasing FRAMES and every FRAMES "
    'and VALUE a number >= 0 (e.g. 0:0.01,1e6:0.001; FRAMES as P% of '
    '--total_environment_frames and VALUE as a multiple Vx of the base value: '
    '0%:1x,30%:0.15x,100%:0x)')


class ConfigError(ValueError):
  """A configuration value is out of range; the message names the field.

  The message is one line, `field=value: what is allowed`. Attributes: `field`,
  `value`, `allowed`.
  """

  def __init__(self, field: str, value, allowed: str):
    self.field = field
    self.value = value
    self.allowed = allowed
    super().__init__(f'{field}={_fmt(value)}: {allowed}')


def _fmt(value) -> str:
  if isinstance(value, (tuple, list)):
    return ','.join(str(v) if isinstance(v, (int, float)) else repr(v)
                    for v in value)
  return str(value)


def _got(value) -> str:
  return f' (got {type(value).__name__})'


def parse_schedule(spec: str, field: str, total_frames: Optional[float] = None,
                   base_value: Optional[float] = None):
  """Parses a schedule string.

  Args:
    spec: 'constant'; 'linear' (linear decay to 0 at total_environment_frames); or
      piecewise-linear points 'FRAMES:VALUE,FRAMES:VALUE,...' over env frames, with
      strictly increasing FRAMES (values are held constant outside the points).
      FRAMES and VALUE are finite numbers >= 0, written as Python floats are
      (`1e6`, `1E6`, `1e+6`, `1_000_000`, `0.001`). FRAMES written `P%` are that
      percentage of `total_frames` (all points or none: `0%:...,30%:...`). A VALUE
      is the absolute value at that frame; written `Vx` it is V times `base_value`
      (`--learning_rate`, `--entropy_cost`). Values may be 0 (as 'linear' reaches
      0 at the end), never negative: a negative learning rate ascends the loss
      and a negative entropy cost penalises exploration.
    field: the field name, for error messages.
    total_frames: the run's total_environment_frames, which `P%` frames are a
      share of; None leaves them as P (to validate a spec alone).
    base_value: the value `Vx` values multiply; None leaves them as V.

  Returns:
    'constant', 'linear', or a tuple of (frames float, value float) pairs.

  Raises:
    ConfigError: naming `field` when the spec is malformed or out of range.
  """
  if not isinstance(spec, str):
    raise ConfigError(field, spec, SCHEDULE_ALLOWED + _got(spec))
  if spec in ('constant', 'linear'):
    return spec
  points, relative = [], []
  for part in spec.split(','):
    pieces = [p.strip() for p in part.split(':')]
    if len(pieces) != 2:
      raise ConfigError(field, spec,
                        f'{SCHEDULE_ALLOWED}; {part.strip()!r} is not FRAMES:VALUE')
    frames_text, value_text = pieces
    percent = frames_text.endswith('%')
    times = value_text.endswith('x')
    try:
      frames = float(frames_text[:-1] if percent else frames_text)
      value = float(value_text[:-1] if times else value_text)
    except ValueError:
      raise ConfigError(field, spec, f'{SCHEDULE_ALLOWED}; {part.strip()!r} is not '
                        'FRAMES:VALUE with two numbers') from None
    if not (math.isfinite(frames) and math.isfinite(value) and frames >= 0 and
            value >= 0):
      raise ConfigError(field, spec, f'{SCHEDULE_ALLOWED}; {part.strip()!r} has a '
                        'negative or non-finite number')
    if percent and total_frames is not None:
      frames = frames / 100.0 * float(total_frames)
    if times and base_value is not None:
      value = value * float(base_value)
    relative.append(percent)
    points.append((frames + 0.0, value + 0.0))  # + 0.0 turns -0.0 into 0.0.
  if any(relative) and not all(relative):
    raise ConfigError(field, spec, f'{SCHEDULE_ALLOWED}; FRAMES are all percentages '
                      'of --total_environment_frames (P%) or none')
  if any(b[0] <= a[0] for a, b in zip(points, points[1:])):
    raise ConfigError(field, spec, f'{SCHEDULE_ALLOWED}; FRAMES do not increase')
  return tuple(points)


RUNTIME_ENV_KEYS = ('working_dir', 'py_modules', 'pip', 'env_vars', 'excludes')
RUNTIME_ENV_ALLOWED = (
    "must be '' or a JSON object with Ray runtime_env keys "
    f"{', '.join(RUNTIME_ENV_KEYS)}, e.g. '{{\"working_dir\": \".\"}}' or "
    '\'{"pip": ["gymnasium[atari]"]}\'')


def parse_runtime_env(spec: str, field: str) -> dict:
  """Parses the JSON runtime_env of Ray actors ('' -> {}).

  Args:
    spec: the JSON text, keys among RUNTIME_ENV_KEYS.
    field: the field name, for error messages.

  Returns:
    The dict for Ray's `runtime_env`.

  Raises:
    ConfigError: naming `field` when the text is not such an object.
  """
  if not isinstance(spec, str):
    raise ConfigError(field, spec, RUNTIME_ENV_ALLOWED + _got(spec))
  if not spec:
    return {}
  try:
    parsed = json.loads(spec)
  except ValueError:
    raise ConfigError(field, spec, RUNTIME_ENV_ALLOWED + '; it is not JSON') from None
  if not isinstance(parsed, dict):
    raise ConfigError(field, spec, RUNTIME_ENV_ALLOWED + '; it is not an object')
  unknown = [k for k in parsed if k not in RUNTIME_ENV_KEYS]
  if unknown:
    raise ConfigError(field, spec, f'{RUNTIME_ENV_ALLOWED}; {unknown[0]!r} is not one')
  if not isinstance(parsed.get('working_dir', ''), str):
    raise ConfigError(field, spec, f'{RUNTIME_ENV_ALLOWED}; working_dir must be a path')
  for key in ('py_modules', 'excludes'):
    if not isinstance(parsed.get(key, []), list):
      raise ConfigError(field, spec, f'{RUNTIME_ENV_ALLOWED}; {key} must be a list')
  return parsed


def parse_resources(spec: str, field: str) -> dict:
  """Parses a JSON object of Ray resources, e.g. '{"CPU": 1, "GPU": 0.5}'.

  Args:
    spec: the JSON text.
    field: the field name, for error messages.

  Returns:
    A dict of resource name (str) -> float >= 0.

  Raises:
    ConfigError: naming `field` when the text is not such an object.
  """
  if not isinstance(spec, str):
    raise ConfigError(field, spec, RESOURCES_ALLOWED + _got(spec))
  try:
    parsed = json.loads(spec)
  except ValueError:
    raise ConfigError(field, spec, RESOURCES_ALLOWED + '; it is not JSON') from None
  if not isinstance(parsed, dict):
    raise ConfigError(field, spec, RESOURCES_ALLOWED + '; it is not an object')
  out = {}
  for name, amount in parsed.items():
    if not (name.strip() and _is_number(amount) and _finite(amount) and
            amount >= 0):
      raise ConfigError(field, spec, f'{RESOURCES_ALLOWED}; {name!r}: {amount!r} is '
                        'not a number >= 0')
    out[name] = float(amount)
  return out


@dataclasses.dataclass(frozen=True)
class Config:
  """Every option of a run. Field names equal the absl flag names.

  The help text of each field (its unit, default and range) lives in flags.py, which
  is generated into docs/flags.md.
  """
  # Environment.
  env: str = 'CartPole-v1'
  env_vectorization: str = 'auto'
  env_backend: str = 'auto'
  envpool_num_threads: int = 0
  noop_max: int = 30
  episodic_life: bool = False
  frame_stack: int = 4
  max_episode_frames: int = 108_000
  env_step_timeout_secs: float = 60.0
  # Actors.
  num_actors: int = 1
  num_envs_per_actor: int = 8
  unroll_length: int = 10
  broadcast_interval: int = 1
  actor_backend: str = 'threads'
  ray_address: str = ''
  ray_connect_timeout_secs: float = 60.0
  ray_actor_resources: str = '{"CPU": 1}'
  max_actor_restarts: int = 100
  actor_unroll_timeout_secs: float = 300.0
  ray_placement_timeout_secs: float = 300.0
  ray_runtime_env: str = ''
  # Data pipeline.
  batch_size: int = 8
  num_data_loader_buffers: int = 1
  minibatch_buffer_size: int = 1
  num_sgd_iter: int = 1
  replay_proportion: float = 0.0
  replay_buffer_num_slots: int = 0
  learner_queue_size: int = 1
  learner_queue_timeout: float = 300.0
  # Learner and devices.
  learner_steps_per_call: int = 1
  learner_jit: str = 'auto'
  num_gpus: int = 0
  num_virtual_cpu_devices: int = 0
  tf_inter_op_threads: int = -1
  num_learner_workers: int = 1
  learner_worker_timeout_secs: float = 60.0
  stall_timeout_secs: float = 600.0
  learner_backend: str = 'local'
  ray_learner_resources: str = '{"CPU": 1}'
  # Loss.
  discounting: float = 0.99
  baseline_cost: float = 0.5
  entropy_cost: float = 0.01
  entropy_cost_schedule: str = '0%:1x,20%:0x'
  vtrace: bool = True
  clip_rho_threshold: Optional[float] = 1.0
  clip_pg_rho_threshold: Optional[float] = 1.0
  vtrace_lambda: float = 1.0
  reward_clipping: str = 'none'
  reward_scale: float = 1.0
  loss_reduction: str = 'sum'
  popart: bool = True
  popart_beta: float = 1e-2
  popart_sigma_floor: float = 0.1
  ppo_clip: float = 0.0
  normalize_advantages: bool = False
  loss_term_grad_norms: bool = True
  # Optimizer.
  optimizer: str = 'adam'
  learning_rate: float = 0.002
  lr_schedule: str = '0%:1x,20%:0.25x,50%:0.05x,100%:0x'
  rmsprop_decay: float = 0.99
  rmsprop_momentum: float = 0.0
  rmsprop_epsilon: float = 0.01
  rmsprop_style: str = 'tf1'
  adam_beta1: float = 0.9
  adam_beta2: float = 0.999
  adam_epsilon: float = 1e-7
  grad_clip: float = 40.0
  max_nonfinite_updates: int = 10
  # Network.
  network: str = 'auto'
  mlp_hidden_sizes: Tuple[int, ...] = (64, 64)
  use_lstm: bool = False
  lstm_size: int = 256
  shared_torso: Optional[bool] = None
  # Run.
  total_environment_frames: int = 1_000_000
  target_return: Optional[float] = None
  seed: int = 0
  logdir: str = '/tmp/impala_tf'
  checkpoint_interval_secs: float = 600.0
  keep_checkpoints: int = 3
  log_interval_secs: float = 5.0
  eval_interval_frames: int = 0
  eval_episodes: int = 10
  eval_greedy: bool = True

  def __post_init__(self):
    if isinstance(self.mlp_hidden_sizes, list):
      object.__setattr__(self, 'mlp_hidden_sizes', tuple(self.mlp_hidden_sizes))
    _validate(self)

  @property
  def num_replicas(self) -> int:
    """Learner replicas of one worker: GPUs, else virtual CPU devices, else 1."""
    return self.num_gpus or self.num_virtual_cpu_devices or 1

  @property
  def num_replicas_in_sync(self) -> int:
    """Learner replicas over all learner workers."""
    return self.num_replicas * self.num_learner_workers

  @property
  def ray_learner_resources_dict(self) -> dict:
    """`ray_learner_resources` parsed: resource name -> float."""
    return parse_resources(self.ray_learner_resources, 'ray_learner_resources')

  @property
  def ray_actor_resources_dict(self) -> dict:
    """`ray_actor_resources` parsed: resource name -> float."""
    return parse_resources(self.ray_actor_resources, 'ray_actor_resources')

  @property
  def ray_runtime_env_dict(self) -> dict:
    """`ray_runtime_env` parsed: Ray's runtime_env dict ({} when unset)."""
    return parse_runtime_env(self.ray_runtime_env, 'ray_runtime_env')

  @property
  def lr_schedule_points(self):
    return parse_schedule(self.lr_schedule, 'lr_schedule',
                          self.total_environment_frames, self.learning_rate)

  @property
  def entropy_cost_schedule_points(self):
    return parse_schedule(self.entropy_cost_schedule, 'entropy_cost_schedule',
                          self.total_environment_frames, self.entropy_cost)

  def replace(self, **changes) -> 'Config':
    """A copy with `changes` applied, validated again."""
    _check_known(changes)
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d['mlp_hidden_sizes'] = list(self.mlp_hidden_sizes)
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict) -> 'Config':
    """The Config of `to_dict()` / parsed `to_json()`; missing keys take defaults."""
    _check_known(d)
    return cls(**d)


def is_user_network(network) -> bool:
  """Whether a `network` value is 'MODULE:FUNCTION' (the user's own torso)."""
  return isinstance(network, str) and bool(_USER_NETWORK_RE.match(network))


def resolve_shared_torso(shared_torso: Optional[bool], torso: str,
                         use_lstm: bool) -> bool:
  """`Config.shared_torso` resolved for a torso ('auto' already resolved).

  Args:
    shared_torso: True, False, or None (auto).
    torso: 'mlp', 'shallow', 'deep' or 'MODULE:FUNCTION'.
    use_lstm: whether the network has an LSTM core.

  Returns:
    `shared_torso` when set; unset, False (a separate value MLP) for the mlp
    torso without an LSTM and True (one torso, the paper's) otherwise.
  """
  if shared_torso is not None:
    return bool(shared_torso)
  return not (torso == 'mlp' and not use_lstm)


def _check_known(d: dict):
  known = [f.name for f in dataclasses.fields(Config)]
  unknown = sorted(set(d) - set(known))
  if unknown:
    allowed = 'is not a Config field'
    close = difflib.get_close_matches(unknown[0], known, n=1)
    if close:
      allowed += f' (did you mean {close[0]}?)'
    raise ConfigError(unknown[0], d[unknown[0]], allowed)


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


# The Python type each annotation asks for (checked before the ranges).
_TYPE_CHECKS = {
    int: _is_int,
    float: _is_number,
    bool: lambda v: isinstance(v, bool),
    str: lambda v: isinstance(v, str),
    Optional[float]: lambda v: v is None or _is_number(v),
    Optional[bool]: lambda v: v is None or isinstance(v, bool),
    Tuple[int, ...]: lambda v: isinstance(v, tuple),
}


def _finite(v) -> bool:
  return math.isfinite(v)


def _one_of(values):
  return (lambda v: v in values), f'must be one of {", ".join(values)}'


def _ints(low: int):
  return (lambda v: v >= low), f'must be an integer >= {low}'


def _unit_closed():
  return (lambda v: _finite(v) and 0 <= v <= 1), 'must be in [0, 1]'


def _unit_open():
  return (lambda v: _finite(v) and 0 <= v < 1), 'must be in [0, 1)'


def _positive(what='a number'):
  return (lambda v: _finite(v) and v > 0), f'must be {what} > 0'


def _non_negative(what='a number'):
  return (lambda v: _finite(v) and v >= 0), f'must be {what} >= 0'


def _schedule(field):
  def ok(v):
    parse_schedule(v, field)  # Raises its own, more precise, ConfigError.
    return True
  return ok, SCHEDULE_ALLOWED


def _resources(field):
  def ok(v):
    parse_resources(v, field)  # Raises its own, more precise, ConfigError.
    return True
  return ok, RESOURCES_ALLOWED


def _runtime_env(field):
  def ok(v):
    parse_runtime_env(v, field)  # Raises its own, more precise, ConfigError.
    return True
  return ok, RUNTIME_ENV_ALLOWED


def _clip_threshold():
  return ((lambda v: v is None or (_finite(v) and v > 0)),
          'must be a number > 0, or None for no clipping')


# Field -> (predicate on a value of the right type, what is allowed). Every field
# has an entry (checked at import), in Config's order.
_RULES = {
    'env': ((lambda v: bool(v.strip())),
            'must be a gymnasium env id such as CartPole-v1 or ALE/Pong-v5'),
    'env_vectorization': _one_of(ENV_VECTORIZATIONS),
    'env_backend': _one_of(ENV_BACKENDS),
    'envpool_num_threads': _ints(0),
    'noop_max': _ints(0),
    'episodic_life': (None, 'must be True or False'),
    'frame_stack': _ints(1),
    'max_episode_frames': _ints(1),
    'env_step_timeout_secs': _positive('a number of seconds'),
    'num_actors': _ints(1),
    'num_envs_per_actor': _ints(1),
    'unroll_length': _ints(1),
    'broadcast_interval': _ints(1),
    'actor_backend': _one_of(ACTOR_BACKENDS),
    'ray_address': ((lambda v: v == v.strip() and ' ' not in v),
                    "must be '' (start a local Ray), 'auto' or the address of a "
                    'running Ray cluster such as 10.0.0.1:6379, without spaces'),
    'ray_connect_timeout_secs': _positive('a number of seconds'),
    'ray_actor_resources': _resources('ray_actor_resources'),
    'max_actor_restarts': _ints(0),
    'actor_unroll_timeout_secs': _positive('a number of seconds'),
    'ray_placement_timeout_secs': _positive('a number of seconds'),
    'ray_runtime_env': _runtime_env('ray_runtime_env'),
    'batch_size': _ints(1),
    'num_data_loader_buffers': _ints(1),
    'minibatch_buffer_size': _ints(1),
    'num_sgd_iter': _ints(1),
    'replay_proportion': _non_negative(
        'a number (replayed unrolls per fresh unroll)'),
    'replay_buffer_num_slots': ((lambda v: v >= 0),
                                'must be an integer >= 0 (unrolls kept for replay)'),
    'learner_queue_size': _ints(1),
    'learner_queue_timeout': _positive('a number of seconds'),
    'learner_steps_per_call': _ints(1),
    'learner_jit': _one_of(LEARNER_JIT),
    'num_gpus': _ints(0),
    'num_virtual_cpu_devices': (
        (lambda v: v >= 0),
        'must be an integer >= 0 (0: use the CPU as one device)'),
    'tf_inter_op_threads': (
        (lambda v: v >= -1),
        "must be an integer >= -1 (-1: auto, 0: TensorFlow's default)"),
    'num_learner_workers': _ints(1),
    'learner_worker_timeout_secs': _positive('a number of seconds'),
    'stall_timeout_secs': _non_negative('a number of seconds (0: no watchdog)'),
    'learner_backend': _one_of(LEARNER_BACKENDS),
    'ray_learner_resources': _resources('ray_learner_resources'),
    'discounting': _unit_closed(),
    'baseline_cost': _non_negative(),
    'entropy_cost': _non_negative(),
    'entropy_cost_schedule': _schedule('entropy_cost_schedule'),
    'vtrace': (None, 'must be True or False'),
    'clip_rho_threshold': _clip_threshold(),
    'clip_pg_rho_threshold': _clip_threshold(),
    'vtrace_lambda': _unit_closed(),
    'reward_clipping': _one_of(REWARD_CLIPPINGS),
    'reward_scale': _positive(),
    'loss_reduction': _one_of(LOSS_REDUCTIONS),
    'popart': (None, 'must be True or False'),
    'popart_beta': ((lambda v: _finite(v) and 0 < v <= 1), 'must be in (0, 1]'),
    'popart_sigma_floor': ((lambda v: _finite(v) and 0 <= v <= 1),
                           'must be in [0, 1] (a fraction of the largest '
                           'spread so far)'),
    'ppo_clip': ((lambda v: _finite(v) and 0 <= v < 1),
                 'must be in [0, 1) (0: IMPALA\'s policy loss; PPO uses 0.1-0.2)'),
    'normalize_advantages': (None, 'must be True or False'),
    'loss_term_grad_norms': (None, 'must be True or False'),
    'optimizer': _one_of(OPTIMIZERS),
    'learning_rate': _positive(),
    'lr_schedule': _schedule('lr_schedule'),
    'rmsprop_decay': _unit_open(),
    'rmsprop_momentum': _unit_open(),
    'rmsprop_epsilon': _positive(),
    'rmsprop_style': _one_of(RMSPROP_STYLES),
    'adam_beta1': _unit_open(),
    'adam_beta2': _unit_open(),
    'adam_epsilon': _positive(),
    'grad_clip': _non_negative('a number (global-norm clip; 0 disables clipping)'),
    'max_nonfinite_updates': _ints(1),
    'network': ((lambda v: v in NETWORKS or is_user_network(v)), NETWORK_ALLOWED),
    'mlp_hidden_sizes': (
        (lambda v: len(v) >= 1 and all(_is_int(h) and h >= 1 for h in v)),
        'must be one or more integers >= 1, e.g. 64,64 (a tuple or list of ints '
        'in Python)'),
    'use_lstm': (None, 'must be True or False'),
    'lstm_size': _ints(1),
    'shared_torso': (None, 'must be True, False or None (auto: a separate value MLP '
                     'for an mlp torso without LSTM, one shared torso otherwise)'),
    'total_environment_frames': _ints(1),
    'target_return': ((lambda v: v is None or _finite(v)),
                      'must be a number, or None to train for '
                      'total_environment_frames'),
    'seed': ((lambda v: 0 <= v < 2**31), 'must be an integer in [0, 2**31)'),
    'logdir': ((lambda v: bool(v.strip())), 'must be a directory path'),
    'checkpoint_interval_secs': _positive('a number of seconds'),
    'keep_checkpoints': _ints(1),
    'log_interval_secs': _positive('a number of seconds'),
    'eval_interval_frames': ((lambda v: v >= 0),
                             'must be an integer >= 0 (env frames between '
                             'evaluations; 0: none)'),
    'eval_episodes': _ints(1),
    'eval_greedy': (None, 'must be True or False'),
}

_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(Config)}
assert list(_RULES) == list(_FIELD_TYPES), 'every Config field needs a rule'
assert all(t in _TYPE_CHECKS for t in _FIELD_TYPES.values()), _FIELD_TYPES


def _validate(c: Config):
  """Each field's type and range in field order, then the cross-field rules."""
  for field, (ok, allowed) in _RULES.items():
    value = getattr(c, field)
    if not _TYPE_CHECKS[_FIELD_TYPES[field]](value):
      raise ConfigError(field, value, allowed + _got(value))
    if ok is not None and not ok(value):
      raise ConfigError(field, value, allowed)

  def require(ok: bool, field: str, allowed: str):
    if not ok:
      raise ConfigError(field, getattr(c, field), allowed)

  require(not (c.num_gpus and c.num_virtual_cpu_devices), 'num_virtual_cpu_devices',
          'must be 0 when --num_gpus is set (virtual CPU devices replace GPUs for '
          'testing)')
  require(c.num_learner_workers == 1 or c.num_virtual_cpu_devices <= 1,
          'num_virtual_cpu_devices',
          'must be 0 or 1 with --num_learner_workers > 1 (a multi-worker learner '
          'has one CPU replica per worker, or --num_gpus replicas)')
  require(c.batch_size % c.num_replicas_in_sync == 0, 'batch_size',
          f'must be divisible by the {c.num_replicas_in_sync} learner replicas '
          f'(num_gpus={c.num_gpus}, num_virtual_cpu_devices='
          f'{c.num_virtual_cpu_devices}, num_learner_workers={c.num_learner_workers}) '
          'so no unroll is dropped; use a multiple of the replica count')
  require(c.learner_jit != 'on' or c.num_replicas_in_sync == 1 or not (
      c.popart or c.loss_reduction == 'mean' or c.normalize_advantages),
          'learner_jit',
          f"must be 'auto' or 'off' with {c.num_replicas_in_sync} learner replicas "
          'and --popart, --loss_reduction=mean or --normalize_advantages (they sum '
          'over the replicas before the gradient, which XLA cannot compile)')
  require(c.shared_torso is not False or (c.network in ('auto', 'mlp') and
                                          not c.use_lstm),
          'shared_torso',
          'must be True unless --network is mlp or auto (vector observations) and '
          '--use_lstm is off: a separate value torso is a second MLP')
  if c.learner_backend == 'ray' and c.num_learner_workers > 1 and c.num_gpus:
    asked = c.ray_learner_resources_dict.get('GPU', 0)
    require(asked >= c.num_gpus, 'ray_learner_resources',
            f'must ask for "GPU": {c.num_gpus} or more with --num_gpus={c.num_gpus} '
            f'(it asks for {asked:g}): Ray gives each learner worker only the GPUs '
            'it reserved, so without them workers would share or miss GPUs')
  need = max(1, math.ceil(c.replay_proportion))
  require(c.replay_proportion == 0 or c.replay_buffer_num_slots >= need,
          'replay_buffer_num_slots',
          f'must be >= max(1, ceil(replay_proportion)) = {need} when '
          f'replay_proportion={c.replay_proportion} > 0, so a fresh unroll can be '
          'followed by that many replays')
  require(c.total_environment_frames >= c.batch_size * c.unroll_length,
          'total_environment_frames',
          f'must be >= batch_size * unroll_length = {c.batch_size * c.unroll_length} '
          'frames, the size of one learner batch')
