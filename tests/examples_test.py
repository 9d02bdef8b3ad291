"""Runs every script in examples/, each in a fresh process, as a user would.

`python examples/<name>.py` from the repository root, with impala_tf importable the
way the tests import it (PYTHONPATH) and temporary files under the test's tmp dir
(TMPDIR). Each example asserts its own claims (e.g. the TF1 graph example that its
policy learned); here each must exit 0, have a module docstring that says what it
shows and how to run it, and print what it claims.
"""

import ast
import os
import subprocess
import sys

import pytest

import helpers

_REPO = helpers.REPO
_EXAMPLES = sorted((_REPO / 'examples').glob('*.py'))

# What each example prints when it did its job (an example not listed here fails:
# add it, so every example is held to something it prints).
_EXPECTED_OUTPUT = {
    'custom_env.py': 'custom_env:GuessTheSign-v0: env_frames=',
    'keras_torso.py': 'saved_policy: 4 episodes',
    'own_acting_loop.py': 'learner step 60: loss',
    'saved_policy_lstm.py': 'LSTM state norm',
    'tf1_graph_vtrace.py': 'greedy accuracy: first step',
}


def test_every_example_is_listed():
  assert sorted(p.name for p in _EXAMPLES) == sorted(_EXPECTED_OUTPUT)


@pytest.mark.e2e
@pytest.mark.parametrize('path', _EXAMPLES, ids=[p.stem for p in _EXAMPLES])
def test_example_runs(path, tmp_path):
  docstring = ast.get_docstring(ast.parse(path.read_text(encoding='utf-8')))
  assert docstring and f'examples/{path.name}' in docstring, (
      f'{path.name}: the docstring must say what it shows and how to run it')
  env = dict(os.environ, PYTHONPATH=str(_REPO) + os.pathsep +
             os.environ.get('PYTHONPATH', ''), TMPDIR=str(tmp_path),
             CUDA_VISIBLE_DEVICES='', TF_CPP_MIN_LOG_LEVEL='2')
  proc = subprocess.run([sys.executable, str(path.relative_to(_REPO))],
                        capture_output=True, text=True, env=env, cwd=str(_REPO),
                        timeout=600, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  assert _EXPECTED_OUTPUT[path.name] in proc.stdout, proc.stdout[-3000:]


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
