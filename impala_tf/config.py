"""The validated configuration of a training run.

`Config` is a frozen dataclass; every field is also an absl flag of the same name
(`impala_tf/flags.py`). Construction validates every field and every cross-field rule
and raises `ConfigError` (a `ValueError`) whose message names the field, the value and
what is allowed, e.g. `batch_size=30: must be divisible by the 4 learner replicas ...`.
Checks that need the outside world (does the env id exist, are the GPUs there) live in
`check_environment()`, so a Config can be built on a machine without them.
"""

import dataclasses
import json
import math
import re
from typing import Optional, Tuple

OPTIMIZERS = ('rmsprop', 'adam')
NETWORKS = ('auto', 'mlp', 'shallow', 'deep')
REWARD_CLIPPINGS = ('abs_one', 'soft_asymmetric', 'none')
ENV_VECTORIZATIONS = ('auto', 'sync', 'async')

_SCHEDULE_RE = re.compile(r'^\s*\d+(\.\d*)?(e\d+)?\s*:\s*[-+0-9.eE]+\s*$')


class ConfigError(ValueError):
  """A configuration value is out of range; the message names the field."""

  def __init__(self, field: str, value, allowed: str):
    self.field = field
    self.value = value
    self.allowed = allowed
    super().__init__(f'{field}={_fmt(value)}: {allowed}')


def _fmt(value) -> str:
  if isinstance(value, (tuple, list)):
    return ','.join(str(v) for v in value)
  return str(value)


def parse_schedule(spec: str, field: str):
  """Parses a schedule string.

  Args:
    spec: 'constant', 'linear' (linear decay to 0 at total_environment_frames) or
      piecewise-linear points 'FRAMES:VALUE,FRAMES:VALUE,...' with increasing FRAMES
      (values are held constant outside the points).
    field: the field name, for error messages.

  Returns:
    'constant', 'linear', or a tuple of (frames float, value float) pairs.

  Raises:
    ConfigError: naming `field` when the spec is malformed.
  """
  if spec in ('constant', 'linear'):
    return spec
  allowed = ("must be 'constant', 'linear' or piecewise points "
             "'FRAMES:VALUE,FRAMES:VALUE,...' with increasing FRAMES")
  parts = [p for p in spec.split(',') if p.strip()]
  if not parts or not all(_SCHEDULE_RE.match(p) for p in parts):
    raise ConfigError(field, spec, allowed)
  try:
    points = tuple((float(p.split(':')[0]), float(p.split(':')[1])) for p in parts)
  except ValueError:
    raise ConfigError(field, spec, allowed) from None
  frames = [f for f, _ in points]
  if any(b <= a for a, b in zip(frames, frames[1:])):
    raise ConfigError(field, spec, allowed)
  return points


@dataclasses.dataclass(frozen=True)
class Config:
  """Every option of a run. Field names equal the absl flag names.

  The help text of each field (its unit, default and range) lives in flags.py, which
  is generated into docs/flags.md.
  """
  # Environment.
  env: str = 'CartPole-v1'
  env_vectorization: str = 'auto'
  noop_max: int = 30
  episodic_life: bool = False
  frame_stack: int = 4
  max_episode_frames: int = 108_000
  # Actors.
  num_actors: int = 2
  num_envs_per_actor: int = 32
  unroll_length: int = 20
  broadcast_interval: int = 1
  # Data pipeline.
  batch_size: int = 32
  num_data_loader_buffers: int = 1
  minibatch_buffer_size: int = 1
  num_sgd_iter: int = 1
  replay_proportion: float = 0.0
  replay_buffer_num_slots: int = 0
  learner_queue_size: int = 4
  learner_queue_timeout: float = 300.0
  # Learner and devices.
  num_gpus: int = 0
  num_virtual_cpu_devices: int = 0
  # Loss.
  discounting: float = 0.99
  baseline_cost: float = 0.5
  entropy_cost: float = 0.01
  entropy_cost_schedule: str = 'constant'
  vtrace: bool = True
  clip_rho_threshold: Optional[float] = 1.0
  clip_pg_rho_threshold: Optional[float] = 1.0
  vtrace_lambda: float = 1.0
  reward_clipping: str = 'none'
  # Optimizer.
  optimizer: str = 'adam'
  learning_rate: float = 0.001
  lr_schedule: str = 'constant'
  rmsprop_decay: float = 0.99
  rmsprop_momentum: float = 0.0
  rmsprop_epsilon: float = 0.01
  adam_beta1: float = 0.9
  adam_beta2: float = 0.999
  adam_epsilon: float = 1e-7
  grad_clip: float = 40.0
  # Network.
  network: str = 'auto'
  mlp_hidden_sizes: Tuple[int, ...] = (64, 64)
  use_lstm: bool = False
  lstm_size: int = 256
  # Run.
  total_environment_frames: int = 1_000_000
  target_return: Optional[float] = None
  seed: int = 0
  logdir: str = '/tmp/impala_tf'
  checkpoint_interval_secs: float = 600.0
  keep_checkpoints: int = 3
  log_interval_secs: float = 5.0

  def __post_init__(self):
    if isinstance(self.mlp_hidden_sizes, list):
      object.__setattr__(self, 'mlp_hidden_sizes', tuple(self.mlp_hidden_sizes))
    _validate(self)

  @property
  def num_replicas(self) -> int:
    """Learner replicas: GPUs, else virtual CPU devices, else 1."""
    return self.num_gpus or self.num_virtual_cpu_devices or 1

  @property
  def lr_schedule_points(self):
    return parse_schedule(self.lr_schedule, 'lr_schedule')

  @property
  def entropy_cost_schedule_points(self):
    return parse_schedule(self.entropy_cost_schedule, 'entropy_cost_schedule')

  def replace(self, **changes) -> 'Config':
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d['mlp_hidden_sizes'] = list(self.mlp_hidden_sizes)
    return d

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2, sort_keys=True)

  @classmethod
  def from_dict(cls, d: dict) -> 'Config':
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ConfigError(unknown[0], d[unknown[0]], 'is not a Config field')
    return cls(**d)


def _require(ok: bool, cfg: Config, field: str, allowed: str):
  if not ok:
    raise ConfigError(field, getattr(cfg, field), allowed)


def _is_int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
  return (isinstance(v, (int, float)) and not isinstance(v, bool) and
          math.isfinite(v))


def _validate(c: Config):
  """Single-field ranges first, then cross-field rules."""
  r = _require
  r(isinstance(c.env, str) and bool(c.env.strip()), c, 'env',
    'must be a gymnasium env id such as CartPole-v1 or ALE/Pong-v5')
  r(c.env_vectorization in ENV_VECTORIZATIONS, c, 'env_vectorization',
    f'must be one of {", ".join(ENV_VECTORIZATIONS)}')
  r(_is_int(c.noop_max) and c.noop_max >= 0, c, 'noop_max', 'must be an integer >= 0')
  r(_is_int(c.frame_stack) and c.frame_stack >= 1, c, 'frame_stack',
    'must be an integer >= 1')
  r(_is_int(c.max_episode_frames) and c.max_episode_frames >= 1, c,
    'max_episode_frames', 'must be an integer >= 1')
  for field in ('num_actors', 'num_envs_per_actor', 'unroll_length',
                'broadcast_interval', 'batch_size', 'num_data_loader_buffers',
                'minibatch_buffer_size', 'num_sgd_iter', 'learner_queue_size',
                'lstm_size', 'total_environment_frames'):
    r(_is_int(getattr(c, field)) and getattr(c, field) >= 1, c, field,
      'must be an integer >= 1')
  r(_is_int(c.keep_checkpoints) and c.keep_checkpoints >= 1, c, 'keep_checkpoints',
    'must be an integer >= 1')
  r(_is_num(c.replay_proportion) and c.replay_proportion >= 0, c,
    'replay_proportion', 'must be a number >= 0 (replayed unrolls per fresh unroll)')
  r(_is_int(c.replay_buffer_num_slots) and c.replay_buffer_num_slots >= 0, c,
    'replay_buffer_num_slots', 'must be an integer >= 0 (unrolls kept for replay)')
  r(_is_num(c.learner_queue_timeout) and c.learner_queue_timeout > 0, c,
    'learner_queue_timeout', 'must be a number of seconds > 0')
  r(_is_int(c.num_gpus) and c.num_gpus >= 0, c, 'num_gpus', 'must be an integer >= 0')
  r(_is_int(c.num_virtual_cpu_devices) and c.num_virtual_cpu_devices >= 0, c,
    'num_virtual_cpu_devices', 'must be an integer >= 0 (0: use the CPU as one device)')
  r(_is_num(c.discounting) and 0 <= c.discounting <= 1, c, 'discounting',
    'must be in [0, 1]')
  r(_is_num(c.baseline_cost) and c.baseline_cost >= 0, c, 'baseline_cost',
    'must be a number >= 0')
  r(_is_num(c.entropy_cost) and c.entropy_cost >= 0, c, 'entropy_cost',
    'must be a number >= 0')
  parse_schedule(c.entropy_cost_schedule, 'entropy_cost_schedule')
  for field in ('clip_rho_threshold', 'clip_pg_rho_threshold'):
    v = getattr(c, field)
    r(v is None or (_is_num(v) and v > 0), c, field,
      'must be a number > 0, or None for no clipping')
  r(_is_num(c.vtrace_lambda) and 0 <= c.vtrace_lambda <= 1, c, 'vtrace_lambda',
    'must be in [0, 1]')
  r(c.reward_clipping in REWARD_CLIPPINGS, c, 'reward_clipping',
    f'must be one of {", ".join(REWARD_CLIPPINGS)}')
  r(c.optimizer in OPTIMIZERS, c, 'optimizer', f'must be one of {", ".join(OPTIMIZERS)}')
  r(_is_num(c.learning_rate) and c.learning_rate > 0, c, 'learning_rate',
    'must be a number > 0')
  parse_schedule(c.lr_schedule, 'lr_schedule')
  r(_is_num(c.rmsprop_decay) and 0 <= c.rmsprop_decay < 1, c, 'rmsprop_decay',
    'must be in [0, 1)')
  r(_is_num(c.rmsprop_momentum) and 0 <= c.rmsprop_momentum < 1, c,
    'rmsprop_momentum', 'must be in [0, 1)')
  r(_is_num(c.rmsprop_epsilon) and c.rmsprop_epsilon > 0, c, 'rmsprop_epsilon',
    'must be a number > 0')
  r(_is_num(c.adam_beta1) and 0 <= c.adam_beta1 < 1, c, 'adam_beta1', 'must be in [0, 1)')
  r(_is_num(c.adam_beta2) and 0 <= c.adam_beta2 < 1, c, 'adam_beta2', 'must be in [0, 1)')
  r(_is_num(c.adam_epsilon) and c.adam_epsilon > 0, c, 'adam_epsilon',
    'must be a number > 0')
  r(_is_num(c.grad_clip) and c.grad_clip >= 0, c, 'grad_clip',
    'must be a number >= 0 (global-norm clip; 0 disables clipping)')
  r(c.network in NETWORKS, c, 'network', f'must be one of {", ".join(NETWORKS)}')
  r(len(c.mlp_hidden_sizes) >= 1 and
    all(_is_int(h) and h >= 1 for h in c.mlp_hidden_sizes), c, 'mlp_hidden_sizes',
    'must be a comma-separated list of integers >= 1, e.g. 64,64')
  r(c.target_return is None or _is_num(c.target_return), c, 'target_return',
    'must be a number, or None to train for total_environment_frames')
  r(_is_int(c.seed) and 0 <= c.seed < 2**31, c, 'seed', 'must be an integer in [0, 2**31)')
  r(isinstance(c.logdir, str) and bool(c.logdir.strip()), c, 'logdir',
    'must be a directory path')
  for field in ('checkpoint_interval_secs', 'log_interval_secs'):
    r(_is_num(getattr(c, field)) and getattr(c, field) > 0, c, field,
      'must be a number of seconds > 0')

  # Cross-field rules.
  r(not (c.num_gpus and c.num_virtual_cpu_devices), c, 'num_virtual_cpu_devices',
    'must be 0 when --num_gpus is set (virtual CPU devices replace GPUs for testing)')
  r(c.batch_size % c.num_replicas == 0, c, 'batch_size',
    f'must be divisible by the {c.num_replicas} learner replicas (num_gpus='
    f'{c.num_gpus}, num_virtual_cpu_devices={c.num_virtual_cpu_devices}) so no unroll '
    'is dropped; use a multiple of the replica count')
  r(c.replay_proportion == 0 or c.replay_buffer_num_slots >= 1, c,
    'replay_buffer_num_slots',
    f'must be >= 1 when replay_proportion={c.replay_proportion} > 0')
  r(c.replay_buffer_num_slots == 0 or
    c.replay_buffer_num_slots >= math.ceil(c.replay_proportion), c,
    'replay_buffer_num_slots',
    f'must be >= ceil(replay_proportion)={math.ceil(c.replay_proportion)} so a '
    'fresh unroll can be followed by that many replays')
  r(c.total_environment_frames >= c.batch_size * c.unroll_length, c,
    'total_environment_frames',
    f'must be >= batch_size * unroll_length = {c.batch_size * c.unroll_length} '
    'frames, the size of one learner batch')
