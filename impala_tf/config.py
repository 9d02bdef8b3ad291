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
import types
from typing import Optional, Tuple

OPTIMIZERS = ('rmsprop', 'adam')
RMSPROP_STYLES = ('tf1', 'torch')
WEIGHT_INITS = ('glorot', 'orthogonal')
TORSO_ACTIVATIONS = ('relu', 'leaky_relu')
COMPUTE_DTYPES = ('float32', 'bfloat16')
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
ACTOR_REFRESH = ('unroll', 'step')
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



# What a resumed run (a --logdir with checkpoints) does when a field differs from the
# run that wrote them (rundir.check_resume):
# - RESUME_REFUSED: it changes the env or the variables a checkpoint holds (or how
#   they started, which a resumed run cannot change: weight_init); the run
#   stops with one line naming the field (rundir.resume_differences);
# - RESUME_WARNED: it changes what is learned; one warning, then the new value
#   (rundir.learning_differences; also total_environment_frames when a schedule is
#   relative to it);
# - RESUME_FREE: it changes how the run is carried out; the new value, silently.
RESUME_REFUSED = 'refused'
RESUME_WARNED = 'warned'
RESUME_FREE = 'free'
RESUME_POLICIES = (RESUME_REFUSED, RESUME_WARNED, RESUME_FREE)

# (key, title) of each section of --helpfull and docs/flags.md, in their order.
SECTIONS = (
    ('environment', 'Environment'),
    ('actors', 'Actors'),
    ('data', 'Data pipeline'),
    ('learner', 'Learner and devices'),
    ('loss', 'Loss'),
    ('optimizer', 'Optimizer'),
    ('network', 'Network'),
    ('run', 'Run'),
)

_SCHEDULE_HELP = (
    "'constant'; 'linear' (decay to 0 at --total_environment_frames); or "
    "piecewise-linear points 'FRAMES:VALUE,FRAMES:VALUE,...' over env frames with "
    'increasing FRAMES, VALUE being the value at that frame, held constant outside '
    'the points; FRAMES written P% are that share of --total_environment_frames '
    '(all points or none) and VALUE written Vx is V times the base value, so '
    "'0%:1x,30%:0.15x,100%:0x' follows --learning_rate and the run's length; the "
    'position is the fresh env frames trained on')


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


def option(default, section: str, help: str, rule, resume: str,  # pylint: disable=redefined-builtin
           choices: Optional[Tuple[str, ...]] = None, kind: Optional[str] = None):
  """A `Config` field with everything about it in one place.

  Args:
    default: the field's default (also its flag's).
    section: the key of its section in `SECTIONS`.
    help: the flag's help: the meaning (with the RLlib / scalable_agent name where
      ours differs), the unit and the valid range; absl appends the default and
      the type.
    rule: (predicate on a value of the field's type, or None; what is allowed): a
      value the predicate rejects is a `ConfigError` with that text.
    resume: one of `RESUME_POLICIES`.
    choices: for a string that takes one of a fixed set: the set (an enum flag).
    kind: 'network' for the string that is one of NETWORKS or MODULE:FUNCTION.

  Returns:
    A `dataclasses.field` whose (read-only) metadata holds the arguments.
  """
  return dataclasses.field(default=default, metadata=types.MappingProxyType(dict(
      section=section, help=help, rule=rule, resume=resume, choices=choices,
      kind=kind)))




@dataclasses.dataclass(frozen=True)
class Config:
  """Every option of a run. Field names equal the absl flag names.

  Each field is an `option`: its default, section, help, check and resume policy
  together; flags.py builds the flags and docs/flags.md from them.
  """
  # Environment.
  env: str = option(
      'CartPole-v1', 'environment',
      help=('Gymnasium environment id, e.g. CartPole-v1 (classic control, '
            'vector observations) or ALE/Pong-v5 (Atari with DeepMind '
            'preprocessing; needs the atari extra, ale-py).'),
      rule=((lambda v: bool(v.strip())),
            'must be a gymnasium env id such as CartPole-v1 or ALE/Pong-v5'),
      resume=RESUME_REFUSED)
  env_vectorization: str = option(
      'auto', 'environment',
      help=("How an actor steps its num_envs_per_actor envs: 'sync' (gymnasium "
            "SyncVectorEnv, in the actor's thread), 'async' (AsyncVectorEnv, "
            "one subprocess per env), 'auto' (the env's own batched "
            'implementation where gymnasium registers one, e.g. CartPole; else '
            "'sync'). Only 'auto' with EnvPool, which vectorizes in C++."),
      rule=_one_of(ENV_VECTORIZATIONS), choices=ENV_VECTORIZATIONS,
      resume=RESUME_FREE)
  env_backend: str = option(
      'auto', 'environment',
      help=("Atari emulator backend: 'gymnasium' (ale-py with gymnasium's "
            "wrappers, stepped as --env_vectorization says), 'envpool' "
            "(EnvPool's C++ thread pool; needs pip install envpool, in the "
            "atari extra), 'auto' (EnvPool for the Atari games it has when it "
            'is installed and --noop_max >= 1, else gymnasium; one line on '
            'stderr says so when envpool is installed but does not import). '
            'Both give the same preprocessing, episode ends, returns and '
            'observation layout. Non-Atari envs always use gymnasium. The '
            'backend a run used is written to its config.json and its first log '
            'line.'),
      rule=_one_of(ENV_BACKENDS), choices=ENV_BACKENDS,
      resume=RESUME_FREE)
  envpool_num_threads: int = option(
      0, 'environment',
      help=("With EnvPool: C++ threads of each actor's env pool; 0 is EnvPool's "
            "default, one per env up to the machine's cores (per actor: with "
            'many actors on many cores, set it to about cores / num_actors). '
            'Range: >= 0.'),
      rule=_ints(0),
      resume=RESUME_FREE)
  noop_max: int = option(
      30, 'environment',
      help=('Atari: up to this many no-op frames (a random number) after each '
            'reset (DeepMind preprocessing). 0 disables. Range: >= 0.'),
      rule=_ints(0),
      resume=RESUME_FREE)
  episodic_life: bool = option(
      False, 'environment',
      help=('Atari: a lost life ends the episode for the learner (terminated), '
            'as in the paper; the game goes on, and reported episode returns '
            'remain whole-game scores.'),
      rule=(None, 'must be True or False'),
      resume=RESUME_FREE)
  frame_stack: int = option(
      4, 'environment',
      help=('Atari: number of most recent 84x84 grayscale frames stacked into '
            'one observation (1 with --use_lstm: the LSTM replaces the stack). '
            'Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_REFUSED)
  max_episode_frames: int = option(
      108_000, 'environment',
      help=('Time limit of an episode in env frames: Atari emulator frames '
            '(108000 = 30 minutes of play), agent steps for other envs (which '
            'also keep their registered limit). Reaching it truncates the '
            'episode: bootstrapped, not terminal. Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  env_step_timeout_secs: float = option(
      60.0, 'environment',
      help=('--env_vectorization=async: seconds an actor waits for one step of '
            'its envs; an env that takes longer is treated as hung: the actor '
            'is restarted with fresh env processes (like an env that raises). '
            'Refused with EnvPool (no env processes). Range: > 0.'),
      rule=_positive('a number of seconds'),
      resume=RESUME_FREE)
  # Actors.
  num_actors: int = option(
      1, 'actors',
      help=('Actors, each stepping one vector env with a policy snapshot (a '
            'thread or a Ray actor process, see --actor_backend; RLlib: '
            'num_workers / num_env_runners). Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  num_envs_per_actor: int = option(
      8, 'actors',
      help=("Environments in each actor's vector env (RLlib: "
            'num_envs_per_worker). Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  unroll_length: int = option(
      10, 'actors',
      help=('T: agent steps per unroll; an unroll holds T+1 steps, overlapping '
            'the next by one (RLlib: rollout_fragment_length, formerly '
            'sample_batch_size; scalable_agent: unroll_length). Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  broadcast_interval: int = option(
      1, 'actors',
      help=("Learner updates between refreshes of the actors' policy snapshots "
            '(RLlib: broadcast_interval). Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  actor_refresh: str = option(
      'unroll', 'actors',
      help=("When an actor takes the newest published weights: 'unroll' (between "
            'its unrolls, as scalable_agent and RLlib) or \'step\' (before every '
            "vector step, as SEED RL's and Sample Factory's inference acts with the "
            'latest weights: the policy lag falls by about the updates made during '
            'one unroll; each unroll then records the mean learner step of the '
            "weights that acted in it). 'step' needs --actor_backend threads or "
            'processes (a Ray actor gets weights with each unroll request).'),
      rule=_one_of(ACTOR_REFRESH), choices=ACTOR_REFRESH,
      resume=RESUME_FREE)
  actor_backend: str = option(
      'threads', 'actors',
      help=("Where actors run: 'threads' (threads of the learner's process; "
            "cheapest start), 'processes' (one local child process each, "
            'unrolls and weights through shared memory: acting takes no share '
            "of the learner's interpreter lock) or 'ray' (one Ray actor process "
            'each, on this machine or a Ray cluster; needs the ray extra). All '
            'produce the same unrolls; see docs/scaling.md.'),
      rule=_one_of(ACTOR_BACKENDS), choices=ACTOR_BACKENDS,
      resume=RESUME_FREE)
  ray_address: str = option(
      '', 'actors',
      help=("With --actor_backend=ray: '' starts a local Ray instance sized to "
            'this machine, listening on 127.0.0.1 only, without dashboard, shut '
            "down at exit; 'auto' or an address (HOST:PORT of `ray start "
            '--head`) joins that cluster and leaves it running.'),
      rule=((lambda v: v == v.strip() and ' ' not in v),
            "must be '' (start a local Ray), 'auto' or the address of a "
            'running Ray cluster such as 10.0.0.1:6379, without spaces'),
      resume=RESUME_FREE)
  ray_connect_timeout_secs: float = option(
      60.0, 'actors',
      help=('With --actor_backend=ray and a --ray_address: seconds the cluster '
            'has to answer and accept this driver before the run stops with one '
            'line naming the address. Range: > 0.'),
      rule=_positive('a number of seconds'),
      resume=RESUME_FREE)
  ray_actor_resources: str = option(
      '{"CPU": 1}', 'actors',
      help=('With --actor_backend=ray: the Ray resources each actor reserves, a '
            'JSON object such as {"CPU": 1} or {"CPU": 1, "actor_node": 1} (a '
            'custom resource of `ray start --resources` places actors on those '
            'nodes); {} reserves nothing. Range: numbers >= 0.'),
      rule=_resources('ray_actor_resources'),
      resume=RESUME_FREE)
  max_actor_restarts: int = option(
      100, 'actors',
      help=('With --actor_backend=ray or processes: actor processes replaced '
            'over the whole run (all actors together; each replacement waits 1, '
            '2, 4, ... up to 30 s after its actor died again without an '
            'unroll); one more death stops the run with one line naming its '
            'cause. Range: >= 0.'),
      rule=_ints(0),
      resume=RESUME_FREE)
  actor_unroll_timeout_secs: float = option(
      300.0, 'actors',
      help=('With --actor_backend=ray: an actor that answers no unroll within '
            'this many seconds of starting on it (a hung env step) is killed '
            'and replaced, counting as a restart. Range: > 0.'),
      rule=_positive('a number of seconds'),
      resume=RESUME_FREE)
  ray_placement_timeout_secs: float = option(
      300.0, 'actors',
      help=('With --actor_backend=ray: seconds the run waits, at its start, for '
            'the Ray cluster to have the resources of all --num_actors actors '
            'available at once (a busy cluster freeing them, an autoscaling one '
            'adding nodes), saying what it waits for; then it stops with one '
            'line. Range: > 0.'),
      rule=_positive('a number of seconds'),
      resume=RESUME_FREE)
  ray_runtime_env: str = option(
      '', 'actors',
      help=("With --actor_backend=ray: '' (the actors' nodes have the code and "
            "packages already) or Ray's runtime_env for every actor as a JSON "
            'object with keys working_dir, py_modules, pip, env_vars, excludes, '
            'e.g. {"working_dir": "."} ships this checkout (impala_tf and your '
            'env modules) to nodes that do not have it; {"pip": [...]} installs '
            'packages there.'),
      rule=_runtime_env('ray_runtime_env'),
      resume=RESUME_FREE)
  # Data pipeline.
  batch_size: int = option(
      8, 'data',
      help=('Unrolls per learner update, split evenly across the learner '
            'replicas (RLlib: train_batch_size, which counts steps: batch_size '
            'x unroll_length). Range: >= 1, a multiple of the number of '
            'replicas.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  num_data_loader_buffers: int = option(
      1, 'data',
      help=('Parallel tf.data loaders (interleave cycle length) filling batches '
            'while the learner trains (RLlib: num_data_loader_buffers). Range: '
            '>= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  minibatch_buffer_size: int = option(
      1, 'data',
      help=('Ring of recent batches that reuse (num_sgd_iter > 1) interleaves '
            'over (RLlib: minibatch_buffer_size). Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  num_sgd_iter: int = option(
      1, 'data',
      help=('Times each batch is used for an SGD update (RLlib: num_sgd_iter). '
            'With minibatch_buffer_size 1 the learner makes the k updates on a '
            'batch in one call, fetching it once (so a call makes a multiple of '
            'k steps); with a larger ring, tf.data replays the ring. Range: >= '
            '1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  replay_proportion: float = option(
      0.0, 'data',
      help=('Replayed unrolls mixed in per fresh unroll: floor(p), plus one '
            'more with probability frac(p) (RLlib: replay_proportion). 0 '
            'disables replay. Range: >= 0.'),
      rule=_non_negative(
            'a number (replayed unrolls per fresh unroll)'),
      resume=RESUME_FREE)
  replay_buffer_num_slots: int = option(
      0, 'data',
      help=('Replay FIFO capacity in unrolls: replays are drawn uniformly from '
            'the last this many fresh unrolls (RLlib: replay_buffer_num_slots). '
            'Range: >= 0; >= max(1, ceil(replay_proportion)) when '
            'replay_proportion > 0.'),
      rule=((lambda v: v >= 0),
            'must be an integer >= 0 (unrolls kept for replay)'),
      resume=RESUME_FREE)
  learner_queue_size: int = option(
      1, 'data',
      help=("Capacity of the bounded queue from the actors to the learner's "
            'data pipeline, in actor chunks of num_envs_per_actor unrolls: it '
            'bounds the chunks queued and those thread actors are collecting '
            'together (an actor claims a slot before it acts); a full queue '
            'blocks the actors (RLlib: learner_queue_size, in batches). Range: '
            '>= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  claim_queue_slots: bool = option(
      False, 'data',
      help=('Thread actors claim a learner-queue slot before they collect an '
            'unroll, so the chunks queued and being collected together stay '
            'within --learner_queue_size and no finished chunk waits in an '
            "actor's hands (configs/pong_claims.cfg: policy lag about 6 learner "
            'steps instead of 17, the learner waiting for data about 10% of the '
            'time). Off: an actor waits for room before it acts, so with several '
            'actors two can collect for one slot. The same either way with one '
            'actor; --actor_backend processes and ray bound their chunks their '
            'own way (docs/design.md).'),
      rule=(None, 'must be True or False'),
      resume=RESUME_FREE)
  learner_queue_timeout: float = option(
      300.0, 'data',
      help=('Seconds the learner waits for data before stopping the run with an '
            'error (RLlib: learner_queue_timeout). Range: > 0.'),
      rule=_positive('a number of seconds'),
      resume=RESUME_FREE)
  # Learner and devices.
  learner_steps_per_call: int = option(
      1, 'learner',
      help=('Learner steps per call into TensorFlow: k steps run in one '
            'tf.while_loop over the data iterator, so the Python-to-TensorFlow '
            'call, the weights published to the actors and the metrics read are '
            'paid once per k steps (Keras: steps_per_execution). The update is '
            "the same; the actors' policy lags up to k - 1 steps more. Range: "
            '>= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  learner_jit: str = option(
      'auto', 'learner',
      help=("XLA for the learner's per-replica gradient (forward and backward "
            "pass, V-trace, losses): 'on', 'off', or 'auto' (what measured "
            "faster on the device type: off on the CPU, where XLA's "
            "convolutions are slower; GPUs not measured yet, so off). 'on' with "
            'several replicas needs no whole-batch sum before the gradient: not '
            'with --popart, --loss_reduction=mean or --normalize_advantages.'),
      rule=_one_of(LEARNER_JIT), choices=LEARNER_JIT,
      resume=RESUME_FREE)
  num_gpus: int = option(
      0, 'learner',
      help=('Learner GPUs, one MirroredStrategy replica each; each batch is '
            'split evenly across them. 0: learn on the CPU (RLlib: num_gpus). '
            'Range: >= 0.'),
      rule=_ints(0),
      resume=RESUME_FREE)
  num_virtual_cpu_devices: int = option(
      0, 'learner',
      help=('Split the CPU into this many logical devices, one learner replica '
            'each (multi-tower learning without GPUs, for testing). 0: the CPU '
            'is one device. Range: >= 0; 0 when --num_gpus is set.'),
      rule=(
            (lambda v: v >= 0),
            'must be an integer >= 0 (0: use the CPU as one device)'),
      resume=RESUME_FREE)
  tf_inter_op_threads: int = option(
      -1, 'learner',
      help=("Threads of TensorFlow's inter-op pool in the trainer process "
            '(RLlib: tf_session_args.inter_op_parallelism_threads). -1: auto, 1 '
            'where the learner is one CPU replica and thread actors act with '
            'numpy (a feed-forward MLP): there one thread measured 1.0-1.5x the '
            'env frames/s of the CartPole defaults and 1.2x the learner '
            'frames/s with --num_sgd_iter=4 on 2 cores (docs/benchmarks.md); '
            "else TensorFlow's default. 0: TensorFlow's default (one per core). "
            'Range: >= -1.'),
      rule=(
            (lambda v: v >= -1),
            "must be an integer >= -1 (-1: auto, 0: TensorFlow's default)"),
      resume=RESUME_FREE)
  num_learner_workers: int = option(
      1, 'learner',
      help=('Learner worker processes '
            '(tf.distribute.MultiWorkerMirroredStrategy over all their '
            'replicas; each worker has its own --num_actors actors). > 1 '
            'without TF_CONFIG: starts that many workers on this host, '
            'TF_CONFIG on 127.0.0.1 ports (TensorFlow listens on them on all '
            'interfaces: docs/scaling.md). A process started with a TF_CONFIG '
            'naming several workers is that worker (this flag then must be 1 or '
            'their number). --batch_size is the global batch. Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  learner_worker_timeout_secs: float = option(
      60.0, 'learner',
      help=('With --num_learner_workers > 1 (started on this host): seconds '
            'after one worker dies, or after a forwarded Ctrl-C / SIGTERM, '
            'before workers still running are killed; the death is one line '
            'naming the worker. Range: > 0.'),
      rule=_positive('a number of seconds'),
      resume=RESUME_FREE)
  stall_timeout_secs: float = option(
      600.0, 'learner',
      help=('Progress watchdog: a learner that makes no step, and gets no data, '
            'for this many seconds (at least twice --learner_queue_timeout, so '
            "data that stops is reported as such first; the first step's "
            'tracing included) stops the run with one line saying where it is '
            'stuck; with several learner workers the line names the worker the '
            'run waits for, from heartbeats in --logdir/heartbeats. 0: off. '
            'Range: >= 0.'),
      rule=_non_negative('a number of seconds (0: no watchdog)'),
      resume=RESUME_FREE)
  learner_backend: str = option(
      'local', 'learner',
      help=('Where --num_learner_workers > 1 (without TF_CONFIG) starts the '
            "workers: 'local' (processes on this host, TF_CONFIG on 127.0.0.1) "
            "or 'ray' (Ray actors at --ray_address, '' for a local Ray, each "
            'with --ray_learner_resources, TF_CONFIG wired from the nodes they '
            "landed on; needs pip install -e '.[ray]')."),
      rule=_one_of(LEARNER_BACKENDS), choices=LEARNER_BACKENDS,
      resume=RESUME_FREE)
  ray_learner_resources: str = option(
      '{"CPU": 1}', 'learner',
      help=('With --learner_backend=ray: the Ray resources each learner worker '
            'reserves, a JSON object such as {"CPU": 1} or {"GPU": 1} (give '
            '--num_gpus to match). Range: numbers >= 0.'),
      rule=_resources('ray_learner_resources'),
      resume=RESUME_FREE)
  # Loss.
  discounting: float = option(
      0.99, 'loss',
      help=('Discount per agent step, gamma (RLlib: gamma; scalable_agent: '
            'discounting). Range: [0, 1].'),
      rule=_unit_closed(),
      resume=RESUME_WARNED)
  baseline_cost: float = option(
      0.5, 'loss',
      help=('Weight of the baseline loss 0.5 * sum (v_s - V(x_s))^2 (RLlib: '
            'vf_loss_coeff; scalable_agent applies another 0.5). Range: >= 0.'),
      rule=_non_negative(),
      resume=RESUME_WARNED)
  entropy_cost: float = option(
      0.01, 'loss',
      help=('Weight of the entropy bonus (RLlib: entropy_coeff). Range: >= 0.'),
      rule=_non_negative(),
      resume=RESUME_WARNED)
  entropy_cost_schedule: str = option(
      '0%:1x,20%:0x', 'loss',
      help=('Schedule of entropy_cost (RLlib: entropy_coeff_schedule): '
            + _SCHEDULE_HELP + '.'),
      rule=_schedule('entropy_cost_schedule'),
      resume=RESUME_WARNED)
  vtrace: bool = option(
      True, 'loss',
      help=("Correct for the actors' stale policies with V-trace; --novtrace "
            'uses no importance weighting (RLlib: vtrace).'),
      rule=(None, 'must be True or False'),
      resume=RESUME_WARNED)
  clip_rho_threshold: Optional[float] = option(
      1.0, 'loss',
      help=('rho-bar: clip of the importance weights in the V-trace value '
            'targets (RLlib: vtrace_clip_rho_threshold). A number > 0, or none '
            'for no clipping.'),
      rule=_clip_threshold(),
      resume=RESUME_WARNED)
  clip_pg_rho_threshold: Optional[float] = option(
      1.0, 'loss',
      help=('rho-bar-pg: clip of the importance weights in the policy-gradient '
            'advantages (RLlib: vtrace_clip_pg_rho_threshold). A number > 0, or '
            'none for no clipping.'),
      rule=_clip_threshold(),
      resume=RESUME_WARNED)
  vtrace_lambda: float = option(
      1.0, 'loss',
      help=('lambda in the V-trace traces c_t = lambda * min(1, rho_t) (SEED '
            "RL); 1 is the paper's V-trace. Range: [0, 1]."),
      rule=_unit_closed(),
      resume=RESUME_WARNED)
  reward_clipping: str = option(
      'none', 'loss',
      help=("Rewards as the learner sees them: 'abs_one' clips to [-1, 1] (the "
            "paper's Atari setting), 'soft_asymmetric' squashes with tanh and "
            "scales negatives by 0.3 (scalable_agent, DMLab), 'none' leaves "
            'them. Reported returns are never clipped.'),
      rule=_one_of(REWARD_CLIPPINGS), choices=REWARD_CLIPPINGS,
      resume=RESUME_WARNED)
  reward_scale: float = option(
      1.0, 'loss',
      help=('Multiply rewards by this before --reward_clipping, as the learner '
            "sees them (e.g. 0.01 brings CartPole's value targets near 1). "
            'Reported returns are never scaled. Range: > 0.'),
      rule=_positive(),
      resume=RESUME_WARNED)
  loss_reduction: str = option(
      'sum', 'loss',
      help=("'sum': every loss term is a sum over the T x B valid steps of the "
            "batch (the paper, scalable_agent); 'mean': divided by the number "
            'of valid steps in the whole batch (RLlib). The same update on any '
            'number of replicas either way; docs/flags.md says how learning '
            'rate, grad_clip and adam_epsilon translate between them.'),
      rule=_one_of(LOSS_REDUCTIONS), choices=LOSS_REDUCTIONS,
      resume=RESUME_WARNED)
  popart: bool = option(
      True, 'loss',
      help=('PopArt value normalisation (van Hasselt et al. 2016; Hessel et al. '
            '2019): the value head predicts (V - mu) / sigma from running '
            'moments of the V-trace targets, rescaled so its outputs in return '
            'units are preserved when mu and sigma move; the baseline loss and '
            'the policy-gradient advantages are divided by sigma, so the step '
            'no longer depends on the reward scale.'),
      rule=(None, 'must be True or False'),
      resume=RESUME_FREE)
  popart_beta: float = option(
      1e-2, 'loss',
      help=("Step size of PopArt's running first and second moments of the "
            "V-trace targets (debiased like Adam's, so the first batch sets "
            'them). Hessel et al. use 3e-4 on Atari. Range: (0, 1].'),
      rule=((lambda v: _finite(v) and 0 < v <= 1), 'must be in (0, 1]'),
      resume=RESUME_FREE)
  popart_sigma_floor: float = option(
      0.1, 'loss',
      help=("PopArt's sigma is kept at least this fraction of the largest "
            'spread of the targets so far: when the targets come to be all '
            'alike (every episode at a time limit) their spread would shrink '
            'towards 0 and blow the normalised value errors up by 1/sigma until '
            'the value term swamps the step. Relative to that peak, the floor '
            'moves with neither the scale nor the shift of the returns. 0: only '
            'the fixed bound 1e-4. Range: [0, 1].'),
      rule=((lambda v: _finite(v) and 0 <= v <= 1),
            'must be in [0, 1] (a fraction of the largest '
            'spread so far)'),
      resume=RESUME_FREE)
  ppo_clip: float = option(
      0.0, 'loss',
      help=('Clip range epsilon of a clipped-surrogate policy loss (APPO, as in '
            'RLlib and Sample Factory): -min(r A, clip(r, 1 - eps, 1 + eps) A), '
            "r the ratio of the learner's policy to the behaviour policy of the "
            "action, A V-trace's policy-gradient advantage; value targets stay "
            "V-trace's. It bounds how far a batch used --num_sgd_iter times can "
            "move the policy. 0: IMPALA's -log pi(a) A. Range: [0, 1)."),
      rule=((lambda v: _finite(v) and 0 <= v < 1),
            'must be in [0, 1) (0: IMPALA\'s policy loss; PPO uses 0.1-0.2)'),
      resume=RESUME_WARNED)
  normalize_advantages: bool = option(
      False, 'loss',
      help=('Normalise the policy-gradient advantages to zero mean and unit '
            'variance over the valid steps of each batch (the whole batch, on '
            'every replica), as PPO implementations do; the advantages of a '
            'batch then never all push the same way.'),
      rule=(None, 'must be True or False'),
      resume=RESUME_FREE)
  loss_term_grad_norms: bool = option(
      True, 'loss',
      help=('Log the gradient norm of each weighted loss term (policy, '
            'baseline, entropy) on the same batch (grad_norm_policy, '
            'grad_norm_baseline, grad_norm_entropy): three backward passes '
            'instead of one, paid only on the learner call just before each '
            'metrics line (and the first; on every call with several learner '
            'workers).'),
      rule=(None, 'must be True or False'),
      resume=RESUME_FREE)
  # Optimizer.
  optimizer: str = option(
      'adam', 'optimizer',
      help=("'rmsprop' with the original IMPALA (TF1) semantics: epsilon inside "
            "the square root, accumulator starting at 1; or 'adam' (RLlib: "
            'opt_type).'),
      rule=_one_of(OPTIMIZERS), choices=OPTIMIZERS,
      resume=RESUME_REFUSED)
  learning_rate: float = option(
      0.002, 'optimizer',
      help=('Initial learning rate (RLlib: lr). Range: > 0.'),
      rule=_positive(),
      resume=RESUME_WARNED)
  lr_schedule: str = option(
      '0%:1x,20%:0.25x,50%:0.05x,100%:0x', 'optimizer',
      help=('Schedule of the learning rate (RLlib: lr_schedule): '
            + _SCHEDULE_HELP + ". The paper uses 'linear'."),
      rule=_schedule('lr_schedule'),
      resume=RESUME_WARNED)
  rmsprop_decay: float = option(
      0.99, 'optimizer',
      help=('RMSProp decay of the mean square (RLlib: decay). Range: [0, 1).'),
      rule=_unit_open(),
      resume=RESUME_FREE)
  rmsprop_momentum: float = option(
      0.0, 'optimizer',
      help=('RMSProp momentum (RLlib: momentum). Range: [0, 1).'),
      rule=_unit_open(),
      resume=RESUME_REFUSED)
  rmsprop_epsilon: float = option(
      0.01, 'optimizer',
      help=('RMSProp epsilon: added inside the square root with '
            '--rmsprop_style=tf1 (RLlib: epsilon; scalable_agent: 0.1), to the '
            'root with torch. Range: > 0.'),
      rule=_positive(),
      resume=RESUME_FREE)
  rmsprop_style: str = option(
      'tf1', 'optimizer',
      help=("RMSProp's form. tf1 (the paper's, scalable_agent's, TF1's "
            'RMSPropOptimizer): w -= lr g / sqrt(ms + epsilon), ms starting at '
            "1. torch (PyTorch's torch.optim.RMSprop, TorchBeast's): w -= lr g "
            '/ (sqrt(ms) + epsilon), ms starting at 0. With epsilon 0.01 and '
            'small gradients a torch step is up to 10x a tf1 step at the same '
            'learning rate; see "RMSProp: tf1 or torch" below.'),
      rule=_one_of(RMSPROP_STYLES), choices=RMSPROP_STYLES,
      resume=RESUME_WARNED)
  adam_beta1: float = option(
      0.9, 'optimizer',
      help=('Adam beta1. Range: [0, 1).'),
      rule=_unit_open(),
      resume=RESUME_FREE)
  adam_beta2: float = option(
      0.999, 'optimizer',
      help=('Adam beta2. Range: [0, 1).'),
      rule=_unit_open(),
      resume=RESUME_FREE)
  adam_epsilon: float = option(
      1e-7, 'optimizer',
      help=('Adam epsilon. Range: > 0.'),
      rule=_positive(),
      resume=RESUME_FREE)
  grad_clip: float = option(
      40.0, 'optimizer',
      help=('Clip of the global gradient norm, applied once after the '
            'cross-replica all-reduce (RLlib: grad_clip). 0 disables clipping. '
            'Range: >= 0.'),
      rule=_non_negative('a number (global-norm clip; 0 disables clipping)'),
      resume=RESUME_WARNED)
  max_nonfinite_updates: int = option(
      10, 'optimizer',
      help=('An update whose loss or gradient is NaN or Inf is skipped (weights '
            'and optimizer slots unchanged; counted as nonfinite_updates in the '
            'metrics); this many in a row stop the run with an error, keeping '
            'the last checkpoint. Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  # Network.
  network: str = option(
      'auto', 'network',
      help=("Torso: 'mlp' for vector observations, 'shallow' or 'deep' (ResNet) "
            "for images (paper, Fig. 3); 'auto' picks mlp for vector "
            'observations and deep for images; or MODULE:FUNCTION, your own '
            'torso: FUNCTION(observation_space, action_space) returns a Keras '
            'model or layer, a tf.Module or a callable mapping float32 [B, '
            '*obs_shape] to [B, F]; impala_tf adds the heads and the LSTM core '
            '(docs/library.md).'),
      rule=((lambda v: v in NETWORKS or is_user_network(v)), NETWORK_ALLOWED),
      resume=RESUME_REFUSED, kind='network')
  mlp_hidden_sizes: Tuple[int, ...] = option(
      (64, 64), 'network',
      help=('Widths of the hidden layers of the mlp torso, comma-separated. '
            'Range: one or more integers >= 1.'),
      rule=(
            (lambda v: len(v) >= 1 and all(_is_int(h) and h >= 1 for h in v)),
            'must be one or more integers >= 1, e.g. 64,64 (a tuple or list of ints '
            'in Python)'),
      resume=RESUME_REFUSED)
  use_lstm: bool = option(
      False, 'network',
      help=('Add an LSTM core after the torso, fed the torso output, the '
            'one-hot previous action and the clipped previous reward; its state '
            'resets where an episode starts.'),
      rule=(None, 'must be True or False'),
      resume=RESUME_REFUSED)
  lstm_size: int = option(
      256, 'network',
      help=('Units of the LSTM core. Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_REFUSED)
  weight_init: str = option(
      'glorot', 'network',
      help=("How the built-in networks' kernels start (biases start at 0 either "
            "way). glorot: Glorot uniform, the policy logits scaled by 0.01. "
            "orthogonal (OpenAI Baselines', CleanRL's and SB3's): orthogonal, "
            'gain sqrt(2) in the torso, 0.01 for the policy logits, 1 for the '
            'value head (the shallow torso\'s pre-activations start 2.6x, 14x '
            'and 11x larger than with glorot on Pong frames: docs/pong.md). '
            'The LSTM core and a user torso are not affected.'),
      rule=_one_of(WEIGHT_INITS), choices=WEIGHT_INITS,
      resume=RESUME_REFUSED)
  torso_activation: str = option(
      'relu', 'network',
      help=("The nonlinearity between the built-in torsos' layers. relu (the "
            "paper's). leaky_relu: slope 0.01 below zero, so a unit whose input "
            'stays negative still learns (with relu, 14 of the shallow torso\'s '
            '16 first-layer channels end dead on Pong: docs/pong.md). Orthogonal '
            'kernels keep the gain sqrt(2) either way. A user torso is not '
            'affected.'),
      rule=_one_of(TORSO_ACTIVATIONS), choices=TORSO_ACTIVATIONS,
      resume=RESUME_REFUSED)
  compute_dtype: str = option(
      'float32', 'network',
      help=("The precision the built-in torsos compute in, on the actors and the "
            'learner alike. float32: everything. bfloat16 (mixed precision, as '
            "Keras's mixed_bfloat16): the torso's inputs, kernels and activations "
            'in bfloat16, its output cast back to float32; variables, the LSTM core, '
            'the heads, V-trace, the losses and the optimizer stay float32, so no '
            'loss scaling is needed. Faster where the hardware multiplies bfloat16 '
            '(GPUs since Ampere, TPUs, CPUs with AVX512_BF16 or AMX: docs/'
            'benchmarks.md); elsewhere TensorFlow emulates it, slowly. A user torso '
            'chooses its own precision (float32 only).'),
      rule=_one_of(COMPUTE_DTYPES), choices=COMPUTE_DTYPES,
      resume=RESUME_WARNED)
  shared_torso: Optional[bool] = option(
      None, 'network',
      help=('Whether the policy and value heads share one torso. Unset (the '
            'default): a separate value MLP of --mlp_hidden_sizes for an mlp '
            "torso without LSTM (the layout of SB3's PPO; it keeps the value "
            'term, large while the value learns the return scale, from '
            'collapsing the policy through the shared features: '
            'docs/design.md), one shared torso otherwise (the paper). '
            '--shared_torso shares it always; --noshared_torso needs the mlp '
            'torso without LSTM.'),
      rule=(None, 'must be True, False or None (auto: a separate value MLP '
            'for an mlp torso without LSTM, one shared torso otherwise)'),
      resume=RESUME_REFUSED)
  # Run.
  total_environment_frames: int = option(
      1_000_000, 'run',
      help=('Stop after this many env frames (agent steps x action repeat; 4 '
            'for Atari, 1 otherwise); also the horizon of linear schedules '
            '(scalable_agent: total_environment_frames; RLlib: stop '
            'timesteps_total). Range: >= batch_size x unroll_length.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  target_return: Optional[float] = option(
      None, 'run',
      help=('Stop early once the mean episode return over the last 100 episodes '
            'reaches this. none: train for total_environment_frames.'),
      rule=((lambda v: v is None or _finite(v)),
            'must be a number, or None to train for '
            'total_environment_frames'),
      resume=RESUME_FREE)
  seed: int = option(
      0, 'run',
      help=('Seed of the network initialisation, actors and environments. '
            'Range: [0, 2^31).'),
      rule=((lambda v: 0 <= v < 2**31), 'must be an integer in [0, 2**31)'),
      resume=RESUME_FREE)
  logdir: str = option(
      '/tmp/impala_tf', 'run',
      help=('Directory of the run: config.json, checkpoints/, TensorBoard '
            'events, metrics.jsonl, saved_policy/. A run started on a logdir '
            'with checkpoints resumes from the latest.'),
      rule=((lambda v: bool(v.strip())), 'must be a directory path'),
      resume=RESUME_FREE)
  checkpoint_interval_secs: float = option(
      600.0, 'run',
      help=('Seconds between checkpoints (one is also written at the end). '
            'Range: > 0.'),
      rule=_positive('a number of seconds'),
      resume=RESUME_FREE)
  keep_checkpoints: int = option(
      3, 'run',
      help=('Most recent checkpoints kept in logdir. Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  log_interval_secs: float = option(
      5.0, 'run',
      help=('Seconds between metrics lines (console, metrics.jsonl, '
            'TensorBoard). Range: > 0.'),
      rule=_positive('a number of seconds'),
      resume=RESUME_FREE)
  eval_interval_frames: int = option(
      0, 'run',
      help=('Evaluate the policy every this many env frames while training '
            "(RLlib: evaluation_interval; SB3: EvalCallback's eval_freq): "
            '--eval_episodes whole episodes on envs of their own with the '
            'latest weights, in a thread the learner never waits for; logged as '
            'eval_return_mean (and eval_episodes, eval_env_frames) in '
            'metrics.jsonl and eval/ in TensorBoard. 0: no evaluation. Range: '
            '>= 0.'),
      rule=((lambda v: v >= 0),
            'must be an integer >= 0 (env frames between '
            'evaluations; 0: none)'),
      resume=RESUME_FREE)
  eval_episodes: int = option(
      10, 'run',
      help=('Episodes of each periodic evaluation. Range: >= 1.'),
      rule=_ints(1),
      resume=RESUME_FREE)
  eval_greedy: bool = option(
      True, 'run',
      help=('Periodic evaluations act greedily (argmax of the policy); '
            '--noeval_greedy samples from it, as the actors do.'),
      rule=(None, 'must be True or False'),
      resume=RESUME_FREE)

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




_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(Config)}
_RULES = {f.name: f.metadata['rule'] for f in dataclasses.fields(Config)}
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
  require(c.compute_dtype == 'float32' or not is_user_network(c.network),
          'compute_dtype',
          'must be float32 with a user torso (--network=MODULE:FUNCTION): the '
          'torso chooses its own precision; bfloat16 applies to the built-in '
          'torsos')
  if c.learner_backend == 'ray' and c.num_learner_workers > 1 and c.num_gpus:
    asked = c.ray_learner_resources_dict.get('GPU', 0)
    require(asked >= c.num_gpus, 'ray_learner_resources',
            f'must ask for "GPU": {c.num_gpus} or more with --num_gpus={c.num_gpus} '
            f'(it asks for {asked:g}): Ray gives each learner worker only the GPUs '
            'it reserved, so without them workers would share or miss GPUs')
  require(c.actor_refresh != 'step' or c.actor_backend != 'ray', 'actor_refresh',
          "must be 'unroll' with --actor_backend=ray (a Ray actor gets the weights "
          "with each unroll request, so it cannot take newer ones between steps); "
          "'step' works with threads and processes")
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
