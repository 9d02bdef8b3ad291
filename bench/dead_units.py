"""Dead ReLU units of trained networks: per torso layer, the share never active; JSON.

Usage:
  python bench/dead_units.py LOGDIR [LOGDIR ...] [--steps=300] [--num_envs=4]
      [--seed=1] [--checkpoint=PATH]

For each run directory it restores the network of the newest checkpoint (or
`--checkpoint`, with one LOGDIR), plays `--steps` steps of uniformly random actions
in `--num_envs` of the run's envs (its config.json's env and preprocessing, the
gymnasium backend), and feeds every observation through the torso. A unit (a
channel of a convolution, a unit of a fully connected layer) is dead when its
ReLU output is 0 at every position of every observation: no input of the game
moves it, so it passes no gradient either. Prints one JSON line per run:

  {"logdir": ..., "checkpoint": ..., "learner_steps": N, "observations": M,
   "layers": {"conv1": {"units": 16, "dead": 14, "dead_fraction": 0.875}, ...}}

Random play shows the game's start positions and early rallies; a unit dead on
them may still fire on states only a good policy reaches, so the count is an
upper bound on the units the trained policy never uses.

Built-in torsos `shallow` (conv1, conv2, fc) and `mlp` (linear_0, ...) only.
"""

import argparse
import json
import os
import re
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def torso_activations(torso, x):
  """{layer name: ReLU output float32 [N, ..., units]} of a shallow or mlp torso."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out = {}
  if hasattr(torso, 'conv1'):  # ShallowTorso.
    x = tf.reshape(x, (-1,) + torso.input_shape)
    out['conv1'] = h = tf.nn.relu(torso.conv1(x))
    out['conv2'] = h = tf.nn.relu(torso.conv2(h))
    out['fc'] = tf.nn.relu(torso.fc(tf.reshape(h, [-1, torso.flat_size])))
  else:  # MLP.
    h = tf.reshape(x, [-1, torso.input_size])
    for k, layer in enumerate(torso.layers):
      out[f'linear_{k}'] = h = tf.nn.relu(layer(h))
  return {name: a.numpy() for name, a in out.items()}


def dead_counts(activations):
  """{layer: {units, dead, dead_fraction}}: units whose output is never > 0."""
  result = {}
  for name, a in activations.items():
    per_unit_max = a.reshape(-1, a.shape[-1]).max(axis=0)
    dead = int((per_unit_max <= 0).sum())
    result[name] = {'units': int(a.shape[-1]), 'dead': dead,
                    'dead_fraction': round(dead / a.shape[-1], 4)}
  return result


def measure(logdir, steps, num_envs, seed, checkpoint=None):
  from impala_tf import checkpoints  # pylint: disable=g-import-not-at-top
  from impala_tf import environments  # pylint: disable=g-import-not-at-top
  config, network, path = checkpoints.restore_network(logdir, checkpoint)
  if network.torso_name not in ('shallow', 'mlp'):
    raise SystemExit(f'bench/dead_units.py: {logdir}: network={network.torso_name}; '
                     'only the shallow and mlp torsos are supported')
  env = environments.make_vector_env(config.env, num_envs, seed,
                                     vectorization='sync',
                                     **environments.env_kwargs(config))
  rng = np.random.default_rng(seed)
  obs, _ = environments.reset(env, seed=seed)
  seen = [obs]
  for _ in range(steps):
    obs, *_ = env.step(rng.integers(0, env.single_action_space.n, num_envs))
    seen.append(obs)
  env.close()
  x = np.concatenate(seen).astype(np.float32)
  if np.asarray(seen[0]).dtype == np.uint8:
    x /= 255.0  # As the network scales uint8 observations.
  match = re.search(r'ckpt-(\d+)$', path)
  return {'logdir': logdir, 'checkpoint': path,
          'learner_steps': int(match.group(1)) if match else None,
          'observations': int(x.shape[0]),
          'layers': dead_counts(torso_activations(network.torso, x))}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('logdirs', nargs='+')
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--num_envs', type=int, default=4)
  parser.add_argument('--seed', type=int, default=1)
  parser.add_argument('--checkpoint', default=None)
  args = parser.parse_args()
  if args.checkpoint and len(args.logdirs) > 1:
    parser.error('--checkpoint needs exactly one LOGDIR')
  if args.steps < 1 or args.num_envs < 1:
    parser.error('--steps and --num_envs must be >= 1')
  for logdir in args.logdirs:
    print(json.dumps(measure(logdir, args.steps, args.num_envs, args.seed,
                             args.checkpoint)), flush=True)


if __name__ == '__main__':
  main()
