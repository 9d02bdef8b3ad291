"""EnvPool backend for Atari: the same preprocessing as `environments`, in C++.

EnvPool (https://github.com/sail-sg/envpool) steps a pool of ALE emulators on its
own C++ thread pool, with DeepMind's preprocessing built in. This module maps our
flags onto EnvPool's Atari options and presents the pool to the actor as a
`gymnasium.vector.VectorEnv` with the same interface, spaces, dtypes, NEXT_STEP
autoreset and `game_over` info as `environments.make_vector_env`'s gymnasium path,
so a checkpoint trained on one backend evaluates on the other. Like
`environments`, it never imports TensorFlow.

Option mapping (ours -> EnvPool):
  * frame skip 4 with a max-pool over the last two frames, 84x84 grayscale with
    INTER_AREA resizing: EnvPool's defaults (`frame_skip=4`, `img_height=
    img_width=84`, `gray_scale=True`, `use_inter_area_resize=True`); both
    backends read the ALE's grayscale palette, so their frames are identical
    for identical emulator states.
  * `frame_stack` (1 with `use_lstm`): kept by the adapter from EnvPool's
    single frames (`stack_num=1`), channels-last `[84, 84, C]` uint8 as ours
    (EnvPool's own stack is channels-first, and it does not restart the stack
    after a lost life as gymnasium's FrameStackObservation does).
  * `noop_max` -> `noop_max`: both take 1..noop_max no-op frames (uniform) after
    a reset. EnvPool cannot take zero no-ops (`noop_max=0` crashes it), so
    `noop_max=0` needs the gymnasium backend (`auto` picks it).
  * sticky actions: `repeat_action_probability` from the gymnasium id's
    registration (0.25 for `ALE/*-v5`, 0.0 for `*NoFrameskip-v4`) unless given;
    EnvPool's own default is 0.0 for every id, so it is always passed.
  * rewards unclipped (`reward_clip=False`); no fire on reset
    (`use_fire_reset=False`, EnvPool's default is True); the minimal action set
    unless the id asks for the full one.
  * `episodic_life` is done here, not by EnvPool (whose option differs: after
    a lost life it takes 1..noop_max no-op frames, and in EnvPool 1.2.5 a
    time limit reached with lives left does not restart the game). The pool
    runs whole games; the adapter does what `environments.EpisodicLifeEnv`
    does: a step that loses a life (lives drop, game not over) reports
    `terminated=True`; the next step ignores its action, steps the env with
    the no-op action (4 frames) and reports that observation as the first of
    the next episode, reward 0. Every step's info carries `game_over` (bool
    `[B]`, mask `_game_over`), the real end of a game (or the time limit), so
    returns are reported per whole game.
  * `max_episode_frames` -> `max_episode_steps = ceil((max_episode_frames - 1)
    / 4)` agent steps, counted from the end of the reset no-ops (EnvPool counts
    agent steps; the ALE under gymnasium counts every frame, no-ops included).
    The two agree exactly when the reset takes one no-op frame (`noop_max=1`);
    with more no-ops EnvPool truncates up to (noop_max - 1) / 4 agent steps
    later (<= 8 of the default 27,000). Truncation is `truncated`, never
    `terminated`.

Seeds: env `i` of a pool made with `seed` is seeded with `seed + i`, as in
gymnasium. EnvPool derives the ALE's and the no-op sampler's random streams from
that seed differently from ale-py, so the two backends are not step-for-step
identical unless nothing is random (sticky actions 0, `noop_max=1`).
`reset(seed=s)` rebuilds the pool with seed `s` (EnvPool seeds only at
construction), so a reseeded reset is reproducible as with gymnasium.

Threads: each pool steps its envs on `num_threads` C++ threads
(`--envpool_num_threads`); 0 keeps EnvPool's default, one thread per env up to
the machine's cores, for each actor's pool.

Choosing the backend (`resolve_backend`, `check_config`): 'auto' takes EnvPool
for the Atari games it has when envpool is installed and imports, and says in
one line on stderr why it falls back to gymnasium when envpool is installed but
does not import. With EnvPool, `--env_vectorization` (other than 'auto') and
`--env_step_timeout_secs` (other than its default) are refused: EnvPool has no
vectorization modes and no env processes to time out.

Batching: the pool runs in EnvPool's synchronous mode (`batch_size = num_envs`,
the actor steps all its envs at once); the C++ threads step the envs in parallel
while the GIL is released, and the driver's actor threads overlap one actor's
policy with another's env step. See docs/design.md ("EnvPool batching") for the
measurements behind this choice.
"""

import importlib.util
import math
import sys
from typing import Any, Dict, Optional

import gymnasium as gym
from gymnasium.vector import AutoresetMode
import numpy as np

from impala_tf.config import Config
from impala_tf.config import ConfigError
from impala_tf import errors

INSTALL_HINT = 'pip install -e ".[atari]" (or pip install envpool)'
_FRAME_SKIP = 4
_SCREEN = 84
_DEFAULT_STICKY = 0.25  # ale-py's default repeat_action_probability.
_task_ids = None  # ALE game name ('pong') -> EnvPool id ('Pong-v5').
_UNSET = object()
_import_error = _UNSET  # Why `import envpool` failed ('' when it worked).
_warned = set()  # Fallback lines already printed by this process.


def available() -> bool:
  """Whether envpool is installed (without importing it)."""
  return importlib.util.find_spec('envpool') is not None


def _import_envpool():
  import envpool  # pylint: disable=g-import-not-at-top,unused-import


def import_error() -> str:
  """Why `import envpool` fails ('' when it imports); tried once per process."""
  global _import_error
  if _import_error is _UNSET:
    try:
      _import_envpool()
      _import_error = ''
    except Exception as e:  # pylint: disable=broad-except
      # ImportError, or whatever a broken build raises at import (OSError for a
      # missing shared library, AttributeError for a numpy it was not built for).
      _import_error = errors.one_line(
          f'{type(e).__name__}: {str(e).strip() or "no message"}')
  return _import_error


def _envpool_task_ids() -> Dict[str, str]:
  """ALE game name -> EnvPool Atari id, from EnvPool's registry (cached)."""
  global _task_ids
  if _task_ids is None:
    from envpool.registration import registry  # pylint: disable=g-import-not-at-top
    import envpool  # pylint: disable=g-import-not-at-top,unused-import
    _task_ids = {}
    for task_id, (module, _, kwargs) in registry.specs.items():
      if module == 'envpool.atari' and 'task' in kwargs:
        _task_ids.setdefault(kwargs['task'], task_id)
  return _task_ids


def _gym_kwargs(env_id: str) -> Optional[Dict[str, Any]]:
  """The registered kwargs of an ale-py gymnasium id, or None if not Atari.

  (Looked up here rather than with `environments`, which imports this module.)
  """
  name = env_id.split(':', 1)[-1]
  spec = gym.registry.get(name)
  if spec is None:
    try:
      import ale_py  # pylint: disable=g-import-not-at-top
    except ImportError:
      return None
    gym.register_envs(ale_py)
    spec = gym.registry.get(name)
  if (spec is None or not isinstance(spec.entry_point, str) or
      not spec.entry_point.startswith('ale_py') or 'game' not in spec.kwargs):
    return None
  return dict(spec.kwargs)


def task_id(env_id: str) -> Optional[str]:
  """The EnvPool id that runs `env_id`'s game ('ALE/Pong-v5' -> 'Pong-v5').

  Args:
    env_id: a gymnasium env id.

  Returns:
    str, or None when `env_id` is not an Atari game EnvPool has, or envpool is
    not installed.
  """
  if not available():
    return None
  kwargs = _gym_kwargs(env_id)
  if kwargs is None:
    return None
  return _envpool_task_ids().get(kwargs['game'])


def _broken(env_id: str) -> bool:
  """Whether `env_id` is an Atari game and the installed envpool fails to import
  (tried only for Atari games)."""
  return _gym_kwargs(env_id) is not None and bool(import_error())


def unsupported_reason(env_id: str, noop_max: int) -> Optional[str]:
  """Why EnvPool cannot run `env_id` with these flags, or None if it can."""
  if not available():
    return f'envpool is not installed; {INSTALL_HINT}'
  if _broken(env_id):
    return (f'envpool is installed but does not import ({import_error()}); '
            f'reinstall it ({INSTALL_HINT}) or use --env_backend=gymnasium')
  if task_id(env_id) is None:
    return f'EnvPool has no Atari game for env {env_id!r}'
  if noop_max < 1:
    return ('EnvPool always takes at least one no-op frame after a reset; '
            'noop_max=0 needs --env_backend=gymnasium')
  return None


def resolve_backend(backend: str, env_id: str, noop_max: int = 30) -> str:
  """'auto' -> 'envpool' where it can run `env_id`, else 'gymnasium'.

  Args:
    backend: 'gymnasium', 'envpool' or 'auto'.
    env_id: a gymnasium env id.
    noop_max: the run's noop_max.

  Returns:
    'gymnasium' or 'envpool'.

  Raises:
    ConfigError: for field 'env_backend', when 'envpool' is asked for and
      cannot run (not installed: the message says what to install).
  """
  if backend == 'gymnasium':
    return backend
  reason = unsupported_reason(env_id, noop_max)
  if backend == 'envpool':
    if reason is not None:
      raise ConfigError('env_backend', backend, reason)
    return backend
  if reason is not None and available() and _broken(env_id):
    line = (f'impala_tf: --env_backend=auto: {reason.split(";")[0]}; using '
            'gymnasium')
    if line not in _warned:
      _warned.add(line)
      print(line, file=sys.stderr, flush=True)
  return 'gymnasium' if reason is not None else 'envpool'


def check_config(config) -> str:
  """The backend a run uses, after refusing the flags EnvPool ignores.

  Args:
    config: an `impala_tf.config.Config` (its env, env_backend, noop_max,
      env_vectorization, env_step_timeout_secs).

  Returns:
    'gymnasium' or 'envpool' (`resolve_backend`).

  Raises:
    ConfigError: as `resolve_backend`; or for `env_vectorization` (not 'auto')
      or `env_step_timeout_secs` (not its default) when the backend is EnvPool.
  """
  used = resolve_backend(config.env_backend, config.env, config.noop_max)
  if used == 'envpool':
    why = (f'has no effect on EnvPool (--env_backend={config.env_backend} runs '
           f'{config.env} on EnvPool\'s C++ threads); leave it out or use '
           '--env_backend=gymnasium')
    if config.env_vectorization != 'auto':
      raise ConfigError('env_vectorization', config.env_vectorization, why)
    if float(config.env_step_timeout_secs) != Config.env_step_timeout_secs:
      raise ConfigError('env_step_timeout_secs', config.env_step_timeout_secs, why)
  return used


class EnvPoolVectorEnv(gym.vector.VectorEnv):
  """An EnvPool Atari pool behind gymnasium's VectorEnv interface.

  Observations uint8 `[num_envs, 84, 84, C]` (a new array every step), rewards
  float32 `[num_envs]`, terminated / truncated bool `[num_envs]`. Autoreset is
  NEXT_STEP (EnvPool's own behaviour: the step after an episode end ignores its
  action and returns the first observation of the next episode, reward 0).
  Infos: `lives` int32 `[num_envs]`, `elapsed_step` int32 `[num_envs]` (agent
  steps since the game started) and, with episodic life, `game_over` bool
  `[num_envs]` (mask `_game_over`, all True).

  The pool returns single frames (`stack_num=1`); the frame stack is kept here,
  as gymnasium's `FrameStackObservation` keeps it: shifted by one frame per
  step, and filled with the first frame at every episode start (a new game, or
  the no-op step after a lost life). It also gives the channels-last layout
  without a transposed copy of EnvPool's channels-first stack.

  Args:
    make_kwargs: keyword arguments of `envpool.make` (without `seed`,
      `num_envs`, `batch_size`, `stack_num`).
    num_envs: envs in the pool.
    seed: env `i` is seeded with `seed + i`.
    frame_stack: C, frames per observation.
    episodic_life: see the module docstring.
  """

  metadata = {'autoreset_mode': AutoresetMode.NEXT_STEP}

  def __init__(self, make_kwargs: Dict[str, Any], num_envs: int, seed: int,
               frame_stack: int, episodic_life: bool):
    self._make_kwargs = dict(make_kwargs)
    self.num_envs = num_envs
    self._stack = int(frame_stack)
    self._episodic_life = episodic_life
    self._pool = None
    self._seed = None
    self._used = False  # Reset or stepped since the pool was built.
    self._obs = None  # The last observation, uint8 [B, 84, 84, C].
    self._pool_ended = np.zeros(num_envs, bool)  # Next pool step is a reset.
    # Episodic life: lives after the last step, and the envs whose next step is
    # the no-op step that starts the episode after a lost life.
    self._lives = np.zeros(num_envs, np.int32)
    self._life_reset = np.zeros(num_envs, bool)
    self._build(seed)
    self.single_observation_space = gym.spaces.Box(
        low=0, high=255, shape=(_SCREEN, _SCREEN, self._stack), dtype=np.uint8)
    self.single_action_space = gym.spaces.Discrete(int(self._pool.action_space.n))
    self.observation_space = gym.vector.utils.batch_space(
        self.single_observation_space, num_envs)
    self.action_space = gym.vector.utils.batch_space(
        self.single_action_space, num_envs)
    self.metadata = dict(self.metadata)

  def _build(self, seed: int):
    import envpool  # pylint: disable=g-import-not-at-top
    if self._pool is not None:
      self._pool.close()
    # EnvPool asserts int32 seeds (for seed + i too).
    self._seed = int(seed) % (2**31 - self.num_envs)
    self._pool = envpool.make(env_type='gymnasium', num_envs=self.num_envs,
                              batch_size=self.num_envs, seed=self._seed,
                              stack_num=1, **self._make_kwargs)
    self._used = False

  def _push(self, frames: np.ndarray, start: np.ndarray) -> np.ndarray:
    """The next stacked observation from EnvPool's `[B, 1, 84, 84]` frames.

    Args:
      frames: uint8 `[B, 1, 84, 84]`.
      start: bool `[B]`, envs whose frame starts an episode (stack filled).

    Returns:
      uint8 `[B, 84, 84, C]`, a new array.
    """
    frame = frames[:, 0]
    if self._stack == 1:
      obs = frame[..., None].copy()
    else:
      obs = np.empty((self.num_envs, _SCREEN, _SCREEN, self._stack), np.uint8)
      if start.all():
        obs[...] = frame[..., None]
      else:
        obs[..., :-1] = self._obs[..., 1:]
        obs[..., -1] = frame
        if start.any():
          obs[start] = frame[start][..., None]
    self._obs = obs
    return obs

  def _infos(self, info, game_over) -> Dict[str, Any]:
    out = {'lives': np.asarray(info['lives']),
           'elapsed_step': np.asarray(info['elapsed_step'])}
    if self._episodic_life:
      out['game_over'] = game_over
      out['_game_over'] = np.ones(self.num_envs, bool)
    return out

  def reset(self, *, seed: Optional[int] = None,
            options: Optional[Dict[str, Any]] = None):
    """Resets every env; with a seed, env `i` is reseeded with `seed + i`.

    Returns:
      (observations uint8 `[num_envs, 84, 84, C]`, infos).
    """
    del options
    if seed is not None and (
        self._used or int(seed) % (2**31 - self.num_envs) != self._seed):
      self._build(seed)
    frames, info = self._pool.reset()
    self._used = True
    self._lives = np.asarray(info['lives'], np.int32)
    self._life_reset[:] = False
    self._pool_ended[:] = False
    self._obs = None
    obs = self._push(frames, np.ones(self.num_envs, bool))
    return obs, self._infos(info, np.zeros(self.num_envs, bool))

  def step(self, actions):
    """Steps every env with `actions` int `[num_envs]` (see the class doc)."""
    self._used = True
    actions = np.asarray(actions, np.int32)
    life_reset = self._life_reset
    if life_reset.any():
      actions = np.where(life_reset, 0, actions).astype(np.int32)
    frames, reward, terminated, truncated, info = self._pool.step(actions)
    # EnvPool reports a game that ends on the time-limit step as truncated only;
    # its info['terminated'] still says the game ended, and gymnasium's TimeLimit
    # reports both (no bootstrap from a lost game).
    terminated = np.asarray(terminated, bool) | np.asarray(
        info.get('terminated', False), bool)
    truncated = np.asarray(truncated, bool)
    reward = np.asarray(reward, np.float32)
    game_over = terminated | truncated
    obs = self._push(frames, self._pool_ended | life_reset)
    self._pool_ended = game_over
    if not self._episodic_life:
      return obs, reward, terminated, truncated, self._infos(info, game_over)
    lives = np.asarray(info['lives'], np.int32)
    # A life lost on the time-limit step ends the episode as terminated (and
    # truncated), as `environments.EpisodicLifeEnv` under TimeLimit says; the
    # game is over then, so the pool restarts it rather than taking a no-op.
    life_lost = (0 < lives) & (lives < self._lives) & ~life_reset
    self._lives = lives
    self._life_reset = life_lost & ~game_over
    # The no-op step after a lost life starts an episode: reward dropped, not
    # an end unless the game ended during it (then it is a zero-length,
    # truncated episode and the pool restarts the game on the next step).
    reward = np.where(life_reset, 0.0, reward).astype(np.float32)
    terminated = (terminated & ~life_reset) | life_lost
    truncated = np.where(life_reset, game_over, truncated)
    return obs, reward, terminated, truncated, self._infos(info, game_over)

  def close(self, **kwargs):
    del kwargs
    if self._pool is not None:
      self._pool.close()
      self._pool = None


def make_kwargs(env_id: str,
                noop_max: int = 30,
                max_episode_frames: int = 108_000,
                repeat_action_probability: Optional[float] = None
                ) -> Dict[str, Any]:
  """EnvPool's `make` options that carry our flags (see the module docstring).

  The frame stack and episodic life are done by `EnvPoolVectorEnv`, not here.
  """
  kwargs = _gym_kwargs(env_id) or {}
  if repeat_action_probability is None:
    repeat_action_probability = kwargs.get('repeat_action_probability',
                                           _DEFAULT_STICKY)
  out = dict(
      task_id=task_id(env_id),
      noop_max=int(noop_max),
      episodic_life=False,  # Done by EnvPoolVectorEnv, see the docstring.
      max_episode_steps=max(1, math.ceil((max_episode_frames - 1) / _FRAME_SKIP)),
      frame_skip=_FRAME_SKIP,
      img_height=_SCREEN,
      img_width=_SCREEN,
      gray_scale=True,
      use_inter_area_resize=True,
      reward_clip=False,
      use_fire_reset=False,
      zero_discount_on_life_loss=False,
      repeat_action_probability=float(repeat_action_probability),
      full_action_space=bool(kwargs.get('full_action_space', False)))
  for key in ('mode', 'difficulty'):
    if kwargs.get(key) is not None:
      out[key] = int(kwargs[key])
  return out


def make_vector_env(env_id: str,
                    num_envs: int,
                    seed: int,
                    noop_max: int = 30,
                    frame_stack: int = 4,
                    episodic_life: bool = False,
                    max_episode_frames: int = 108_000,
                    use_lstm: bool = False,
                    repeat_action_probability: Optional[float] = None,
                    num_threads: int = 0
                    ) -> EnvPoolVectorEnv:
  """An `EnvPoolVectorEnv` of `num_envs` envs seeded with `seed`.

  Arguments as `environments.make_vector_env` (there is no vectorization mode:
  EnvPool vectorises in C++); `num_threads`: the pool's C++ threads, 0 for
  EnvPool's default (one per env, at most the machine's cores). The pool is seeded when it is built, so the first
  `reset()` (with `seed` or without) starts the seeded episodes.

  Raises:
    ConfigError: for field 'env_backend' when EnvPool cannot run `env_id` with
      these flags (see `unsupported_reason`).
  """
  reason = unsupported_reason(env_id, noop_max)
  if reason is not None:
    raise ConfigError('env_backend', 'envpool', reason)
  env = EnvPoolVectorEnv(
      dict(make_kwargs(env_id, noop_max, max_episode_frames,
                       repeat_action_probability), num_threads=int(num_threads)),
      num_envs, seed, 1 if use_lstm else frame_stack, episodic_life)
  env.action_space.seed(seed)
  env.single_action_space.seed(seed)
  return env
