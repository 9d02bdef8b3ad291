"""Tests of impala_tf.cpu_kernels: when TF_ENABLE_ONEDNN_OPTS is set to 1 and when
the user's choice, another CPU or an imported TensorFlow leaves it alone; and that
each entry point sets it before anything imports TensorFlow."""

import os
import platform
import sys

import pytest

from impala_tf import cpu_kernels

import helpers

VAR = cpu_kernels.ENV_VAR


@pytest.mark.parametrize('machine', ['x86_64', 'AMD64'])
def test_sets_one_on_x86_64_when_unset(machine):
  environ = {'PATH': '/bin'}
  assert cpu_kernels.prefer_onednn(environ, machine, tensorflow_imported=False) == '1'
  assert environ == {'PATH': '/bin', VAR: '1'}


@pytest.mark.parametrize('value', ['0', '1', ''])
def test_keeps_the_users_value(value):
  environ = {VAR: value}
  assert cpu_kernels.prefer_onednn(environ, 'x86_64',
                                   tensorflow_imported=False) == value
  assert environ == {VAR: value}


@pytest.mark.parametrize('machine', ['aarch64', 'arm64', 'ppc64le', ''])
def test_other_cpus_keep_tensorflows_default(machine):
  environ = {}
  assert cpu_kernels.prefer_onednn(environ, machine, tensorflow_imported=False) is None
  assert not environ


def test_nothing_is_set_once_tensorflow_is_imported(monkeypatch):
  environ = {}
  assert cpu_kernels.prefer_onednn(environ, 'x86_64', tensorflow_imported=True) is None
  assert not environ
  # The default looks in sys.modules.
  monkeypatch.setitem(sys.modules, 'tensorflow', sys)
  assert cpu_kernels.prefer_onednn(environ, 'x86_64') is None
  monkeypatch.delitem(sys.modules, 'tensorflow')
  assert cpu_kernels.prefer_onednn(environ, 'x86_64') == '1'


def test_defaults_read_this_process(monkeypatch):
  monkeypatch.delenv(VAR, raising=False)
  monkeypatch.delitem(sys.modules, 'tensorflow', raising=False)
  expected = ('1' if platform.machine().lower() in cpu_kernels.X86_64_MACHINES
              else None)
  assert cpu_kernels.prefer_onednn() == expected
  assert os.environ.get(VAR) == expected


def _entry_point_value(module, value):
  """The variable when `python -m MODULE --no_such_flag=1` exits (2, before any
  work), its parent environment having `value` (None: not set)."""
  env = dict(os.environ)
  env.pop(VAR, None)
  if value is not None:
    env[VAR] = value
  code, _, onednn, stderr = helpers.run_exit_probe(module, ['--no_such_flag=1'], env)
  assert code == 2 and 'no_such_flag' in stderr, stderr[-3000:]
  return onednn


@pytest.mark.e2e
@pytest.mark.parametrize('module', ['impala_tf.train', 'impala_tf.evaluate',
                                    'impala_tf.export'])
def test_entry_points_set_it_unless_the_user_did(module):
  on_x86 = platform.machine().lower() in cpu_kernels.X86_64_MACHINES
  assert _entry_point_value(module, None) == ('1' if on_x86 else 'unset')
  assert _entry_point_value(module, '0') == '0'
