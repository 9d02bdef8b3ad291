"""Tests of the package's top level: `impala_tf.Config` and `impala_tf.train`."""

import importlib
import os
import subprocess
import sys

import pytest

import impala_tf
from impala_tf import config as config_lib
from impala_tf import driver
from impala_tf import testing


def test_config_is_the_validated_dataclass():
  assert impala_tf.Config is config_lib.Config
  assert impala_tf.Config().env == 'CartPole-v1'


@pytest.mark.e2e
def test_importing_the_package_does_not_import_tensorflow():
  # Env subprocesses import impala_tf.environments through the package: keep it light.
  code = ('import sys, impala_tf, impala_tf.environments; '
          'print("tensorflow" in sys.modules)')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       check=True)
  assert out.stdout.strip() == 'False'


def test_train_stays_callable_once_the_cli_module_is_imported(monkeypatch):
  calls = []
  monkeypatch.setattr(driver, 'train', lambda config, **kw: calls.append(
      (config, kw)) or 'result')
  importlib.import_module('impala_tf.train')  # Makes impala_tf.train the module.
  assert impala_tf.train(impala_tf.Config(), stop_event=None) == 'result'
  assert calls == [(impala_tf.Config(), {'stop_event': None})]


@pytest.mark.e2e
def test_train_runs_from_python_without_flags(tmp_path):
  cfg = testing.tiny_config(logdir=str(tmp_path))
  result = impala_tf.train(cfg)
  assert isinstance(result, driver.RunResult)
  assert result.metrics['env_frames'] >= cfg.total_environment_frames
  assert result.metrics['learner_steps'] >= 1
  assert os.path.exists(os.path.join(str(tmp_path), 'metrics.jsonl'))
