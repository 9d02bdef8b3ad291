"""Your own Keras network as the torso, trained on CartPole through the Python API.

`mlp_torso` below is a torso function: impala_tf calls
`mlp_torso(observation_space, action_space)` and gets a Keras model mapping float32
observations `[B, 4]` to features `[B, 64]`; impala_tf adds the policy and baseline
heads (and, with `use_lstm=True`, the LSTM core). The layers are those of the
built-in `--network=mlp` (two Dense layers of 64 ReLU units, Glorot-uniform kernels,
zero biases), so the two train alike. `tf.keras` is Keras 3, or tf-keras under
`TF_USE_LEGACY_KERAS=1`; both work.

The same torso from the command line (run from the repository root, so that
`examples.keras_torso` is importable):

    python -m impala_tf.train --network=examples.keras_torso:mlp_torso --logdir=/tmp/run

Run this file: `python examples/keras_torso.py` (a few seconds of training; the
script's directory is on sys.path, so the torso is `keras_torso:mlp_torso`).
"""

import os
import tempfile

import tensorflow as tf


def mlp_torso(observation_space, action_space):
  """Flatten, Dense(64, relu), Dense(64, relu): float32 `[B, *obs]` -> `[B, 64]`."""
  del action_space  # The heads are impala_tf's.
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=observation_space.shape),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(64, activation='relu'),
      tf.keras.layers.Dense(64, activation='relu'),
  ])


def main():
  import impala_tf  # pylint: disable=g-import-not-at-top
  from impala_tf import evaluate  # pylint: disable=g-import-not-at-top

  logdir = os.path.join(tempfile.mkdtemp(), 'keras_torso')
  config = impala_tf.Config(
      env='CartPole-v1', network='keras_torso:mlp_torso',
      num_envs_per_actor=8, total_environment_frames=3000, log_interval_secs=1.0,
      logdir=logdir)
  result = impala_tf.train(config)
  m = result.metrics
  print(f'trained: env_frames={m["env_frames"]} learner_steps={m["learner_steps"]} '
        f'episode_return_mean={m.get("episode_return_mean")}')
  # The run directory works with the rest of impala_tf as with a built-in torso.
  r = evaluate.evaluate(logdir, num_episodes=4, source='saved_model')
  print(f'saved_policy: {r["episodes"]} episodes, mean return '
        f'{r["episode_return_mean"]:.1f}')
  assert m['learner_steps'] > 0 and r['episodes'] == 4


if __name__ == '__main__':
  main()
