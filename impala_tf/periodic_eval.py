"""Evaluation during training: K episodes every N env frames, off the learner's path.

`--eval_interval_frames=N --eval_episodes=K [--noeval_greedy]` (RLlib's
`evaluation_interval`, SB3's `EvalCallback`): each time the run has stepped another N
env frames, the driver hands the weights it just published to `PeriodicEvaluator`,
which plays K whole episodes with them in a thread of its own, on envs of its own
(seeded apart from the actors'), with greedy (argmax) actions by default. The next
metrics line carries the result:

* `eval_return_mean`, `eval_return_std`, `eval_episode_length_mean`: over the K
  episodes (returns in the env's own reward units, unclipped);
* `eval_episodes`: K; `eval_env_frames`: the env frames at the weights it played
  (the step of the TensorBoard scalars `eval/...` is the line's `env_frames`);
* `eval_seconds`: how long it took.

The learner never waits for it: `submit` only stores the weights. A request that
comes while an evaluation still runs replaces the one waiting (the newest weights
win), so on a fast run the evaluations are as frequent as they can be, never more.
A feed-forward MLP policy is computed with numpy (`numpy_policy.NumpyMLPPolicy`); any
other network is a CPU copy of the learner's, called through one `tf.function`.

Shapes: weights are numpy arrays in `AgentNetwork.variables` order (what the
learner publishes); observations `[K', *obs_shape]` for the K' <= K envs.
"""

import threading
import time
from typing import Dict, List, Optional, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import episodes
from impala_tf import errors
from impala_tf import networks
from impala_tf import numpy_policy
from impala_tf import policies

# Seed offset of the evaluation envs (actor envs use seed + small offsets).
EVAL_SEED_OFFSET = 7_919_000


class _WeightsPolicy:
  """A policy over published weights with `episodes.run_episodes`' interface:
  numpy for an MLP network without a recurrent core, TensorFlow otherwise."""

  def __init__(self, network: networks.AgentNetwork):
    self._numpy = (numpy_policy.NumpyMLPPolicy(network)
                   if numpy_policy.NumpyMLPPolicy.supports(network) else None)
    self._tf = None if self._numpy else policies.NetworkPolicy(network)

  def set_weights(self, weights: Sequence[np.ndarray]):
    (self._numpy or self._tf).set_weights(weights)

  def initial_state(self, batch_size: int):
    return () if self._numpy else self._tf.initial_state(batch_size)

  def __call__(self, observation, prev_action, reward, first, state):
    if self._numpy:
      return self._numpy(observation), state
    return self._tf(observation, prev_action, reward, first, state)


class PeriodicEvaluator:
  """Plays `config.eval_episodes` episodes every `config.eval_interval_frames`.

  Args:
    config: the run's Config (`eval_interval_frames` > 0, `eval_episodes`,
      `eval_greedy`, the env flags).
    observation_space, action_space: one env's spaces (to build the network).
    start_frames: env frames at the start of this call of train (a resumed run
      evaluates first at the next multiple of the interval after them).
  """

  def __init__(self, config: config_lib.Config, observation_space, action_space,
               start_frames: int = 0):
    self._config = config
    self._spaces = (observation_space, action_space)
    self._interval = int(config.eval_interval_frames)
    self._next_due = (start_frames // self._interval + 1) * self._interval
    self._lock = threading.Condition()
    self._pending = None  # (env_frames, weights) waiting for the thread.
    self._results: List[Dict[str, float]] = []
    self._closed = False
    self._count = 0
    self.error: Optional[BaseException] = None
    self._thread = threading.Thread(target=self._run, name='periodic-eval',
                                    daemon=True)
    self._thread.start()

  def due(self, env_frames: int) -> bool:
    """Whether `env_frames` has reached the next evaluation point."""
    return env_frames >= self._next_due

  def submit(self, env_frames: int, weights: Sequence[np.ndarray]):
    """Asks for an evaluation of `weights` (taken at `env_frames`); never blocks."""
    self._next_due = (env_frames // self._interval + 1) * self._interval
    with self._lock:
      self._pending = (int(env_frames), list(weights))
      self._lock.notify()

  def results(self) -> Dict[str, float]:
    """The newest finished evaluation not yet returned, as metrics; {} if none."""
    with self._lock:
      if not self._results:
        return {}
      out = self._results[-1]
      self._results.clear()
      return out

  def close(self, timeout: float = 30.0):
    """Stops the thread (after the evaluation in progress, if any)."""
    with self._lock:
      self._closed = True
      self._pending = None
      self._lock.notify()
    self._thread.join(timeout)

  def _run(self):
    c = self._config
    policy = None
    while True:
      with self._lock:
        while self._pending is None and not self._closed:
          self._lock.wait()
        if self._closed:
          return
        frames, weights = self._pending
        self._pending = None
      start = time.time()
      try:
        if policy is None:
          with tf.device('/cpu:0'):
            policy = _WeightsPolicy(networks.make_network(c, *self._spaces))
        policy.set_weights(weights)
        out = episodes.run_episodes(
            c, policy, c.eval_episodes, greedy=c.eval_greedy,
            seed=c.seed + EVAL_SEED_OFFSET + self._count)
      except Exception as e:  # pylint: disable=broad-except
        # An evaluation never stops the training it watches: log, keep going.
        logging.warning('periodic evaluation at %d env frames failed: %s', frames,
                        errors.one_line(e))
        self.error = e
        continue
      self._count += 1
      result = {
          'eval_return_mean': out['episode_return_mean'],
          'eval_return_std': out['episode_return_std'],
          'eval_episode_length_mean': out['episode_length_mean'],
          'eval_episodes': out['episodes'],
          'eval_env_frames': frames,
          'eval_seconds': time.time() - start,
      }
      with self._lock:
        self._results.append(result)
