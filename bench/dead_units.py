"""Dead ReLU units of trained networks: per torso layer, the share never active; JSON.

Usage:
  python bench/dead_units.py LOGDIR [LOGDIR ...] [--steps=300] [--num_envs=4]
      [--seed=1] [--checkpoint=PATH] [--fresh=glorot,orthogonal]

For each run directory it restores the network of the newest checkpoint (or
`--checkpoint`, with one LOGDIR), plays `--steps` steps of uniformly random actions
in `--num_envs` of the run's envs (its config.json's env and preprocessing, the
gymnasium backend), and feeds every observation through the torso. A unit (a
channel of a convolution, a unit of a fully connected layer) is dead when its
pre-activation is <= 0 at every position of every observation: with a ReLU no
input of the game moves it, so it passes no gradient either (with
`--torso_activation=leaky_relu` it still passes 0.01 of one, and is counted the
same way). Prints one JSON line per run:

  {"logdir": ..., "checkpoint": ..., "learner_steps": N, "observations": M,
   "layers": {"conv1": {"units": 16, "dead": 14, "dead_fraction": 0.875,
                        "preactivation_std": 0.61}, ...}}

`--fresh=INIT[,INIT]` measures freshly initialised networks of each run's config
instead (`--weight_init=INIT`, the run's seed; `"checkpoint": null`), e.g. to see
how large each layer's pre-activations start on the game's frames.

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


def torso_preactivations(torso, x):
  """{layer name: float32 [N, ..., units] before its activation}, shallow or mlp."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from impala_tf import layers  # pylint: disable=g-import-not-at-top
  act = layers.activation(torso.activation)
  out = {}
  if hasattr(torso, 'conv1'):  # ShallowTorso.
    x = tf.reshape(x, (-1,) + torso.input_shape)
    out['conv1'] = z = torso.conv1(x)
    out['conv2'] = z = torso.conv2(act(z))
    out['fc'] = torso.fc(tf.reshape(act(z), [-1, torso.flat_size]))
  else:  # MLP.
    h = tf.reshape(x, [-1, torso.input_size])
    for k, layer in enumerate(torso.layers):
      out[f'linear_{k}'] = z = layer(h)
      h = act(z)
  return {name: z.numpy() for name, z in out.items()}


def dead_counts(preactivations):
  """{layer: {units, dead, dead_fraction, preactivation_std}}.

  A unit is dead when its pre-activation is <= 0 everywhere (its ReLU output is
  never > 0); the std is over all positions, observations and units.
  """
  result = {}
  for name, z in preactivations.items():
    per_unit_max = z.reshape(-1, z.shape[-1]).max(axis=0)
    dead = int((per_unit_max <= 0).sum())
    result[name] = {'units': int(z.shape[-1]), 'dead': dead,
                    'dead_fraction': round(dead / z.shape[-1], 4),
                    'preactivation_std': round(float(z.std()), 4)}
  return result


def observations(config, steps, num_envs, seed):
  """float32 [M, *obs_shape] from random play in the run's envs, scaled as the
  network scales them (uint8 / 255)."""
  from impala_tf import environments  # pylint: disable=g-import-not-at-top
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
  return x / 255.0 if np.asarray(seen[0]).dtype == np.uint8 else x


def _check_torso(logdir, network):
  if network.torso_name not in ('shallow', 'mlp'):
    raise SystemExit(f'bench/dead_units.py: {logdir}: network={network.torso_name}; '
                     'only the shallow and mlp torsos are supported')


def measure(logdir, steps, num_envs, seed, checkpoint=None):
  """The JSON record of the module docstring for the run's checkpoint."""
  from impala_tf import checkpoints  # pylint: disable=g-import-not-at-top
  config, network, path = checkpoints.restore_network(logdir, checkpoint)
  _check_torso(logdir, network)
  x = observations(config, steps, num_envs, seed)
  match = re.search(r'ckpt-(\d+)$', path)
  return {'logdir': logdir, 'checkpoint': path,
          'learner_steps': int(match.group(1)) if match else None,
          'observations': int(x.shape[0]),
          'layers': dead_counts(torso_preactivations(network.torso, x))}


def measure_fresh(logdir, init, steps, num_envs, seed):
  """The same record for a fresh network of the run's config with `init`."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from impala_tf import checkpoints  # pylint: disable=g-import-not-at-top
  from impala_tf import rundir  # pylint: disable=g-import-not-at-top
  config = dataclasses.replace(rundir.load_config(logdir), weight_init=init)
  network = checkpoints.build_network(config)
  _check_torso(logdir, network)
  x = observations(config, steps, num_envs, seed)
  return {'logdir': logdir, 'checkpoint': None, 'weight_init': init,
          'learner_steps': 0, 'observations': int(x.shape[0]),
          'layers': dead_counts(torso_preactivations(network.torso, x))}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('logdirs', nargs='+')
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--num_envs', type=int, default=4)
  parser.add_argument('--seed', type=int, default=1)
  parser.add_argument('--checkpoint', default=None)
  parser.add_argument('--fresh', default='',
                      help='comma-separated weight inits: fresh networks instead')
  args = parser.parse_args()
  fresh = [i for i in args.fresh.split(',') if i]
  if any(i not in ('glorot', 'orthogonal') for i in fresh):
    parser.error(f'--fresh={args.fresh}: must list glorot and/or orthogonal')
  if args.checkpoint and len(args.logdirs) > 1:
    parser.error('--checkpoint needs exactly one LOGDIR')
  if args.steps < 1 or args.num_envs < 1:
    parser.error('--steps and --num_envs must be >= 1')
  for logdir in args.logdirs:
    records = ([measure_fresh(logdir, i, args.steps, args.num_envs, args.seed)
                for i in fresh] if fresh else
               [measure(logdir, args.steps, args.num_envs, args.seed,
                        args.checkpoint)])
    for record in records:
      print(json.dumps(record), flush=True)


if __name__ == '__main__':
  main()
