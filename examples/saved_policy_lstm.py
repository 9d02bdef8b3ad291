"""Acting with an exported `saved_policy` in plain TensorFlow, LSTM state carried.

A training run writes `LOGDIR/saved_policy` (so does `python -m impala_tf.export
--logdir=LOGDIR`). Loading and running it needs TensorFlow only: no impala_tf and
no Keras. With `use_lstm=True` its `serving_default` signature takes the step's
`observation`, `prev_action`, `reward`, `first` (True at the start of an episode,
which resets the state) and the state `core_state_0`, `core_state_1`, and returns
`action` (sampled), `greedy_action`, `policy_logits`, `baseline` and the new
`core_state_*`; the `initial_state` signature gives the zero state for a batch.

The script trains a tiny LSTM policy on CartPole for a few seconds, then `act()`
plays episodes with it in a gymnasium vector env, the way a serving process would.

Run: `python examples/saved_policy_lstm.py`.
"""

import os
import tempfile

import gymnasium as gym
import numpy as np
import tensorflow as tf


def act(saved_policy_dir: str, num_envs: int = 4, num_steps: int = 200):
  """Plays `num_steps` steps of `num_envs` CartPoles with the SavedModel's policy."""
  policy = tf.saved_model.load(saved_policy_dir)
  serve = policy.signatures['serving_default']
  state = policy.signatures['initial_state'](batch_size=tf.constant(num_envs))
  env = gym.make_vec('CartPole-v1', num_envs=num_envs, vectorization_mode='sync')
  obs, _ = env.reset(seed=0)
  prev_action = np.zeros(num_envs, np.int32)
  reward = np.zeros(num_envs, np.float32)
  first = np.ones(num_envs, bool)
  returns, running, state_norms = [], np.zeros(num_envs), []
  for _ in range(num_steps):
    out = serve(observation=tf.constant(obs, tf.float32),
                prev_action=tf.constant(prev_action), reward=tf.constant(reward),
                first=tf.constant(first), **state)
    state = {k: out[k] for k in state}  # Carry the LSTM state to the next step.
    state_norms.append(float(tf.norm(out['core_state_0'])))
    action = out['action'].numpy()
    obs, r, terminated, truncated, _ = env.step(action)
    done = np.logical_or(terminated, truncated)
    running += r
    returns += list(running[done])
    running[done] = 0
    # gymnasium's default NEXT_STEP autoreset: the step after an episode ends
    # returns the first observation of the next one; flag it so the state resets.
    first = done
    prev_action = np.where(done, 0, action).astype(np.int32)
    reward = np.asarray(r, np.float32)
  env.close()
  return returns, state_norms


def main():
  import impala_tf  # pylint: disable=g-import-not-at-top

  logdir = os.path.join(tempfile.mkdtemp(), 'lstm_run')
  impala_tf.train(impala_tf.Config(
      env='CartPole-v1', use_lstm=True, lstm_size=32, num_envs_per_actor=4,
      unroll_length=10, batch_size=4, total_environment_frames=1000,
      log_interval_secs=1.0, logdir=logdir))
  returns, state_norms = act(os.path.join(logdir, 'saved_policy'))
  print(f'saved_policy: {len(returns)} episodes, mean return '
        f'{np.mean(returns) if returns else float("nan"):.1f}; LSTM state norm '
        f'{state_norms[0]:.3f} after step 1, {state_norms[-1]:.3f} at the end')
  assert returns and state_norms[0] > 0


if __name__ == '__main__':
  main()
