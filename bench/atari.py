"""Atari (Pong) throughput per env backend and network; prints JSON.

Usage:
  python bench/atari.py [--env=ALE/Pong-v5] [--seconds=90] [--networks=shallow,deep,deep_lstm]
      [--backends=gymnasium,envpool] [--actor_backends=threads,ray] [--env_seconds=15]
      [--skip_step_vs_bare] [--flagfile=configs/pong.cfg] [--compare_sb3=PYTHON]
      [-- extra train flags]

Measurements:

0. Env only, per backend (`--env_backend`): 16 envs with our preprocessing stepped
   with uniformly random actions for `env_seconds`, in this process: frames/s
   (agent steps x 4). gymnasium: `SyncVectorEnv` and `AsyncVectorEnv`; EnvPool: the
   synchronous pool the actors use (`EnvPoolVectorEnv`), and EnvPool's async mode
   (`batch_size` 8 of 16: `recv` the 8 envs that are ready, `send` their actions).
1. The whole trainer, per network and backend: `python -m impala_tf.train` on the env
   for `seconds` of wall time (SIGINT then), with `--num_actors=2
   --num_envs_per_actor=8 --batch_size=16 --unroll_length=20 --env_backend=B
   --actor_backend=A` (A: `threads` unless `--actor_backends` names more). From
   metrics.jsonl, between the first line after the first learner step and the last
   line: env frames/s (actors), learner frames/s (frames trained; Atari frames =
   agent steps x 4) and learner_wait_fraction.
   With `--flagfile=F` the trainer runs F's setup instead (`--flagfile=F
   --env_backend=B --actor_backend=A` and the extra flags after it, which override
   it; `--networks` is then ignored and the row is named after F).
3. With `--compare_sb3=PYTHON` (an interpreter with stable-baselines3, torch and
   ale-py): the peer `bench/peers/sb3_ppo_pong_fps.py` (SB3 PPO, RL-Zoo's Atari
   settings, PongNoFrameskip-v4, CPU) for `--sb3_seconds`, after the trainer rows and
   alone on the machine; the summary gives each trainer row's env frames/s over
   SB3's.
4. Per network, in this process, on the same batch shape ([T+1=21, B=16, 84, 84, C] uint8): the
   time of one `Learner.step` (the tf.data element already on the device, V-trace,
   loss, all-reduce, clipping, RMSProp) next to the bare forward+backward pass of the
   same network (`network.unroll` + a scalar loss + `tape.gradient`, in a
   tf.function). The ratio shows what the learner adds around the network.
"""

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

import metrics_window  # bench/metrics_window.py, beside this script.

NETWORKS = {
    'shallow': ['--network=shallow'],
    'deep': ['--network=deep'],
    'deep_lstm': ['--network=deep', '--use_lstm'],
}
TRAIN_FLAGS = ['--num_actors=2', '--num_envs_per_actor=8', '--batch_size=16',
               '--unroll_length=20', '--optimizer=rmsprop', '--learning_rate=0.0006',
               '--reward_clipping=abs_one', '--log_interval_secs=5']


ENV_ONLY_NUM_ENVS = 16


def env_only_rates(env, backend, seconds):
  """Env frames/s of 16 envs stepped with random actions (see the docstring)."""
  from impala_tf import environments, envpool_env  # pylint: disable=g-import-not-at-top,g-multiple-import
  n = ENV_ONLY_NUM_ENVS
  rng = np.random.default_rng(0)

  def timed(step, num_actions, batch):
    """Calls step(actions int32 [batch]) for `seconds`; returns frames/s."""
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
      step(rng.integers(0, num_actions, batch).astype(np.int32))
      steps += batch
    return round(steps * 4 / (time.perf_counter() - start))

  out = {}
  if backend == 'gymnasium':
    for mode in ('sync', 'async'):
      venv = environments.make_vector_env(env, n, 0, vectorization=mode,
                                          backend='gymnasium')
      out[f'env_only_fps_{mode}'] = timed(venv.step, venv.single_action_space.n, n)
      venv.close()
    return out
  venv = envpool_env.make_vector_env(env, n, 0)
  venv.reset()
  num_actions = venv.single_action_space.n
  out['env_only_fps_sync'] = timed(venv.step, num_actions, n)
  venv.close()
  # EnvPool's async mode, batch_size n / 2: recv the envs that are ready, send
  # their actions. The raw pool (its own C++ frame stack, no adapter), so an
  # upper bound for that mode.
  import envpool  # pylint: disable=g-import-not-at-top
  pool = envpool.make(env_type='gymnasium', num_envs=n, batch_size=n // 2, seed=0,
                      **envpool_env.make_kwargs(env))
  pool.async_reset()

  def async_step(actions):
    pool.send(actions, pool.recv()[-1]['env_id'])

  out['env_only_fps_async_batch8'] = timed(async_step, num_actions, n // 2)
  pool.close()
  return out


def trainer_rates(env, name, seconds, extra, workdir, backend='auto',
                  actor_backend='threads'):
  logdir = os.path.join(workdir, f'{os.path.basename(name)}_{backend}_{actor_backend}')
  if name.endswith('.cfg'):  # A recorded setup: its flags, these after it.
    cmd = [sys.executable, '-m', 'impala_tf.train', f'--flagfile={name}',
           f'--logdir={logdir}', '--total_environment_frames=100000000',
           f'--env_backend={backend}', f'--actor_backend={actor_backend}',
           '--log_interval_secs=5', '--eval_interval_frames=0'] + extra
  else:
    cmd = [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}',
           f'--env={env}', '--total_environment_frames=100000000',
           f'--env_backend={backend}', f'--actor_backend={actor_backend}'
          ] + TRAIN_FLAGS + NETWORKS[name] + extra
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  time.sleep(seconds)
  proc.send_signal(signal.SIGINT)
  proc.wait(timeout=120)
  with open(os.path.join(logdir, 'metrics.jsonl'), encoding='utf-8') as f:
    lines = [json.loads(l) for l in f]
  steady = [l for l in lines if l.get('learner_steps', 0) > 0 and not l.get('final')]
  if len(steady) < 3:
    return {'error': f'only {len(steady)} metrics lines after the first step; '
                     'raise --seconds'}
  rates = metrics_window.window_rates(steady[1], steady[-1])
  rates['learner_wait_fraction'] = metrics_window.mean_of(
      steady[2:], 'learner_wait_fraction')
  rates['startup_seconds_to_first_learner_step'] = lines[-1].get('startup_seconds')
  return rates


def step_vs_bare(env, name, repeats=3):
  """Times Learner.step and the bare forward+backward on one fixed batch."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from impala_tf import config as config_lib  # pylint: disable=g-import-not-at-top
  from impala_tf import data, distribute, environments, learner, networks, types  # pylint: disable=g-import-not-at-top,g-multiple-import
  use_lstm = name == 'deep_lstm'
  torso = 'shallow' if name == 'shallow' else 'deep'
  cfg = config_lib.Config(env=env, network=torso, use_lstm=use_lstm, batch_size=16,
                          unroll_length=20, optimizer='rmsprop',
                          learning_rate=0.0006, reward_clipping='abs_one')
  obs_space, act_space = environments.env_spaces(env, use_lstm=use_lstm)
  strategy = distribute.get_strategy()
  lrn = learner.Learner(cfg, lambda: networks.make_network(cfg, obs_space, act_space),
                        strategy, action_repeat=4)
  b, t1, a = 16, 21, int(act_space.n)
  rng = np.random.default_rng(0)
  batch = {
      'observation': rng.integers(0, 255, (b, t1) + obs_space.shape, dtype=np.uint8),
      'reward': rng.normal(size=(b, t1)).astype(np.float32),
      'terminated': np.zeros((b, t1), bool), 'truncated': np.zeros((b, t1), bool),
      'first': np.zeros((b, t1), bool),
      'prev_action': rng.integers(0, a, (b, t1), dtype=np.int32),
      'action': rng.integers(0, a, (b, t1), dtype=np.int32),
      'behaviour_logits': rng.normal(size=(b, t1, a)).astype(np.float32),
      'policy_version': np.zeros(b, np.int64), 'unroll_id': np.arange(b, dtype=np.int64),
      'replayed': np.zeros(b, bool), 'reuse': np.zeros(b, np.int32),
  }
  for i, s in enumerate(lrn.network.initial_state(b)):
    batch[f'core_state_{i}'] = np.zeros(s.shape, np.float32)
  dist = strategy.experimental_distribute_values_from_function(
      lambda ctx: {k: tf.constant(v) for k, v in batch.items()})
  net = lrn.network

  @tf.function(autograph=False)
  def bare(obs, prev_action, reward, first):
    with tf.GradientTape() as tape:
      out, _ = net.unroll(types.AgentInput(obs, prev_action, reward, first),
                          net.initial_state(b))
      loss = tf.reduce_sum(out.policy_logits) + tf.reduce_sum(out.baseline)
    return tape.gradient(loss, net.trainable_variables)

  tm = lambda x: tf.constant(np.swapaxes(x, 0, 1))
  bare_args = (tm(batch['observation']), tm(batch['prev_action']),
               tm(batch['reward']), tm(batch['first']))

  def timeit(fn):
    fn()  # Trace.
    times = []
    for _ in range(repeats):
      t = time.perf_counter()
      out = fn()
      tf.nest.map_structure(lambda x: x.numpy() if hasattr(x, 'numpy') else x, out)
      times.append(time.perf_counter() - t)
    return float(np.median(times))

  step_s = timeit(lambda: lrn.step(dist))
  bare_s = timeit(lambda: bare(*bare_args))
  del data
  return {'learner_step_seconds': round(step_s, 3),
          'bare_forward_backward_seconds': round(bare_s, 3),
          'step_over_bare': round(step_s / bare_s, 3)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--env', default='ALE/Pong-v5')
  parser.add_argument('--seconds', type=float, default=90)
  parser.add_argument('--networks', default='shallow,deep,deep_lstm')
  parser.add_argument('--backends', default='gymnasium,envpool',
                      help='comma-separated --env_backend values to compare')
  parser.add_argument('--actor_backends', default='threads',
                      help='comma-separated --actor_backend values (threads,ray)')
  parser.add_argument('--env_seconds', type=float, default=15,
                      help='seconds per env-only measurement; 0 skips them')
  parser.add_argument('--skip_step_vs_bare', action='store_true',
                      help='skip the learner step / bare forward+backward timing')
  parser.add_argument('--flagfile', default='',
                      help='run this recorded setup (configs/*.cfg) as the trainer')
  parser.add_argument('--compare_sb3', default='',
                      help='python with stable-baselines3: run the SB3 PPO peer too')
  parser.add_argument('--sb3_seconds', type=float, default=240)
  parser.add_argument('extra', nargs='*', help='extra train flags after --')
  args = parser.parse_args()
  backends = args.backends.split(',')
  env_only, results = {}, []
  load_before = os.getloadavg()
  if args.env_seconds > 0:
    for backend in backends:
      env_only[backend] = env_only_rates(args.env, backend, args.env_seconds)
      print(json.dumps({backend: env_only[backend]}), file=sys.stderr, flush=True)
  with tempfile.TemporaryDirectory() as workdir:
    names = [args.flagfile] if args.flagfile else args.networks.split(',')
    for name in names:
      for backend in backends:
        for actor_backend in args.actor_backends.split(','):
          r = {'network': name, 'env_backend': backend,
               'actor_backend': actor_backend,
               'flags': ([f'--flagfile={name}'] if args.flagfile else
                         NETWORKS[name]) + args.extra}
          r.update(trainer_rates(args.env, name, args.seconds, args.extra, workdir,
                                 backend, actor_backend))
          print(json.dumps(r), file=sys.stderr, flush=True)
          results.append(r)
      if not args.skip_step_vs_bare and not args.flagfile:
        r = {'network': name, 'step_vs_bare': step_vs_bare(args.env, name)}
        print(json.dumps(r), file=sys.stderr, flush=True)
        results.append(r)
  summary = {}
  if args.compare_sb3:
    peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'peers',
                        'sb3_ppo_pong_fps.py')
    out = subprocess.run([args.compare_sb3, peer, f'--seconds={args.sb3_seconds:g}'],
                         capture_output=True, text=True, check=False)
    lines = [l for l in out.stdout.splitlines() if l.startswith('{')]
    sb3 = json.loads(lines[-1]) if lines else {'error': out.stderr[-1000:]}
    print(json.dumps({'sb3': sb3}), file=sys.stderr, flush=True)
    results.append({'peer': sb3})
    for r in results:
      if r.get('env_fps') and sb3.get('env_frames_per_s'):
        summary[f"env_fps_over_sb3_ppo_{r['env_backend']}_{r['actor_backend']}"] = (
            round(r['env_fps'] / sb3['env_frames_per_s'], 2))
  first = names[0]
  rates = {(r['env_backend'], r['actor_backend']): r.get('env_fps')
           for r in results if r.get('network') == first and 'env_backend' in r}
  for actor_backend in args.actor_backends.split(','):
    gym_fps = rates.get(('gymnasium', actor_backend))
    pool_fps = rates.get(('envpool', actor_backend))
    if gym_fps and pool_fps:
      summary[f'trainer_env_fps_envpool_over_gymnasium_{actor_backend}'] = (
          round(pool_fps / gym_fps, 2))
  for backend in backends:
    threads, ray = rates.get((backend, 'threads')), rates.get((backend, 'ray'))
    if threads and ray:
      summary[f'trainer_env_fps_ray_over_threads_{backend}'] = round(
          ray / threads, 2)
  print(json.dumps({
      'benchmark': 'atari_throughput', 'env': args.env,
      # With --flagfile the rows run the file's setup, not TRAIN_FLAGS.
      'train_flags': [] if args.flagfile else TRAIN_FLAGS + args.extra,
      'machine': {'cpus': os.cpu_count(), 'python': platform.python_version(),
                  # Given to the trainers; unset: theirs (impala_tf.cpu_kernels).
                  'TF_ENABLE_ONEDNN_OPTS': os.environ.get('TF_ENABLE_ONEDNN_OPTS'),
                  'loadavg_1min_before': round(load_before[0], 2),
                  'loadavg_1min_after': round(os.getloadavg()[0], 2)},
      'env_only': env_only,
      'results': results,
      'summary': summary,
  }, indent=1))


if __name__ == '__main__':
  main()
