"""Tests for impala_tf.torso_choice: which torso a `network` value builds."""

import subprocess
import sys

import pytest

from impala_tf import torso_choice


@pytest.mark.parametrize('network,shape,want', [
    ('auto', (4,), 'mlp'),
    ('auto', (84, 84), 'deep'),
    ('auto', (84, 84, 4), 'deep'),
    ('mlp', (84, 84, 4), 'mlp'),
    ('shallow', (84, 84, 4), 'shallow'),
    ('deep', (4,), 'deep'),  # Whether it fits is make_network's check.
    ('testdata.torsos:keras_mlp', (4,), 'testdata.torsos:keras_mlp'),
])
def test_resolve_torso(network, shape, want):
  assert torso_choice.resolve_torso(network, shape) == want


def test_builtin_torsos():
  assert torso_choice.TORSOS == ('mlp', 'shallow', 'deep')


@pytest.mark.e2e
def test_imports_no_tensorflow():
  code = ('import sys\nfrom impala_tf import torso_choice\n'
          'assert "tensorflow" not in sys.modules\n')
  subprocess.run([sys.executable, '-c', code], check=True, timeout=60)


@pytest.mark.parametrize('torso,use_lstm,dtype,want', [
    ('mlp', False, 'float32', True),
    ('mlp', True, 'float32', False),
    ('mlp', False, 'bfloat16', False),
    ('shallow', False, 'float32', False),
    ('deep', False, 'float32', False),
    ('my_module:torso', False, 'float32', False),
])
def test_acts_with_numpy(torso, use_lstm, dtype, want):
  assert torso_choice.acts_with_numpy(torso, use_lstm, dtype) is want
