"""End-to-end tests of impala_tf.driver.train and the `python -m impala_tf.train` CLI.

The in-process runs use one learner replica (num_virtual_cpu_devices=0), so they
can share the pytest process. The runs on 2 virtual CPU devices go through the
command line in a subprocess (devices must be configured before TensorFlow
initialises).
"""

import glob
import json
import os
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import actor_pool
from impala_tf import config as config_lib
from impala_tf import driver
from impala_tf import testing

import helpers

_REPO = str(helpers.REPO)

REQUIRED_KEYS = (
    'env_frames', 'trained_frames', 'replayed_frames', 'consumed_frames',
    'learner_steps', 'episodes', 'episode_return_mean', 'fps', 'wall_seconds',
    'policy_lag_mean', 'policy_lag_max', 'learner_queue_size',
    'learner_wait_fraction')


_read_metrics = helpers.read_metrics


def _check_counters(lines, config):
  """Counters are consistent on every line and monotonic across lines."""
  frames_per_step = config.batch_size * config.unroll_length
  for m in lines:
    for k in REQUIRED_KEYS:
      assert k in m, (k, m)
    assert m['trained_frames'] == m['learner_steps'] * frames_per_step, m
    assert m['consumed_frames'] <= m['env_frames'], m
    assert 0.0 <= m['learner_wait_fraction'] <= 1.0, m
    assert 0 <= m['learner_queue_size'] <= config.learner_queue_size, m
    assert m['policy_lag_max'] >= m['policy_lag_mean'] >= 0, m
    assert m['fps'] >= 0 and m['wall_seconds'] > 0, m
  for k in ('env_frames', 'trained_frames', 'consumed_frames', 'replayed_frames',
            'learner_steps', 'episodes', 'wall_seconds'):
    values = [m[k] for m in lines]
    assert values == sorted(values), (k, values)


def _check_final_identity(final, config):
  """Every batch was used num_sgd_iter times, counted once as fresh or replayed."""
  assert final['trained_frames'] == (
      final['consumed_frames'] + final['replayed_frames']) * config.num_sgd_iter, final
  ring = config.num_sgd_iter * config.minibatch_buffer_size
  assert final['learner_steps'] % ring == 0, final  # The reuse ring was finished.


def _check_checkpoint(logdir, final):
  path = tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))
  assert path is not None, os.listdir(os.path.join(logdir, 'checkpoints'))
  reader = tf.train.load_checkpoint(path)
  names = reader.get_variable_to_shape_map()
  def counter(name):
    keys = [n for n in names if n.startswith(name + '/') and 'VARIABLE_VALUE' in n]
    assert len(keys) == 1, (name, sorted(names))
    return int(reader.get_tensor(keys[0]))
  assert counter('learner_steps') == final['learner_steps']
  assert counter('trained_frames') == final['trained_frames']
  assert counter('consumed_frames') == final['consumed_frames']
  assert counter('replayed_frames') == final['replayed_frames']
  return path


@pytest.fixture(scope='module')
def replay_run(tmp_path_factory):
  """One short run with replay and minibatch reuse; shared by several tests."""
  logdir = str(tmp_path_factory.mktemp('replay_run'))
  config = testing.tiny_config(
      logdir=logdir, replay_proportion=0.5, replay_buffer_num_slots=8,
      num_sgd_iter=2, minibatch_buffer_size=2, total_environment_frames=600,
      log_interval_secs=0.3)
  seen = []
  result = driver.train(config, on_metrics=seen.append)
  return config, result, seen


@pytest.mark.e2e
def test_run_leaves_config_and_metrics(replay_run):
  config, result, seen = replay_run
  logdir = config.logdir
  assert result.logdir == logdir
  with open(os.path.join(logdir, 'config.json'), encoding='utf-8') as f:
    saved = json.load(f)
  # The flags as given, with the env backend the run used ('auto' resolved).
  assert config.env_backend == 'auto' and saved['env_backend'] == 'gymnasium'
  used = config.replace(env_backend='gymnasium')
  assert saved == used.to_dict()
  assert config_lib.Config.from_dict(saved) == used
  lines = _read_metrics(logdir)
  assert len(lines) >= 2 and len(lines) == len(seen)
  _check_counters(lines, config)
  final = lines[-1]
  assert final['final'] is True and not any(m.get('final') for m in lines[:-1])
  assert final['reached_target'] is False and final['interrupted'] is False
  assert final == json.loads(json.dumps(result.metrics))
  assert not result.reached_target and not result.interrupted
  # The chain env returns 8 every episode.
  assert final['episodes'] > 0 and final['episode_return_mean'] == 8.0
  events = os.listdir(os.path.join(logdir, 'tensorboard'))
  assert any(e.startswith('events.out.tfevents') for e in events), events


@pytest.mark.e2e
def test_term_norms_are_measured_on_the_logged_calls_only(tmp_path, monkeypatch):
  calls = []  # (term_norms, the call's grad_norm_policy or None), in order.
  step = driver.learner_lib.Learner.step_from_iterator

  def recording(self, iterator, reuse=1, term_norms=None):
    out = step(self, iterator, reuse, term_norms=term_norms)
    calls.append((term_norms, out.get('grad_norm_policy')))
    return out

  monkeypatch.setattr(driver.learner_lib.Learner, 'step_from_iterator', recording)
  config = testing.tiny_config(logdir=str(tmp_path), loss_term_grad_norms=True,
                               total_environment_frames=4000, log_interval_secs=0.3)
  driver.train(config)
  lines = _read_metrics(str(tmp_path))
  measured = [norm for asked, norm in calls if asked]
  assert calls[0][0] is True  # The first call: a run too short to log has them.
  assert all(norm is not None for norm in measured)
  assert all(norm is None for asked, norm in calls if not asked)
  # A few calls measure them (one per metrics line, plus the first), not every one.
  assert len(measured) <= len(lines) + 1 < len(calls), (len(measured), len(calls))
  # Each line shows the norms of the call just before it.
  logged = [l['grad_norm_policy'] for l in lines if 'grad_norm_policy' in l]
  assert logged and all(min(abs(v - n) for n in measured) < 1e-6 * (1 + abs(v))
                        for v in logged), (logged, measured)
  assert lines[-1]['grad_norm_policy'] == pytest.approx(measured[-1])


@pytest.mark.e2e
def test_popart_run_logs_its_statistics_and_the_diagnostics(tmp_path):
  # The chain env pays 1 per step for 8 steps: the V-trace targets sit between
  # 1 and 8, so PopArt's mu lands there and sigma well below the initial 1e6 cap.
  config = testing.tiny_config(logdir=str(tmp_path), popart=True, popart_beta=0.1,
                               entropy_cost_schedule='constant',
                               grad_clip=1e-3, total_environment_frames=400,
                               log_interval_secs=0.2)
  driver.train(config)
  lines = _read_metrics(str(tmp_path))
  final = lines[-1]
  assert 1.0 < final['popart_mu'] < 8.0, final
  assert 0.0 < final['popart_sigma'] < 8.0, final
  # grad_clip=1e-3: every step is clipped (a line whose window had no learner
  # step reads 0).
  fractions = [l['grad_clipped_fraction'] for l in lines]
  assert set(fractions) <= {0.0, 1.0} and 1.0 in fractions, fractions
  for k in ('grad_norm_policy', 'grad_norm_baseline', 'grad_norm_entropy'):
    assert final[k] > 0, (k, final)
  assert 0.0 <= final['rho_above_1p1_fraction'] <= 1.0
  assert final['log_rho_abs_mean'] >= 0.0


@pytest.mark.e2e
def test_run_stops_at_total_environment_frames(replay_run):
  config, result, _ = replay_run
  final = result.metrics
  total = config.total_environment_frames
  assert final['env_frames'] >= total
  # Back-pressure bounds how far the actors run ahead of the learner: the learner
  # queue plus the tf.data buffers hold a few dozen unrolls, not thousands.
  assert final["env_frames"] <= total + 1000, final
  assert final['consumed_frames'] > 0


@pytest.mark.e2e
def test_frames_identity_with_replay_and_reuse(replay_run):
  config, result, _ = replay_run
  final = result.metrics
  _check_final_identity(final, config)
  assert final['replayed_frames'] > 0 and final['consumed_frames'] > 0, final
  assert final['learner_steps'] >= 4


@pytest.mark.e2e
def test_checkpoint_and_saved_policy_hold_the_final_weights(replay_run):
  config, result, _ = replay_run
  path = _check_checkpoint(config.logdir, result.metrics)
  # The saved policy loads with TensorFlow alone and equals the checkpointed net.
  policy = tf.saved_model.load(os.path.join(config.logdir, 'saved_policy'))
  obs = np.array([[t / 8.0, 1.0, -1.0] for t in range(8)], np.float32)
  out = policy.signatures['serving_default'](observation=tf.constant(obs))
  action = out['action'].numpy()
  assert action.shape == (8,) and set(action.tolist()) <= {0, 1}
  from impala_tf import environments  # pylint: disable=g-import-not-at-top
  from impala_tf import networks  # pylint: disable=g-import-not-at-top
  obs_space, action_space = environments.env_spaces(config.env)
  net = networks.make_network(config.replace(seed=config.seed + 1), obs_space,
                              action_space)
  tf.train.Checkpoint(network=net).restore(path).expect_partial()
  ref = net.step(_step_input(obs))[0]
  np.testing.assert_allclose(out['policy_logits'].numpy(),
                             ref.policy_logits.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out['baseline'].numpy(), ref.baseline.numpy(),
                             rtol=1e-5, atol=1e-5)


def _step_input(obs):
  from impala_tf import types  # pylint: disable=g-import-not-at-top
  b = len(obs)
  return types.AgentInput(tf.constant(obs), tf.zeros([b], tf.int32),
                          tf.zeros([b], tf.float32), tf.zeros([b], tf.bool))


@pytest.mark.e2e
def test_stop_event_from_another_thread_interrupts(tmp_path):
  config = testing.tiny_config(
      logdir=str(tmp_path), total_environment_frames=10_000_000, num_sgd_iter=2,
      log_interval_secs=0.2)
  stop = threading.Event()
  first_line = threading.Event()

  def stopper():
    first_line.wait(timeout=120)
    stop.set()

  thread = threading.Thread(target=stopper, daemon=True)
  thread.start()
  result = driver.train(config, stop_event=stop,
                        on_metrics=lambda m: first_line.set())
  thread.join(timeout=5)
  assert result.interrupted and not result.reached_target
  final = _read_metrics(str(tmp_path))[-1]
  assert final['interrupted'] is True and final['final'] is True
  assert final['env_frames'] < config.total_environment_frames
  _check_final_identity(final, config)
  _check_checkpoint(str(tmp_path), final)
  assert os.path.isdir(os.path.join(str(tmp_path), 'saved_policy'))


@pytest.mark.e2e
def test_stop_while_the_actors_are_stalled_returns_within_seconds(tmp_path):
  # Every env hangs at its step 3: no unroll ever reaches the learner, which
  # waits in TensorFlow for a batch. A stop request must not wait for
  # --learner_queue_timeout (and then fail); it ends the run cleanly.
  config = testing.tiny_config(
      logdir=str(tmp_path), env=testing.faulty_id('hang'),
      learner_queue_timeout=120.0, total_environment_frames=10_000)
  stop = threading.Event()
  sent = []

  def stopper():
    deadline = time.time() + 120
    while (not os.path.exists(os.path.join(str(tmp_path), 'config.json')) and
           time.time() < deadline):
      time.sleep(0.1)
    time.sleep(3)  # The actor is hung and the learner waits for data.
    sent.append(time.time())
    stop.set()

  threading.Thread(target=stopper, daemon=True).start()
  result = driver.train(config, stop_event=stop)
  took = time.time() - sent[0]
  assert took < 20, took
  assert result.interrupted and not result.reached_target
  final = _read_metrics(str(tmp_path))[-1]
  assert final['interrupted'] is True and final['learner_steps'] == 0, final
  _check_checkpoint(str(tmp_path), final)  # A final checkpoint, 0 steps in it.


@pytest.mark.e2e
def test_target_return_stops_early(tmp_path):
  # Every chain episode returns 8: the 100-episode mean reaches 8 as soon as 100
  # episodes are done (800 agent steps).
  config = testing.tiny_config(logdir=str(tmp_path), target_return=8.0,
                               total_environment_frames=200_000)
  result = driver.train(config)
  final = result.metrics
  assert result.reached_target and not result.interrupted
  assert final['reached_target'] is True
  assert final['episodes'] >= 100
  assert final['episode_return_mean'] == 8.0
  assert final['env_frames'] < config.total_environment_frames
  _check_counters(_read_metrics(str(tmp_path)), config)


@pytest.mark.e2e
def test_rerunning_a_finished_run_trains_nothing(tmp_path):
  config = testing.tiny_config(logdir=str(tmp_path))
  first = driver.train(config)
  lines_before = len(_read_metrics(str(tmp_path)))
  second = driver.train(config)
  # Restored counters already exceed the budget: no step, no new metrics line,
  # the same final metrics, and the SavedModel is (re)written.
  assert second.metrics['learner_steps'] == first.metrics['learner_steps']
  assert second.metrics['env_frames'] == first.metrics['env_frames']
  assert len(_read_metrics(str(tmp_path))) == lines_before
  assert os.path.isdir(os.path.join(str(tmp_path), 'saved_policy'))


# --- Reliability: resume checks, env seeds, env faults, non-finite numbers ---------


def _snapshot(logdir):
  """Every file under logdir/checkpoints and config.json, with its bytes."""
  files = {}
  for root, _, names in os.walk(os.path.join(logdir, 'checkpoints')):
    for name in names:
      with open(os.path.join(root, name), 'rb') as f:
        files[os.path.join(root, name)] = f.read()
  with open(os.path.join(logdir, 'config.json'), 'rb') as f:
    files['config.json'] = f.read()
  return files


@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
  logdir = str(tmp_path_factory.mktemp('finished_run'))
  config = testing.tiny_config(logdir=logdir, total_environment_frames=200)
  driver.train(config)
  return config


@pytest.mark.e2e
@pytest.mark.parametrize('change,expected', [
    (dict(mlp_hidden_sizes=(16, 16)), '--mlp_hidden_sizes=16 there, 16,16 now'),
    (dict(use_lstm=True), '--use_lstm=false there, true now'),
    (dict(network='deep', env=testing.FAKE_IMAGE_ID),
     f'--env={testing.CHAIN_ID} there, {testing.FAKE_IMAGE_ID} now; --network=auto '
     'there, deep now'),
    (dict(optimizer='rmsprop'), '--optimizer=adam there, rmsprop now'),
])
def test_resume_refuses_changed_shapes_and_touches_nothing(finished_run, change,
                                                           expected):
  before = _snapshot(finished_run.logdir)
  with pytest.raises(driver.TrainingError) as e:
    driver.train(finished_run.replace(total_environment_frames=10_000, **change))
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith('cannot resume from the checkpoints in '), message
  assert f'({expected}); rerun with the flags in ' in message, message
  assert _snapshot(finished_run.logdir) == before


@pytest.mark.e2e
def test_resume_with_another_env_is_refused_and_touches_nothing(finished_run):
  before = _snapshot(finished_run.logdir)
  other = testing.faulty_id('nan_reward')  # The same spaces as the chain env.
  with pytest.raises(driver.TrainingError) as e:
    driver.train(finished_run.replace(total_environment_frames=10_000, env=other))
  assert f'(--env={testing.CHAIN_ID} there, {other} now); rerun' in str(e.value)
  assert _snapshot(finished_run.logdir) == before


@pytest.mark.e2e
def test_resume_with_an_unreadable_config_json_is_refused(tmp_path):
  config = testing.tiny_config(logdir=str(tmp_path), total_environment_frames=200)
  driver.train(config)
  with open(os.path.join(str(tmp_path), 'config.json'), 'w', encoding='utf-8') as f:
    f.write('{"env": ')  # Cut short.
  before = _snapshot(str(tmp_path))
  with pytest.raises(driver.TrainingError) as e:
    driver.train(config.replace(total_environment_frames=400))
  assert '\n' not in str(e.value)
  assert 'config.json cannot be read (' in str(e.value), str(e.value)
  assert _snapshot(str(tmp_path)) == before


@pytest.mark.e2e
def test_resume_with_changed_learning_flags_warns_in_one_line(tmp_path, capfd):
  config = testing.tiny_config(logdir=str(tmp_path), total_environment_frames=200)
  driver.train(config)
  capfd.readouterr()
  result = driver.train(config.replace(total_environment_frames=400,
                                       discounting=0.9, baseline_cost=0.25))
  assert result.metrics['env_frames'] >= 400
  warnings = [l for l in capfd.readouterr().err.splitlines()
              if l.startswith('impala_tf: warning:')]
  assert warnings == [
      'impala_tf: warning: resuming with other learning flags than the run that '
      'wrote the checkpoints (--discounting=0.99 there, 0.9 now; --baseline_cost=0.5 '
      'there, 0.25 now; --total_environment_frames=200 there, 400 now); the rest '
      'of the run learns with the new values'], warnings


@pytest.mark.e2e
def test_resumed_run_stopped_before_its_first_step_keeps_its_checkpoint(
    tmp_path, monkeypatch):
  tokens = testing.fault_tokens(str(tmp_path / 'tokens'), 0)
  monkeypatch.setenv(testing.FAULTS_ENV_VAR, tokens)  # No fault fires: trains.
  logdir = str(tmp_path / 'run')
  config = testing.tiny_config(logdir=logdir, env=testing.faulty_id('hang'),
                               total_environment_frames=200)
  first = driver.train(config).metrics
  before = _snapshot(logdir)
  del before['config.json']
  testing.fault_tokens(tokens, 1)  # Now one env hangs: no data, no learner step.
  stop = threading.Event()
  timer = threading.Timer(3.0, stop.set)
  timer.start()
  result = driver.train(config.replace(total_environment_frames=10_000),
                        stop_event=stop)
  timer.cancel()
  assert result.interrupted
  assert result.metrics['learner_steps'] == first['learner_steps']
  after = _snapshot(logdir)
  del after['config.json']
  assert after == before  # The restored checkpoint was not rewritten.


@pytest.mark.e2e
def test_resumed_run_keeps_the_episodes_of_its_mean(tmp_path):
  config = testing.tiny_config(logdir=str(tmp_path), total_environment_frames=200)
  first = driver.train(config).metrics
  first_lines = len(_read_metrics(str(tmp_path)))
  assert 0 < first['episodes_in_mean'] == first['episodes'] < 100
  second = driver.train(config.replace(total_environment_frames=400)).metrics
  assert second['episodes'] > first['episodes']
  # Every line of the resumed run averages the episodes before the stop too
  # (without them its first lines would count only the episodes since).
  resumed = _read_metrics(str(tmp_path))[first_lines:]
  assert resumed
  for line in resumed:
    assert line['episodes_in_mean'] == min(100, line['episodes']), line
  reader = tf.train.load_checkpoint(
      tf.train.latest_checkpoint(os.path.join(str(tmp_path), 'checkpoints')))
  size = int(reader.get_tensor('episode_window/size/.ATTRIBUTES/VARIABLE_VALUE'))
  returns = reader.get_tensor('episode_window/returns/.ATTRIBUTES/VARIABLE_VALUE')
  lengths = reader.get_tensor('episode_window/lengths/.ATTRIBUTES/VARIABLE_VALUE')
  assert size == second['episodes_in_mean']
  assert np.mean(returns[:size]) == pytest.approx(second['episode_return_mean'])
  assert np.mean(lengths[:size]) == pytest.approx(second['episode_length_mean'])


@pytest.mark.e2e
def test_second_run_on_a_busy_logdir_is_refused(tmp_path):
  config = testing.tiny_config(logdir=str(tmp_path))
  from impala_tf import rundir  # pylint: disable=g-import-not-at-top
  with rundir.LogdirLock(str(tmp_path)):
    with pytest.raises(driver.TrainingError) as e:
      driver.train(config)
  assert str(e.value).startswith(f'--logdir={tmp_path}: is in use by another run '
                                 f'(pid {os.getpid()})'), str(e.value)
  assert os.listdir(str(tmp_path)) == ['.impala_tf.lock']  # Nothing else written.
  driver.train(config)  # Released: trains.


@pytest.mark.e2e
def test_resumed_run_draws_fresh_env_seeds(tmp_path, monkeypatch):
  seeds, first_obs = [], []
  make = driver.environments.make_vector_env

  def recording_make(env_id, num_envs, seed, **kwargs):
    env = make(env_id, num_envs, seed, **kwargs)
    reset = env.reset

    def recording_reset(**reset_kwargs):
      out = reset(**reset_kwargs)
      seeds.append(reset_kwargs.get('seed'))
      first_obs.append(np.array(out[0]))
      return out
    env.reset = recording_reset
    return env

  monkeypatch.setattr(driver.environments, 'make_vector_env', recording_make)
  config = testing.tiny_config(logdir=str(tmp_path), env=testing.FAKE_IMAGE_ID,
                               network='mlp', total_environment_frames=200)
  driver.train(config)
  driver.train(config.replace(total_environment_frames=400))
  assert seeds == [actor_pool.env_seed(config, 0, 0, 0), actor_pool.env_seed(config, 0, 0, 1)]
  assert seeds[0] != seeds[1]
  assert first_obs[0].shape == first_obs[1].shape == (4, 36, 36, 2)
  assert not np.array_equal(first_obs[0], first_obs[1])
  reader = tf.train.load_checkpoint(
      tf.train.latest_checkpoint(os.path.join(str(tmp_path), 'checkpoints')))
  assert int(reader.get_tensor('resumes/.ATTRIBUTES/VARIABLE_VALUE')) == 1
  # Deterministic: the same seed, actor, restarts and resumes give the same seed;
  # restarts and resumes never collide for one run.
  assert actor_pool.env_seed(config, 0, 0, 1) == seeds[1]
  drawn = {actor_pool.env_seed(config, a, r, n) for a in range(1) for r in range(5)
           for n in range(5)}
  assert len(drawn) == 25


@pytest.mark.e2e
def test_env_that_raises_mid_episode_restarts_its_actor(tmp_path, monkeypatch):
  tokens = testing.fault_tokens(str(tmp_path / 'tokens'), 1)
  monkeypatch.setenv(testing.FAULTS_ENV_VAR, tokens)
  config = testing.tiny_config(logdir=str(tmp_path / 'run'),
                               env=testing.faulty_id('raise'),
                               total_environment_frames=400)
  result = driver.train(config)
  final = result.metrics
  assert not os.listdir(tokens)  # The fault fired (once).
  assert final['actor_restarts'] == 1
  assert final['env_frames'] >= config.total_environment_frames
  _check_counters(_read_metrics(config.logdir), config)
  _check_final_identity(final, config)
  # The cut episode is not reported; every whole one returns 8.
  assert final['episodes'] > 0 and final['episode_return_mean'] == 8.0


@pytest.mark.e2e
def test_non_finite_env_data_stops_the_run_after_the_restart_limit(tmp_path):
  config = testing.tiny_config(logdir=str(tmp_path),
                               env=testing.faulty_id('nan_reward'),
                               total_environment_frames=10_000)
  with pytest.raises(driver.TrainingError) as e:
    driver.train(config)
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(
      f'actor 0 died 5 times in 60 s; last error: NonFiniteEnvError: env '
      f'{testing.faulty_id("nan_reward")} (actor 0, env 0) returned a non-finite '
      'reward (nan) at step 3;'), message
  final = _read_metrics(str(tmp_path))[-1]
  assert final['final'] is True and final['actor_restarts'] == 4
  assert tf.train.latest_checkpoint(os.path.join(str(tmp_path), 'checkpoints'))


@pytest.mark.e2e
def test_non_finite_updates_stop_the_run_keeping_the_last_checkpoint(tmp_path):
  # Rewards so large that every loss overflows to inf, unless clipped.
  config = testing.tiny_config(logdir=str(tmp_path), total_environment_frames=200,
                               env=testing.faulty_id('huge_reward'),
                               reward_clipping='abs_one')
  driver.train(config)
  before = _snapshot(str(tmp_path))
  del before['config.json']  # Rewritten (another --reward_clipping).
  huge = config.replace(reward_clipping='none', total_environment_frames=10_000,
                        max_nonfinite_updates=3)
  with pytest.raises(driver.TrainingError) as e:
    driver.train(huge)
  message = str(e.value)
  assert message.startswith('3 updates in a row had a non-finite loss or gradient '
                            'and were skipped'), message
  assert 'lower --learning_rate' in message and '\n' not in message
  after = _snapshot(str(tmp_path))
  del after['config.json']
  assert after == before  # No checkpoint written: the last good one is the latest.
  final = _read_metrics(str(tmp_path))[-1]
  assert final['final'] is True and final['nonfinite_updates'] == 3


def _truncate_data(checkpoint_prefix):
  data = checkpoint_prefix + '.data-00000-of-00001'
  with open(data, 'r+b') as f:
    f.truncate(os.path.getsize(data) // 2)


@pytest.mark.e2e
def test_run_resumes_from_the_newest_readable_checkpoint(tmp_path, capfd):
  config = testing.tiny_config(logdir=str(tmp_path), total_environment_frames=200)
  first = driver.train(config).metrics
  second = driver.train(config.replace(total_environment_frames=400)).metrics
  directory = os.path.join(str(tmp_path), 'checkpoints')
  newest = tf.train.latest_checkpoint(directory)
  assert second['env_frames'] > first['env_frames']
  _truncate_data(newest)
  capfd.readouterr()
  third = driver.train(config.replace(total_environment_frames=600)).metrics
  warnings = [l for l in capfd.readouterr().err.splitlines()
              if l.startswith('impala_tf: warning: checkpoint')]
  assert len(warnings) == 1
  assert warnings[0].startswith(f'impala_tf: warning: checkpoint {newest} cannot be '
                                'read ('), warnings[0]
  # Resumed from the first run's checkpoint (resumes 0 in it; the damaged one held
  # 1), then trained on to the new budget and checkpointed.
  assert third['env_frames'] >= 600
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(directory))
  assert int(reader.get_tensor('resumes/.ATTRIBUTES/VARIABLE_VALUE')) == 1
  assert int(reader.get_tensor(
      'run_state/env_frames/.ATTRIBUTES/VARIABLE_VALUE')) == third['env_frames']


@pytest.mark.e2e
def test_run_with_no_readable_checkpoint_stops_and_touches_nothing(tmp_path):
  config = testing.tiny_config(logdir=str(tmp_path), total_environment_frames=200)
  driver.train(config)
  for index in glob.glob(os.path.join(str(tmp_path), 'checkpoints', '*.index')):
    _truncate_data(index[:-len('.index')])
  before = _snapshot(str(tmp_path))
  with pytest.raises(driver.TrainingError) as e:
    driver.train(config.replace(total_environment_frames=400))
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith('no checkpoint in '), message
  assert message.endswith('to start over'), message
  assert _snapshot(str(tmp_path)) == before


# --- Command line, 2 learner replicas on virtual CPU devices ----------------------

_TINY_FLAGS = ['--num_actors=2', '--num_envs_per_actor=4', '--unroll_length=5',
               '--batch_size=4', '--mlp_hidden_sizes=16']


def _run_cli(logdir, flags, timeout=300):
  env = dict(os.environ, PYTHONPATH=_REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
             CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2')
  cmd = [sys.executable, '-m', 'impala_tf.train', f'--logdir={logdir}'] + flags
  proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=_REPO,
                        timeout=timeout, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  return proc


def _check_cli_run(logdir, proc, expected):
  config = config_lib.Config.from_dict(
      json.load(open(os.path.join(logdir, 'config.json'), encoding='utf-8')))
  for k, v in expected.items():
    assert getattr(config, k) == v, (k, getattr(config, k), v)
  lines = _read_metrics(logdir)
  assert lines
  _check_counters(lines, config)
  final = lines[-1]
  assert final['final'] is True and final['interrupted'] is False
  assert final['env_frames'] >= config.total_environment_frames
  _check_final_identity(final, config)
  assert final['replayed_frames'] > 0 and final['consumed_frames'] > 0, final
  _check_checkpoint(logdir, final)
  assert 'impala_tf.train: done:' in proc.stdout
  # Two towers: MirroredStrategy over both virtual CPU devices.
  assert final['num_replicas'] == 2, final
  return config, final


@pytest.mark.e2e
def test_cli_two_replicas_replay_reuse_chain(tmp_path):
  logdir = str(tmp_path / 'run')
  flags = ['--env=impala_tf.testing:ImpalaChain-v0', '--num_data_loader_buffers=2',
           '--replay_proportion=0.5', '--replay_buffer_num_slots=8',
           '--num_sgd_iter=2', '--minibatch_buffer_size=2',
           '--num_virtual_cpu_devices=2', '--total_environment_frames=2000',
           # 3 steps per call against a reuse ring of 4: the run stops at a
           # multiple of both (the ring is checked by _check_cli_run).
           '--learner_steps_per_call=3'] + _TINY_FLAGS
  proc = _run_cli(logdir, flags)
  _, final = _check_cli_run(logdir, proc, dict(
      num_virtual_cpu_devices=2, num_data_loader_buffers=2, replay_proportion=0.5,
      replay_buffer_num_slots=8, num_sgd_iter=2, minibatch_buffer_size=2,
      total_environment_frames=2000, mlp_hidden_sizes=(16,), batch_size=4,
      learner_steps_per_call=3))
  assert final['learner_steps'] % 12 == 0, final
  assert final['episode_return_mean'] == 8.0
  policy = tf.saved_model.load(os.path.join(logdir, 'saved_policy'))
  out = policy.signatures['serving_default'](
      observation=tf.constant([[0.0, 1.0, -1.0]], tf.float32))
  assert out['action'].shape == (1,)


@pytest.mark.e2e
def test_lstm_towers_replay_reuse_fake_image(tmp_path):
  logdir = str(tmp_path / 'run')
  flags = ['--env=impala_tf.testing:ImpalaFakeImage-v0', '--use_lstm',
           '--lstm_size=16', '--num_sgd_iter=2', '--replay_proportion=0.5',
           '--replay_buffer_num_slots=8', '--num_virtual_cpu_devices=2',
           '--network=deep', '--num_actors=1', '--num_envs_per_actor=4',
           '--unroll_length=5', '--batch_size=4', '--total_environment_frames=300',
           # Back-pressure: with one chunk in the queue the actor cannot run far
           # ahead, so the learner trains on most of the 300 frames (replays
           # included) however fast the actor is.
           '--learner_queue_size=1']
  proc = _run_cli(logdir, flags)
  config, final = _check_cli_run(logdir, proc, dict(
      use_lstm=True, lstm_size=16, network='deep', num_virtual_cpu_devices=2,
      num_sgd_iter=2, replay_proportion=0.5))
  assert final['learner_steps'] >= 2
  # The recurrent SavedModel: uint8 images plus the core state in, state out.
  policy = tf.saved_model.load(os.path.join(logdir, 'saved_policy'))
  serve = policy.signatures['serving_default']
  b = 2
  out = serve(observation=tf.zeros([b, 36, 36, 2], tf.uint8),
              prev_action=tf.zeros([b], tf.int32), reward=tf.zeros([b], tf.float32),
              first=tf.ones([b], tf.bool),
              core_state_0=tf.zeros([b, config.lstm_size], tf.float32),
              core_state_1=tf.zeros([b, config.lstm_size], tf.float32))
  assert out['policy_logits'].shape == (b, 3)
  assert out['core_state_0'].shape == (b, config.lstm_size)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))


@pytest.mark.parametrize('error, lost', [
    (tf.errors.UnavailableError(None, None, 'Socket closed'), True),
    (tf.errors.DeadlineExceededError(None, None, 'Deadline exceeded'), True),
    (tf.errors.CancelledError(None, None, 'Collective ops is aborted by: ...'), True),
    (tf.errors.AbortedError(None, None, 'Task /job:worker/replica:0/task:1 died'),
     True),
    (tf.errors.InternalError(None, None, 'Collective ops is aborted by: peer'), True),
    (tf.errors.InternalError(None, None, 'NCCL error: unhandled cuda error'), False),
    (tf.errors.InternalError(None, None, 'XLA compilation failed'), False),
    (tf.errors.CancelledError(None, None, 'Operation was cancelled'), False),
    (tf.errors.AbortedError(None, None, 'NCCL communicator was aborted'), False),
    (ValueError('no'), False),
])
def test_only_errors_of_a_lost_peer_are_read_as_one(error, lost):
  assert driver.is_peer_loss(error) is lost


def test_a_peer_lost_while_the_workers_compare_their_start_is_one_line():
  """The start-up comparison's collective fails when a peer is gone: a
  PeerLostError naming the comparison, not the collective's traceback; this
  worker's own errors pass through."""
  def run_with(error):
    class _Agreement:
      def check_same(self, values, what):
        raise error
    fake = types.SimpleNamespace(agreement=_Agreement(), worker_index=1)
    driver._Run._check_workers_agree(fake, {'weights': 1}, '{}')

  with pytest.raises(driver.PeerLostError) as info:
    run_with(tf.errors.UnavailableError(
        None, None, 'Collective ops is aborted by: Socket closed\nmore'))
  assert str(info.value) == (
      'learner worker 1: another learner worker stopped answering while the '
      'workers compared their start (flags, learner step, weights; a collective '
      'failed: UnavailableError: Collective ops is aborted by: Socket closed); '
      'nothing was trained '
      'in this run')
  with pytest.raises(tf.errors.InternalError):
    run_with(tf.errors.InternalError(None, None, 'XLA compilation failed'))
