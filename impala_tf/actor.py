"""Actors: a gymnasium vector env + a policy snapshot -> fixed-length unrolls.

Each `Actor` owns a vector env of `num_envs` copies and its own copy of the network
(the policy snapshot). It refreshes the snapshot from a `ParameterBroadcast` at unroll
boundaries whenever the learner has published a newer version, and emits one chunk per
unroll: a dict of numpy arrays, batch-major `[num_envs, T + 1, ...]` (one unroll per
env; fields of `impala_tf.types.Unroll`, the recurrent state flattened into
`core_state_0`, `core_state_1`, ...). Consecutive unrolls overlap by one step.

The per-step loop does only what must be Python: one forward pass for the whole batch
of envs (a tf.function call; for a feed-forward MLP, `numpy_policy.NumpyMLPPolicy`
computes the same logits with numpy, which on the CPU is ~10x cheaper than a
TensorFlow call and does not queue behind the learner's ops), Gumbel-max sampling of
the actions in numpy (a numpy generator seeded when the actor starts from the actor's
checkpointed tf.random.Generator), one vectorised env step and a few numpy row
writes. Episode returns and lengths are tracked per env with numpy.

Env faults end the actor with an exception (the driver restarts it with a fresh env):
a NaN or Inf reward or (float) observation is an env bug (`NonFiniteEnvError`,
naming the env id, the field, the env index and the step), and with a `step_timeout`
an async vector env that does not finish a step in time is taken as hung
(`EnvTimeoutError`); the env's processes are then terminated, not waited for.
"""

import multiprocessing
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from impala_tf import environments
from impala_tf import numpy_policy
from impala_tf import types


class NonFiniteEnvError(RuntimeError):
  """An env returned a NaN or Inf reward or observation."""


class EnvTimeoutError(RuntimeError):
  """A step of an async vector env did not finish within the step timeout."""


class ParameterBroadcast:
  """Latest published policy weights with their version (the learner step).

  Thread-safe. The driver publishes after learner steps; actors poll `version` (a
  cheap int read) and fetch the weights only when it changed.
  """

  def __init__(self):
    self._lock = threading.Lock()
    self._version = -1
    self._weights: Optional[List[np.ndarray]] = None

  @property
  def version(self) -> int:
    return self._version

  def publish(self, version: int, weights: Sequence[np.ndarray]):
    with self._lock:
      self._weights = list(weights)
      self._version = int(version)

  def latest(self) -> Tuple[int, Optional[List[np.ndarray]]]:
    with self._lock:
      return self._version, self._weights


class EpisodeTracker:
  """Per-env running returns and lengths; finished episodes go to `sink`.

  Args:
    num_envs: B.
    sink: called with a list of `types.EpisodeStats` when episodes end.
  """

  def __init__(self, num_envs: int, sink: Callable[[List[types.EpisodeStats]], None]):
    self._returns = np.zeros(num_envs, np.float64)
    self._lengths = np.zeros(num_envs, np.int64)
    self._sink = sink

  def update(self, reward: np.ndarray, stepped: np.ndarray, ended: np.ndarray):
    """Accounts for one vector step.

    Args:
      reward: float `[B]`, rewards returned by the step.
      stepped: bool `[B]`, False for envs whose step was a NEXT_STEP reset.
      ended: bool `[B]`, the episode (the game, with episodic life) ended.
    """
    self._returns += np.where(stepped, reward, 0.0)
    self._lengths += stepped
    if ended.any():
      idx = np.flatnonzero(ended)
      self._sink([types.EpisodeStats(float(self._returns[i]), int(self._lengths[i]))
                  for i in idx])
      self._returns[idx] = 0.0
      self._lengths[idx] = 0


class Actor:
  """Steps a vector env with a policy snapshot and emits unrolls.

  Args:
    actor_id: int, distinct per actor (enters seeds and unroll ids).
    env: a gymnasium VectorEnv with NEXT_STEP autoreset and a Discrete action space.
    network: an `impala_tf.networks.AgentNetwork` used as this actor's snapshot (not
      shared with the learner).
    broadcast: the ParameterBroadcast to refresh from.
    unroll_length: T.
    emit: called by `run` with each chunk (dict of arrays `[B, T + 1, ...]`); it
      may block (back-pressure) and should return False when the actor must stop.
      None when the chunks are taken from `unrolls` instead.
    episode_sink: receives finished `types.EpisodeStats`.
    seed: int, seeds the env resets and the action sampling.
    stop_event: threading.Event; the actor returns soon after it is set.
    rng: optional tf.random.Generator for action sampling (default: from `seed`).
    env_id: the env's id, for error messages.
    step_timeout: seconds to wait for one step of an env with `step_async` /
      `step_wait` (gymnasium's AsyncVectorEnv); None waits forever. Other envs
      step in this thread and cannot be timed out.
    refresh_every_step: take newer published weights before every vector step
      (`--actor_refresh=step`), not only between unrolls. An unroll's
      `policy_version` is then the mean, rounded down, of the versions that
      acted at its rows 0..T-1.
  """

  def __init__(self, actor_id: int, env, network, broadcast: ParameterBroadcast,
               unroll_length: int,
               emit: Optional[Callable[[Dict[str, np.ndarray]], bool]],
               episode_sink: Callable[[List[types.EpisodeStats]], None], seed: int,
               stop_event: threading.Event,
               rng: Optional[tf.random.Generator] = None,
               env_id: str = '?', step_timeout: Optional[float] = None,
               refresh_every_step: bool = False):
    self.actor_id = actor_id
    self._refresh_every_step = bool(refresh_every_step)
    self._env_id = env_id
    self._step_timeout = step_timeout
    self._async = step_timeout is not None and hasattr(env, 'step_wait')
    self._failed = False
    self._vector_steps = 0
    self._env = env
    self._network = network
    self._broadcast = broadcast
    self._t = unroll_length
    self._emit = emit
    self._stop = stop_event
    self._seed = seed
    self._num_envs = env.num_envs
    self._tracker = EpisodeTracker(self._num_envs, episode_sink)
    self._version = -1
    self._unrolls_emitted = 0
    self.steps = 0  # Agent steps taken (summed over envs), read by the driver.
    self._rng = rng if rng is not None else tf.random.Generator.from_seed(seed)
    self._recurrent = bool(network.initial_state(1))
    self._numpy_policy = None
    if numpy_policy.NumpyMLPPolicy.supports(network):
      # Feed-forward MLP: act with numpy, no TensorFlow call per step.
      self._numpy_policy = numpy_policy.NumpyMLPPolicy(network)
      self._numpy_policy.set_weights([v.numpy() for v in network.variables])
    if self._recurrent:
      self._policy = tf.function(self._policy_step, autograph=False)
    else:
      self._policy = tf.function(self._policy_step_feedforward, autograph=False)
    self._np_rng = None
    variables = self._network.variables

    def assign(weights):
      for var, value in zip(variables, weights):
        var.assign(value)
    # One dispatch for all variables instead of one per variable.
    self._assign = tf.function(assign, autograph=False)

  # Acting runs on the CPU, where the actor's copy of the variables lives
  # (`actor_pool.make_actor`), also on a GPU host: a batch of one actor's envs is
  # small, and the GPUs are the learner's (docs/scaling.md).

  def _policy_step(self, observation, prev_action, reward, first, state):
    """Recurrent policy: logits float32 `[B, A]` and the new core state."""
    with tf.device('/cpu:0'):
      inputs = types.AgentInput(observation, prev_action, reward, first)
      out, new_state = self._network.step(inputs, state)
      return out.policy_logits, new_state

  def _policy_step_feedforward(self, observation):
    """Feed-forward policy: only the observation crosses into TensorFlow."""
    with tf.device('/cpu:0'):
      b = tf.shape(observation)[0]
      inputs = types.AgentInput(observation, tf.zeros([b], tf.int32),
                                tf.zeros([b], tf.float32), tf.zeros([b], tf.bool))
      out, _ = self._network.step(inputs, ())
      return out.policy_logits

  def _sample(self, logits: np.ndarray) -> np.ndarray:
    """Samples actions int32 `[B]` from logits `[B, A]` (Gumbel-max, numpy)."""
    return np.argmax(logits + self._np_rng.gumbel(size=logits.shape),
                     axis=-1).astype(np.int32)

  @property
  def network(self):
    """The `AgentNetwork` this actor acts with (its own snapshot)."""
    return self._network

  def _reseed(self):
    """Draws the numpy sampling seed from the checkpointed TF RNG (once per run)."""
    seed = self._rng.uniform_full_int([2], dtype=tf.int64).numpy()
    self._np_rng = np.random.default_rng([int(s) & (2**63 - 1) for s in seed])

  def close(self):
    """Closes the env (and its subprocesses, if any).

    After a failed step the subprocesses are terminated, not asked to close: a
    hung env would never answer.
    """
    try:
      if self._failed and self._async:
        self._env.close(terminate=True)
      else:
        self._env.close()
    except Exception:  # pylint: disable=broad-except
      pass

  def _step(self, action):
    """One vector step; raises EnvTimeoutError / NonFiniteEnvError on faults."""
    if self._async:
      self._env.step_async(action)
      try:
        out = self._env.step_wait(timeout=self._step_timeout)
      except multiprocessing.TimeoutError:
        raise EnvTimeoutError(
            f'env {self._env_id} (actor {self.actor_id}) did not finish step '
            f'{self._vector_steps + 1} within {self._step_timeout:g} s '
            '(--env_step_timeout_secs); taking it as hung') from None
    else:
      out = self._env.step(action)
    self._vector_steps += 1
    self._check_finite('reward', out[1])
    self._check_finite('observation', out[0])
    return out

  def _check_finite(self, field: str, values):
    values = np.asarray(values)
    if values.dtype.kind not in 'fc' or np.isfinite(values).all():
      return
    flat = values.reshape(len(values), -1)
    bad = ~np.isfinite(flat)
    env_index = int(np.flatnonzero(bad.any(axis=1))[0])
    value = flat[env_index][bad[env_index]][0]
    raise NonFiniteEnvError(
        f'env {self._env_id} (actor {self.actor_id}, env {env_index}) returned a '
        f'non-finite {field} ({value}) at step {self._vector_steps}; this is a bug '
        'in the env')

  def _refresh(self):
    if self._broadcast.version == self._version:
      return
    version, weights = self._broadcast.latest()
    if weights is None:
      return
    if self._numpy_policy is not None:
      # The TF copy is never called: skip its assign (a TF call per refresh).
      self._numpy_policy.set_weights(weights)
    else:
      self._assign(weights)
    self._version = version

  def run(self):
    """Acts until the stop event is set or `emit` returns False.

    Raises:
      NonFiniteEnvError, EnvTimeoutError: env faults (see the module docstring);
        any exception of the env.
    """
    for chunk in self.unrolls():
      if not self._emit(chunk):
        return

  def unrolls(self) -> Iterator[Dict[str, np.ndarray]]:
    """Acts and yields one chunk per unroll until the stop event is set.

    The envs advance only while the generator runs: a consumer that takes one chunk
    per call (a Ray actor answering requests) gets exactly the chunks `run` emits.
    The policy snapshot is refreshed right after each chunk is taken.

    Yields:
      Chunks: dicts of arrays `[B, T + 1, ...]` (see the module docstring).

    Raises:
      NonFiniteEnvError, EnvTimeoutError: env faults (see the module docstring);
        any exception of the env.
    """
    try:
      yield from self._unrolls()
    except Exception:
      self._failed = True
      raise

  def _unrolls(self) -> Iterator[Dict[str, np.ndarray]]:
    b, t_len = self._num_envs, self._t
    self._refresh()
    obs, _ = self._env.reset(seed=self._seed)
    obs = np.asarray(obs)
    self._check_finite('observation', obs)
    state = self._network.initial_state(b)
    num_actions = self._network.num_actions

    def buffers():
      return {
          'observation': np.zeros((t_len + 1, b) + obs.shape[1:], obs.dtype),
          'reward': np.zeros((t_len + 1, b), np.float32),
          'terminated': np.zeros((t_len + 1, b), bool),
          'truncated': np.zeros((t_len + 1, b), bool),
          'first': np.zeros((t_len + 1, b), bool),
          'prev_action': np.zeros((t_len + 1, b), np.int32),
          'action': np.zeros((t_len + 1, b), np.int32),
          'behaviour_logits': np.zeros((t_len + 1, b, num_actions), np.float32),
      }

    self._reseed()
    buf = buffers()
    buf['observation'][0] = obs
    buf['first'][0] = True
    state_at_start = state
    t = 0
    # The policy's concrete function for this env's shapes, traced once and
    # called with tensors: it skips tf.function's per-call signature matching
    # (about a fifth of a call on a batch of 8 Atari frames).
    policy = None
    row_version = np.zeros(t_len + 1, np.int64)  # The version acting at each row.
    while not self._stop.is_set():
      # Act at row t.
      if self._refresh_every_step:
        self._refresh()
      row_version[t] = max(self._version, 0)
      if self._recurrent:
        args = tf.nest.map_structure(tf.convert_to_tensor, (
            buf['observation'][t], buf['prev_action'][t], buf['reward'][t],
            buf['first'][t], state))
        if policy is None:
          policy = self._policy.get_concrete_function(*args)
        logits, new_state = policy(*args)
        logits = logits.numpy()
      elif self._numpy_policy is not None:
        logits, new_state = self._numpy_policy(buf['observation'][t]), state
      else:
        observation = tf.convert_to_tensor(buf['observation'][t])
        if policy is None:
          policy = self._policy.get_concrete_function(observation)
        logits, new_state = policy(observation).numpy(), state
      action = self._sample(logits)
      buf['action'][t] = action
      buf['behaviour_logits'][t] = logits
      if t == t_len:
        version = (int(row_version[:t_len].mean()) if self._refresh_every_step
                   else max(self._version, 0))
        yield self._chunk(buf, state_at_start, version)
        last = {k: v[t_len].copy() for k, v in buf.items()}
        buf = buffers()
        for k, v in last.items():
          buf[k][0] = v
        row_version[0] = row_version[t_len]
        state_at_start = state
        self._refresh()
        t = 0
      state = new_state
      # Step the envs with action[t]; fill row t + 1.
      obs, reward, terminated, truncated, info = self._step(action)
      stepped = ~(buf['terminated'][t] | buf['truncated'][t])
      row = t + 1
      buf['observation'][row] = obs
      buf['reward'][row] = reward
      buf['terminated'][row] = terminated
      buf['truncated'][row] = truncated
      buf['first'][row] = ~stepped
      buf['prev_action'][row] = np.where(stepped, action, 0)
      ended = environments.game_over(terminated, truncated, info)
      self._tracker.update(np.asarray(reward, np.float64), stepped, ended)
      self.steps += b
      t = row

  def _chunk(self, buf, state_at_start, version: int) -> Dict[str, np.ndarray]:
    b = self._num_envs
    chunk = {k: np.ascontiguousarray(np.swapaxes(v, 0, 1)) for k, v in buf.items()}
    for i, s in enumerate(state_at_start):
      chunk[f'core_state_{i}'] = np.asarray(s)
    chunk['policy_version'] = np.full(b, version, np.int64)
    ids = self._unrolls_emitted + np.arange(b, dtype=np.int64)
    chunk['unroll_id'] = self.actor_id * (2**40) + ids
    chunk['replayed'] = np.zeros(b, bool)
    self._unrolls_emitted += b
    return chunk
