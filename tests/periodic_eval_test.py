"""Tests for impala_tf.periodic_eval: results equal evaluate's, the schedule, a run."""

import json
import time

import numpy as np
import pytest

from impala_tf import config as config_lib
from impala_tf import driver
from impala_tf import environments
from impala_tf import episodes
from impala_tf import metrics
from impala_tf import networks
from impala_tf import periodic_eval
from impala_tf import policies
from impala_tf import testing


def _wait_for_result(evaluator, timeout=60.0):
  deadline = time.time() + timeout
  while time.time() < deadline:
    out = evaluator.results()
    if out:
      return out
    time.sleep(0.05)
  raise AssertionError('no evaluation result within the timeout')


@pytest.mark.parametrize('use_lstm', [False, True])  # numpy policy / TensorFlow
def test_result_equals_evaluate_run_episodes_of_the_same_weights(use_lstm):
  cfg = config_lib.Config(env='CartPole-v1', seed=4, eval_interval_frames=100,
                          eval_episodes=3, mlp_hidden_sizes=(8,), use_lstm=use_lstm,
                          lstm_size=8, popart=False)
  obs_space, act_space = environments.env_spaces(cfg.env)
  net = networks.make_network(cfg.replace(seed=11), obs_space, act_space)
  weights = [v.numpy() for v in net.variables]
  evaluator = periodic_eval.PeriodicEvaluator(cfg, obs_space, act_space)
  try:
    assert not evaluator.due(99) and evaluator.due(100)
    evaluator.submit(130, weights)
    assert not evaluator.due(199) and evaluator.due(200)  # The next multiple.
    got = _wait_for_result(evaluator)
  finally:
    evaluator.close()
  want = episodes.run_episodes(cfg, policies.NetworkPolicy(net), 3,
                               greedy=True,
                               seed=cfg.seed + periodic_eval.EVAL_SEED_OFFSET)
  assert got['eval_episodes'] == 3 and got['eval_env_frames'] == 130
  assert got['eval_return_mean'] == pytest.approx(want['episode_return_mean'])
  assert got['eval_return_std'] == pytest.approx(want['episode_return_std'])
  assert got['eval_episode_length_mean'] == pytest.approx(
      want['episode_length_mean'])
  assert got['eval_seconds'] > 0
  assert evaluator.results() == {}  # A result is returned once.


def test_a_resumed_run_evaluates_first_at_the_next_multiple():
  cfg = testing.tiny_config(eval_interval_frames=1000)
  obs_space, act_space = environments.env_spaces(cfg.env)
  evaluator = periodic_eval.PeriodicEvaluator(cfg, obs_space, act_space,
                                              start_frames=2500)
  try:
    assert not evaluator.due(2999) and evaluator.due(3000)
  finally:
    evaluator.close()


@pytest.mark.e2e
def test_a_training_run_logs_evaluations_in_metrics_and_tensorboard(tmp_path):
  cfg = testing.tiny_config(logdir=str(tmp_path), total_environment_frames=2000,
                            eval_interval_frames=400, eval_episodes=2,
                            log_interval_secs=0.2)
  driver.train(cfg)
  with open(tmp_path / 'metrics.jsonl', encoding='utf-8') as f:
    lines = [json.loads(l) for l in f]
  evals = [l for l in lines if 'eval_return_mean' in l]
  assert evals, lines[-1]
  for line in evals:
    # The chain env pays 1 a step for 8 steps, whatever the actions.
    assert line['eval_return_mean'] == 8.0 and line['eval_episodes'] == 2
    assert 0 < line['eval_env_frames'] <= line['env_frames']
  frames = [l['eval_env_frames'] for l in evals]
  assert frames == sorted(set(frames))  # Each result appears once.
  assert metrics.tensorboard_tag('eval_return_mean') == 'eval/eval_return_mean'
  assert metrics.tensorboard_tag('eval_episode_length_mean') == (
      'eval/eval_episode_length_mean')
  assert np.all([not any(k.startswith('eval_') for k in l) for l in lines
                 if l not in evals])
