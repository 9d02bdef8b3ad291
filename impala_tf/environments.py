"""Gymnasium environment factory: classic control and Atari (ale-py).

Everything here is numpy + gymnasium; this module never imports TensorFlow, so
subprocess workers of an async vector env start quickly and hold no TF state.

Vector envs
  `make_vector_env()` returns a `gymnasium.vector.VectorEnv` with NEXT_STEP
  autoreset (see `impala_tf.types`): after a step that ends an episode
  (`terminated | truncated`), the next `step()` ignores its action and returns the
  first observation of a new episode with reward 0, terminated=False and
  truncated=False. Vectorization modes:
    'auto'  gymnasium's own vectorised implementation when the env registers a
            `vector_entry_point` (CartPole: a numpy-batched `CartPoleVectorEnv`,
            ~10x faster than 'sync'); 'sync' otherwise. Atari ids always use
            'sync' under 'auto': ale-py's `AtariVectorEnv` preprocesses
            differently (fire on reset, reward clipping, channels-first stacks,
            no `game_over` info), so the wrapper stack below is used instead.
    'sync'  `gymnasium.vector.SyncVectorEnv`: all envs step in this process.
    'async' `gymnasium.vector.AsyncVectorEnv`: one subprocess per env. The
            processes are started with 'forkserver' (or 'spawn' where that is
            unavailable), not 'fork': TensorFlow runs threads in the parent
            and forking a multi-threaded process can deadlock the child. The
            children import only this module (numpy, gymnasium, ale-py), not
            the parent's main module, so they start in well under a second
            and hold no TensorFlow.

Backends
  `make_vector_env(..., backend=)`: 'gymnasium' (this module's wrappers, the
  default here), 'envpool' or 'auto' (`--env_backend`): Atari games on EnvPool's
  C++ thread pool through `impala_tf.envpool_env`, same spaces, preprocessing,
  episode ends and returns (see that module for the mapping and what differs).

Seeds
  Env `i` of a vector env is seeded with `seed + i` (gymnasium's rule for
  `VectorEnv.reset(seed=int)`; a `vector_entry_point` env seeds one generator for
  the batch from `seed`). Callers give each actor a disjoint range, e.g.
  `seed = base_seed * 1_000_003 + actor_id * num_envs_per_actor`, so no two envs
  of a run share a seed and a run is reproducible from `base_seed`.
  `make_vector_env()` already resets every env with its seed (and seeds the
  action spaces), so any later `env.reset()` without a seed continues the seeded
  random streams and stays reproducible; `reset(env, seed)` reseeds explicitly.

Atari (DeepMind preprocessing with gymnasium's own wrappers)
  `gym.make(id, frameskip=1, max_num_frames_per_episode=max_episode_frames)`
  -> `AtariPreprocessing(noop_max, frame_skip=4, screen_size=84, grayscale,
  unscaled)`, which repeats each action for 4 frames and max-pools the last two
  -> optional `EpisodicLifeEnv` -> `FrameStackObservation(frame_stack)` -> HWC.
  * Observation: uint8 `[84, 84, C]` channels-last, `C = frame_stack`, or
    `C = 1` with `use_lstm=True` (the recurrent core replaces the stack).
  * Sticky actions: each id keeps its registered `repeat_action_probability`
    unless one is passed: 0.25 for `ALE/*-v5` (Machado et al. 2018), 0.0 for
    `*NoFrameskip-v4` (the DQN/IMPALA-paper setting).
  * Time limit: `max_episode_frames` emulator frames (noop frames included),
    enforced by the ALE itself, reported as `truncated` (never `terminated`);
    the default 108,000 frames is 30 minutes of play, 27,000 agent steps.
  * Rewards are not clipped here (clipping is a loss option); episode returns
    are game scores.
  * `episodic_life=True` (DeepMind's EpisodicLifeEnv): a lost life reports
    `terminated=True`, but the following reset does not restart the game unless
    it is really over; it takes one no-op step (4 frames, its reward is dropped)
    instead. Every step's info carries `game_over` (bool), which is the real end
    of the game: actors report returns summed up to `game_over` so scores stay
    game scores. In a vector env it is `infos['game_over']` (bool `[B]`) with
    mask `infos['_game_over']`; see `game_over()`. When the game ends during
    the no-op step of such a reset, the reset restarts the game and its info
    has `game_over=True`: in a vector env that is the info of the autoreset
    step, so the ended game is reported there and not merged into the next.

Classic envs
  `noop_max`, `frame_stack`, `episodic_life` and `use_lstm` do not apply.
  Episodes end at the env's registered step limit or `max_episode_frames` agent
  steps (one frame per step), whichever comes first, as `truncated`.
"""

import contextlib
import difflib
import functools
import importlib
import importlib.util
import multiprocessing
import sys
import types as pytypes
from typing import Any, Dict, Optional, Tuple

import gymnasium as gym
from gymnasium.envs import registration as gym_registration
from gymnasium.vector import AutoresetMode
import numpy as np

from impala_tf.config import ConfigError

# Frames per agent step for Atari with our preprocessing.
ATARI_FRAME_SKIP = 4
ATARI_SCREEN_SIZE = 84
ATARI_INSTALL_HINT = "install the atari extra: pip install 'impala_tf[atari]'"
VECTORIZATIONS = ('auto', 'sync', 'async')

_ALE_ENTRY_PREFIX = 'ale_py'
_ale_registered = None  # None: not tried; True/False: ale-py present.


def _register_ale() -> bool:
  """Registers ale-py's envs with gymnasium once; False if ale-py is missing."""
  global _ale_registered
  if _ale_registered is None:
    try:
      import ale_py  # pylint: disable=g-import-not-at-top
    except ImportError:
      _ale_registered = False
    else:
      gym.register_envs(ale_py)
      _ale_registered = True
  return _ale_registered


def _split_module(env_id: str) -> Tuple[Optional[str], str]:
  """'module:Env-v0' -> ('module', 'Env-v0'); 'Env-v0' -> (None, 'Env-v0')."""
  if ':' in env_id:
    module, name = env_id.split(':', 1)
    return module, name
  return None, env_id


def _looks_atari(name: str) -> bool:
  return name.startswith('ALE/') or 'NoFrameskip' in name


def _spec(env_id: str) -> Optional[gym_registration.EnvSpec]:
  """The registered spec of `env_id` (registering ale-py if needed), or None."""
  module, name = _split_module(env_id)
  if module is not None:
    importlib.import_module(module)
  if name not in gym.registry and (_looks_atari(name) or module is None):
    _register_ale()
  return gym.registry.get(name)


def is_atari(env_id: str) -> bool:
  """Whether `env_id` is an ALE game (gets the DeepMind Atari preprocessing).

  True for 'ALE/...' and '...NoFrameskip-v4' ids, and for any id whose registered
  entry point is ale-py's (e.g. 'Pong-v4').

  Args:
    env_id: a gymnasium env id.

  Returns:
    bool.
  """
  _, name = _split_module(env_id)
  if _looks_atari(name):
    return True
  try:
    spec = _spec(env_id)
  except ImportError:
    return False
  return bool(spec is not None and isinstance(spec.entry_point, str) and
              spec.entry_point.startswith(_ALE_ENTRY_PREFIX))


def action_repeat(env_id: str) -> int:
  """Env frames per agent step: 4 for Atari (frame skip), 1 otherwise."""
  return ATARI_FRAME_SKIP if is_atari(env_id) else 1


def _suggest(name: str) -> Optional[str]:
  """The registered id closest to `name`, or None when nothing is close."""
  keys = list(gym.registry)
  by_lower = {k.lower(): k for k in keys}
  if name.lower() in by_lower:
    return by_lower[name.lower()]
  # Same env name, another version or namespace: the best-matching version.
  try:
    ns, base, version = gym_registration.parse_env_id(name)
  except gym.error.Error:
    ns, base, version = None, None, None
  if base is not None:
    candidates = []
    for k in keys:
      try:
        k_ns, k_base, k_version = gym_registration.parse_env_id(k)
      except gym.error.Error:
        continue
      if k_base.lower() == base.lower():
        rank = (k_version == version, (k_ns or '').lower() == (ns or '').lower(),
                -1 if k_version is None else k_version)
        candidates.append((rank, k))
    if candidates:
      return max(candidates)[1]
  close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
  return by_lower[close[0]] if close else None


def check_env_id(env_id: str) -> None:
  """Checks that gymnasium can make `env_id`, without constructing it.

  Args:
    env_id: a gymnasium env id, optionally 'module:Env-v0' to import `module`
      (which registers the env) first.

  Raises:
    ConfigError: for field 'env' when the id is unknown (with a 'did you mean
      X?' suggestion when a registered id is close), or when an Atari id needs
      ale-py / opencv and they are not installed.
  """
  if not isinstance(env_id, str) or not env_id.strip():
    raise ConfigError('env', env_id,
                      'must be a gymnasium env id such as CartPole-v1 or ALE/Pong-v5')
  module, name = _split_module(env_id)
  if module is not None:
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise ConfigError('env', env_id,
                        f'cannot import module {module!r} named before the ":": '
                        f'{e}') from None
  spec = gym.registry.get(name)
  if spec is None:
    has_ale = _register_ale()
    spec = gym.registry.get(name)
    if spec is None and _looks_atari(name) and not has_ale:
      raise ConfigError('env', env_id,
                        f'is an Atari id but ale-py is not installed; '
                        f'{ATARI_INSTALL_HINT}')
  if spec is None:
    allowed = 'is not a registered gymnasium environment id'
    suggestion = _suggest(name)
    if suggestion is not None:
      if module is not None:
        suggestion = f'{module}:{suggestion}'
      allowed += f'; did you mean {suggestion}?'
    elif not _ale_registered:
      allowed += f' (Atari ids such as ALE/Pong-v5 need ale-py: {ATARI_INSTALL_HINT})'
    raise ConfigError('env', env_id, allowed)
  if is_atari(env_id) and importlib.util.find_spec('cv2') is None:
    raise ConfigError('env', env_id,
                      'Atari preprocessing needs opencv (cv2), which is not '
                      f'installed; {ATARI_INSTALL_HINT}')


class EpisodicLifeEnv(gym.Wrapper):
  """Ends an episode at every lost life, but resets the game only when it is over.

  DeepMind's EpisodicLifeEnv for gymnasium. `step()` reports `terminated=True`
  when the number of lives drops (and is still > 0); the next `reset()` then
  takes one no-op step (action 0) instead of restarting the game, unless the
  game really ended (terminated or truncated by the wrapped env) or a seed is
  given. Lives are read from `info['lives']` (ale-py sets it) or the ALE.

  Every step and reset info gets `game_over` (bool): True exactly when the game
  itself ended (the wrapped env's terminated or truncated), the real episode end
  for score reporting. Reset infos have `game_over=False`, except when the game
  ended during the no-op step of a reset after a lost life: then the reset
  restarts the game and reports `game_over=True`, the end of the game that no
  step reported.
  """

  def __init__(self, env: gym.Env):
    super().__init__(env)
    self._lives = 0
    self._game_over = True

  def _read_lives(self, info: Dict[str, Any]) -> int:
    if 'lives' in info:
      return int(info['lives'])
    return int(self.env.unwrapped.ale.lives())

  def step(self, action):
    obs, reward, terminated, truncated, info = self.env.step(action)
    self._game_over = bool(terminated or truncated)
    lives = self._read_lives(info)
    life_lost = 0 < lives < self._lives
    self._lives = lives
    info = dict(info)
    info['game_over'] = self._game_over
    return obs, reward, bool(terminated or life_lost), bool(truncated), info

  def reset(self, *, seed: Optional[int] = None,
            options: Optional[Dict[str, Any]] = None):
    ended_in_noop = False
    if self._game_over or seed is not None:
      obs, info = self.env.reset(seed=seed, options=options)
    else:
      obs, _, terminated, truncated, info = self.env.step(0)
      if terminated or truncated:  # The game ended during the no-op.
        ended_in_noop = True
        obs, info = self.env.reset(options=options)
    self._lives = self._read_lives(info)
    self._game_over = False
    info = dict(info)
    info['game_over'] = ended_in_noop
    return obs, info


def _episode_step_limit(spec: gym_registration.EnvSpec,
                        max_episode_frames: int) -> int:
  """Agent-step limit of a classic env: min(registered limit, frames cap)."""
  if spec.max_episode_steps is None:
    return max_episode_frames
  return min(spec.max_episode_steps, max_episode_frames)


def make_env(env_id: str,
             noop_max: int = 30,
             frame_stack: int = 4,
             episodic_life: bool = False,
             max_episode_frames: int = 108_000,
             use_lstm: bool = False,
             repeat_action_probability: Optional[float] = None,
             render_mode: Optional[str] = None) -> gym.Env:
  """Makes one preprocessed env (what every slot of a vector env holds).

  Args:
    env_id: a gymnasium env id (see `check_env_id`).
    noop_max: Atari: up to this many no-op frames after each reset (random).
    frame_stack: Atari: frames stacked on the channel axis (without LSTM).
    episodic_life: Atari: see `EpisodicLifeEnv`.
    max_episode_frames: env frames per episode before truncation.
    use_lstm: Atari: no frame stack (one channel).
    repeat_action_probability: Atari sticky-action probability; None keeps the
      id's registered value (0.25 for ALE/*-v5, 0.0 for *NoFrameskip-v4).
    render_mode: passed to `gym.make`; 'rgb_array' makes `env.render()` return
      the env's own RGB frame (uint8 `[H, W, 3]`; Atari: the full 210x160 screen,
      not the 84x84 observation). The observations are the same either way.

  Returns:
    A `gymnasium.Env`. Atari observations are uint8 `[84, 84, C]`.
  """
  spec = _spec(env_id)
  if spec is None:
    check_env_id(env_id)  # Raises with a suggestion.
  render = {} if render_mode is None else {'render_mode': render_mode}
  if not is_atari(env_id):
    return gym.make(env_id,
                    max_episode_steps=_episode_step_limit(spec, max_episode_frames),
                    **render)
  # obs_type='grayscale': AtariPreprocessing reads the screen from the ALE
  # itself, so the base env need not render RGB frames it would throw away.
  kwargs = {'frameskip': 1, 'max_num_frames_per_episode': max_episode_frames,
            'obs_type': 'grayscale'}
  if repeat_action_probability is not None:
    kwargs['repeat_action_probability'] = repeat_action_probability
  env = gym.make(env_id, **kwargs, **render)
  stack = 1 if use_lstm else frame_stack
  env = gym.wrappers.AtariPreprocessing(
      env, noop_max=noop_max, frame_skip=ATARI_FRAME_SKIP,
      screen_size=ATARI_SCREEN_SIZE, terminal_on_life_loss=False,
      grayscale_obs=True, grayscale_newaxis=(stack == 1), scale_obs=False)
  if episodic_life:
    env = EpisodicLifeEnv(env)
  if stack > 1:
    env = gym.wrappers.FrameStackObservation(env, stack)  # [C, 84, 84]
    hwc_space = gym.spaces.Box(
        low=0, high=255, shape=(ATARI_SCREEN_SIZE, ATARI_SCREEN_SIZE, stack),
        dtype=np.uint8)
    env = gym.wrappers.TransformObservation(
        env, functools.partial(np.transpose, axes=(1, 2, 0)), hwc_space)
  return env


def resolve_vectorization(env_id: str, vectorization: str) -> str:
  """'auto' -> 'vector_entry_point' or 'sync'; 'sync'/'async' unchanged.

  Raises:
    ConfigError: for field 'env_vectorization' when the mode is unknown.
  """
  if vectorization not in VECTORIZATIONS:
    raise ConfigError('env_vectorization', vectorization,
                      f'must be one of {", ".join(VECTORIZATIONS)}')
  if vectorization != 'auto':
    return vectorization
  spec = _spec(env_id)
  if spec is not None and spec.vector_entry_point is not None and not is_atari(
      env_id):
    return 'vector_entry_point'
  return 'sync'


def _default_async_context() -> str:
  methods = multiprocessing.get_all_start_methods()
  return 'forkserver' if 'forkserver' in methods else 'spawn'


@contextlib.contextmanager
def _main_module_hidden():
  """Hides `__main__` while subprocesses start, so they do not re-import it.

  'spawn' and 'forkserver' children normally re-run the parent's main module
  (for `python -m impala_tf.train` that imports TensorFlow: seconds and hundreds
  of MB per env process). The env factories are functions of this module, so the
  children need nothing from `__main__`; with a stub main module, multiprocessing
  tells them not to import it.
  """
  main = sys.modules.get('__main__')
  sys.modules['__main__'] = pytypes.ModuleType('__main__')
  try:
    yield
  finally:
    if main is None:
      del sys.modules['__main__']
    else:
      sys.modules['__main__'] = main


def make_vector_env(env_id: str,
                    num_envs: int,
                    seed: int,
                    vectorization: str = 'auto',
                    noop_max: int = 30,
                    frame_stack: int = 4,
                    episodic_life: bool = False,
                    max_episode_frames: int = 108_000,
                    use_lstm: bool = False,
                    repeat_action_probability: Optional[float] = None,
                    async_context: Optional[str] = None,
                    backend: str = 'gymnasium',
                    render_first: bool = False,
                    envpool_num_threads: int = 0) -> gym.vector.VectorEnv:
  """Makes a seeded vector env of `num_envs` preprocessed envs.

  See the module docstring for the modes, the seeding rule (env i <- seed + i),
  the Atari preprocessing and episodic life.

  Args:
    env_id: a gymnasium env id.
    num_envs: number of envs, >= 1.
    seed: int >= 0; env `i` is seeded with `seed + i`.
    vectorization: 'auto', 'sync' or 'async'.
    noop_max, frame_stack, episodic_life, max_episode_frames, use_lstm,
      repeat_action_probability: as in `make_env`. `max_episode_frames` is in
      env frames (agent steps times `action_repeat(env_id)`).
    async_context: multiprocessing start method for 'async'; default
      'forkserver' (or 'spawn'). 'fork' is unsafe once TensorFlow is imported.
    backend: 'gymnasium', 'envpool' or 'auto' (see
      `envpool_env.resolve_backend`). With EnvPool the env is an
      `envpool_env.EnvPoolVectorEnv` (same interface, spaces and episode
      semantics; `vectorization` does not apply), seeded but not yet reset.
    envpool_num_threads: with EnvPool, the pool's C++ threads (0: EnvPool's
      default).
    render_first: env 0 is made with `render_mode='rgb_array'`, so
      `env.envs[0].render()` returns its RGB frame (`make_env`). The env is then
      a gymnasium 'sync' vector env whatever `backend` and `vectorization` say
      (EnvPool renders no frames); the observations are the same.

  Returns:
    A `gymnasium.vector.VectorEnv` with NEXT_STEP autoreset, already reset with
    `seed` (gymnasium backend). Observations `[num_envs, ...]` in the env's dtype (uint8
    `[num_envs, 84, 84, C]` for Atari), rewards float `[num_envs]`, terminated
    and truncated bool `[num_envs]`.

  Raises:
    ConfigError: unknown env id or vectorization mode, or num_envs < 1.
    RuntimeError: if the vector env does not use NEXT_STEP autoreset.
  """
  if (not isinstance(num_envs, (int, np.integer)) or isinstance(num_envs, bool) or
      num_envs < 1):
    raise ConfigError('num_envs_per_actor', num_envs, 'must be an integer >= 1')
  num_envs = int(num_envs)
  check_env_id(env_id)
  if render_first:
    backend, vectorization = 'gymnasium', 'sync'
  if backend != 'gymnasium':
    from impala_tf import envpool_env  # pylint: disable=g-import-not-at-top
    if envpool_env.resolve_backend(backend, env_id, noop_max) == 'envpool':
      return envpool_env.make_vector_env(
          env_id, num_envs, seed, noop_max=noop_max, frame_stack=frame_stack,
          episodic_life=episodic_life, max_episode_frames=max_episode_frames,
          use_lstm=use_lstm,
          repeat_action_probability=repeat_action_probability,
          num_threads=envpool_num_threads)
  mode = resolve_vectorization(env_id, vectorization)
  if mode == 'vector_entry_point':
    spec = _spec(env_id)
    env = gym.make_vec(
        _split_module(env_id)[1], num_envs=num_envs,
        vectorization_mode='vector_entry_point',
        max_episode_steps=_episode_step_limit(spec, max_episode_frames))
  else:
    env_fn = functools.partial(
        make_env, env_id, noop_max=noop_max, frame_stack=frame_stack,
        episodic_life=episodic_life, max_episode_frames=max_episode_frames,
        use_lstm=use_lstm, repeat_action_probability=repeat_action_probability)
    env_fns = [env_fn] * num_envs
    if render_first:
      env_fns[0] = functools.partial(env_fn, render_mode='rgb_array')
    if mode == 'sync':
      env = gym.vector.SyncVectorEnv(env_fns,
                                     autoreset_mode=AutoresetMode.NEXT_STEP)
    else:
      context = async_context or _default_async_context()
      if context == 'forkserver':
        # The server (started once per process) imports this module up front, so
        # each env process forks with numpy, gymnasium and ale-py loaded.
        multiprocessing.get_context(context).set_forkserver_preload(
            [__name__])
      with _main_module_hidden():
        env = gym.vector.AsyncVectorEnv(
            env_fns, context=context, autoreset_mode=AutoresetMode.NEXT_STEP)
  autoreset = env.metadata.get('autoreset_mode')
  if autoreset != AutoresetMode.NEXT_STEP:
    env.close()
    raise RuntimeError(
        f'{env_id} ({mode}) uses autoreset mode {autoreset}; impala_tf needs '
        f'{AutoresetMode.NEXT_STEP} (see impala_tf/types.py)')
  reset(env, seed)
  return env


def reset(env: gym.vector.VectorEnv, seed: Optional[int] = None):
  """Resets every env; with a seed, env `i` gets `seed + i`.

  Args:
    env: a vector env from `make_vector_env`.
    seed: int or None (continue the current random streams).

  Returns:
    (observations `[B, ...]`, infos dict), as `VectorEnv.reset`.
  """
  if seed is not None:
    seed = int(seed)
    env.action_space.seed(seed)
    env.single_action_space.seed(seed)
  return env.reset(seed=seed)


def game_over(terminated: np.ndarray, truncated: np.ndarray,
              infos: Dict[str, Any]) -> np.ndarray:
  """Which envs ended a real game (episode) at this step.

  With episodic life this is `infos['game_over']` (where its mask is set), else
  `terminated | truncated`.

  Args:
    terminated: bool `[B]`.
    truncated: bool `[B]`.
    infos: the vector env's step infos.

  Returns:
    bool `[B]`.
  """
  ended = np.logical_or(terminated, truncated)
  if 'game_over' not in infos:
    return ended
  mask = np.asarray(infos.get('_game_over', np.ones_like(ended)), bool)
  return np.where(mask, np.asarray(infos['game_over'], bool), ended)


def env_spaces(env_id: str,
               noop_max: int = 30,
               frame_stack: int = 4,
               episodic_life: bool = False,
               max_episode_frames: int = 108_000,
               use_lstm: bool = False,
               repeat_action_probability: Optional[float] = None,
               vectorization: str = 'auto',
               seed: Optional[int] = None,
               async_context: Optional[str] = None):
  """The single-env observation and action spaces, from one env (then closed).

  Accepts the keyword arguments of `make_vector_env` except `num_envs`;
  `vectorization`, `seed` and `async_context` do not change the spaces.

  Returns:
    (single_observation_space, single_action_space), gymnasium spaces.
  """
  del vectorization, seed, async_context
  check_env_id(env_id)
  env = make_env(env_id, noop_max=noop_max, frame_stack=frame_stack,
                 episodic_life=episodic_life,
                 max_episode_frames=max_episode_frames, use_lstm=use_lstm,
                 repeat_action_probability=repeat_action_probability)
  try:
    return env.observation_space, env.action_space
  finally:
    env.close()


def env_kwargs(config) -> dict:
  """The keyword arguments of `make_vector_env` (and `env_spaces`) that an
  `impala_tf.config.Config` implies, besides its `env` id."""
  return dict(noop_max=config.noop_max, frame_stack=config.frame_stack,
              episodic_life=config.episodic_life,
              max_episode_frames=config.max_episode_frames,
              use_lstm=config.use_lstm)
