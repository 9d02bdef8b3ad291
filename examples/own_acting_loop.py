"""Your own acting loop feeding impala_tf's Learner through its tf.data pipeline.

For users who already have env runners: no impala_tf actor is involved. The runner
below (a thread stepping a gymnasium vector env with its own copy of the policy)
writes unrolls in impala_tf's layout and puts them in a `data.LearnerQueue`;
`data.build_dataset` batches them and `data.distribute` feeds the learner's
replicas; `Learner.step_from_iterator` trains on each batch.

What a chunk must hold (see `impala_tf/types.py` for the meaning of each field):
a dict of numpy arrays, batch-major, one unroll per env, `T + 1` steps each,
consecutive unrolls overlapping by one step:

    observation       [N, T + 1, *obs_shape]  the env's dtype
    reward            [N, T + 1]  float32     reward[t] is for action[t - 1]
    terminated        [N, T + 1]  bool        observation[t] ends the episode
    truncated         [N, T + 1]  bool        ... by a time limit
    first             [N, T + 1]  bool        observation[t] starts an episode
    prev_action       [N, T + 1]  int32       action[t - 1]; 0 where first
    action            [N, T + 1]  int32
    behaviour_logits  [N, T + 1, A] float32   logits of the policy that acted
    policy_version    [N] int64, unroll_id [N] int64, replayed [N] bool
    core_state_0, ... [N, S] float32          only with an LSTM: state at step 0

Run: `python examples/own_acting_loop.py` (a few seconds).
"""

import threading
import time

import gymnasium as gym
import numpy as np
import tensorflow as tf

import impala_tf
from impala_tf import data
from impala_tf import distribute
from impala_tf import learner as learner_lib
from impala_tf import networks
from impala_tf import types

T, NUM_ENVS, LEARNER_STEPS = 10, 8, 60


class Weights:
  """The latest policy weights the learner published (thread-safe)."""

  def __init__(self, weights):
    self._lock = threading.Lock()
    self.version, self._weights = 0, weights

  def publish(self, version, weights):
    with self._lock:
      self.version, self._weights = version, weights

  def get(self):
    with self._lock:
      return self.version, self._weights


def run_envs(env, network, weights: Weights, put, stop: threading.Event, returns):
  """The user's runner: NEXT_STEP autoreset vector env -> chunks [N, T + 1, ...]."""
  n = env.num_envs
  logits_fn = tf.function(lambda obs: network.step(types.AgentInput(
      obs, tf.zeros_like(obs[:, 0], tf.int32), tf.zeros_like(obs[:, 0]),
      tf.zeros_like(obs[:, 0], tf.bool)))[0].policy_logits)
  rng = np.random.default_rng(0)
  obs, _ = env.reset(seed=0)
  row = dict(observation=obs, reward=np.zeros(n, np.float32),
             terminated=np.zeros(n, bool), truncated=np.zeros(n, bool),
             first=np.ones(n, bool), prev_action=np.zeros(n, np.int32))
  running, unrolls = np.zeros(n), 0
  while not stop.is_set():
    version, w = weights.get()
    for var, value in zip(network.variables, w):
      var.assign(value)
    rows = []
    for t in range(T + 1):
      logits = logits_fn(tf.constant(row['observation'])).numpy()
      action = np.argmax(logits + rng.gumbel(size=logits.shape), -1).astype(np.int32)
      rows.append(dict(row, action=action, behaviour_logits=logits))
      if t == T:
        break  # Row T is also row 0 of the next unroll: do not step past it yet.
      obs, r, term, trunc, _ = env.step(action)
      stepped = ~(row['terminated'] | row['truncated'])  # Else it was a reset.
      running += np.where(stepped, r, 0.0)
      for i in np.flatnonzero(term | trunc):
        returns.append(running[i])
        running[i] = 0.0
      row = dict(observation=obs, reward=np.asarray(r, np.float32),
                 terminated=term, truncated=trunc, first=~stepped,
                 prev_action=np.where(stepped, action, 0).astype(np.int32))
    chunk = {k: np.stack([r_[k] for r_ in rows], axis=1) for k in rows[0]}
    chunk.update(policy_version=np.full(n, version, np.int64),
                 unroll_id=unrolls + np.arange(n, dtype=np.int64),
                 replayed=np.zeros(n, bool))
    unrolls += n
    if not put(chunk):  # False once the queue is stopped.
      return
    # The next unroll starts from the last row (its action is re-chosen).
    row = {k: rows[-1][k] for k in row}


def main():
  config = impala_tf.Config(env='CartPole-v1', unroll_length=T, batch_size=NUM_ENVS,
                            learning_rate=0.002, lr_schedule='constant')
  env = gym.make_vec('CartPole-v1', num_envs=NUM_ENVS, vectorization_mode='sync')
  obs_space, action_space = env.single_observation_space, env.single_action_space
  make_net = lambda: networks.make_network(config, obs_space, action_space)

  strategy = distribute.get_strategy()  # One replica; towers work the same way.
  learner = learner_lib.Learner(config, make_net, strategy)
  stop = threading.Event()
  queue = data.LearnerQueue(maxsize=2, timeout=60.0, stop_event=stop)
  source = data.ChunkSource(queue.get, replay=None)
  signature = data.unroll_signature(obs_space.shape, obs_space.dtype,
                                    int(action_space.n), T)
  dataset = data.distribute(strategy, lambda: data.build_dataset(
      source, signature, batch_size=config.batch_size,
      num_replicas=strategy.num_replicas_in_sync))

  weights = Weights(learner.get_weights())
  returns = []
  runner = threading.Thread(target=run_envs, args=(
      env, make_net(), weights, queue.put, stop, returns), daemon=True)
  runner.start()
  iterator = iter(dataset)
  for step in range(1, LEARNER_STEPS + 1):
    out = learner.step_from_iterator(iterator)
    weights.publish(step, learner.get_weights())
    if step % 20 == 0:
      print(f'learner step {step}: loss {float(out["loss"]):.2f}, '
            f'{len(returns)} episodes, mean return of the last 20 '
            f'{np.mean(returns[-20:]) if returns else float("nan"):.1f}')
  stop.set()
  runner.join()
  while source.active:  # Let tf.data's reader see the stop before exiting.
    time.sleep(0.01)
  del iterator
  env.close()
  assert int(learner.learner_steps.numpy()) == LEARNER_STEPS and returns


if __name__ == '__main__':
  main()
