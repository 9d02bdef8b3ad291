"""pytest configuration of the test suite: the `e2e` marker and the workers' order.

`@pytest.mark.e2e` marks a test that runs the package end to end: a child process
(`python -m impala_tf.train`, a CLI, a probe script) or a whole training run. The
README's command runs every test; `pytest -m "not e2e" tests` runs the unit tests
alone (about a minute), `pytest -m e2e tests` the end-to-end ones.

With pytest-xdist (`-n 3`, the README's command) each test file goes whole to one
worker, so a file's module fixtures (a tiny training run, a batch of CLI children)
are built once instead of once per worker, and the files go out slowest first
(`MODULE_SECONDS`), so that the workers end together. Three workers on the
project's 2 cores, because the end-to-end tests wait on children, timeouts and Ray
for part of their time: a suite run took 598 s with `-n 2` and 560 s with `-n 3`.
Without xdist the files run in the same order; the tests within a file keep theirs.

Each worker computes with the CPU kernels the entry points choose
(`impala_tf.cpu_kernels`), so a test's in-process run and its children agree.
"""

import os

from impala_tf import cpu_kernels

try:
  from xdist import scheduler as xdist_scheduler
except ImportError:  # pytest without pytest-xdist: one process, the same order.
  xdist_scheduler = None

# TensorFlow's kernels as the entry points choose them (impala_tf.cpu_kernels:
# oneDNN also on x86-64 CPUs without AVX-512), here and in every child a test
# starts, set before any test module imports TensorFlow.
cpu_kernels.prefer_onednn()

# Seconds each test file took on its worker in a quiet run of the README's command
# on the project's 2-core machine (setup and teardown included); files not listed
# (under 3 s) count as 0 and go last. Only the order matters: refresh the
# numbers when a file's cost changes by much.
MODULE_SECONDS = {
    'ray_actors_test.py': 433,
    'train_test.py': 213,
    'user_network_test.py': 168,
    'process_actors_test.py': 152,
    'driver_test.py': 124,
    'learner_test.py': 102,
    'ray_learners_test.py': 87,
    'examples_test.py': 45,
    'evaluate_test.py': 35,
    'distribute_test.py': 25,
    'export_test.py': 23,
    'keras_compat_test.py': 23,
    'networks_test.py': 21,
    'envpool_env_test.py': 19,
    'watchdog_test.py': 16,
    'vtrace_test.py': 16,
    'quiet_test.py': 15,
    'data_test.py': 11,
    'launcher_test.py': 10,
    'optimizers_test.py': 9,
    'ray_actor_test.py': 7,
    'ray_session_test.py': 7,
    'flags_test.py': 6,
    'socket_audit_test.py': 6,
    'build_test.py': 5,
    'periodic_eval_test.py': 5,
    'plot_test.py': 5,
    'init_test.py': 4,
    'metrics_test.py': 4,
    'replay_test.py': 4,
    'losses_test.py': 3,
    'environments_test.py': 3,
}


def pytest_configure(config):
  config.addinivalue_line(
      'markers', 'e2e: runs the package end to end (a child process or a whole '
      'training run); deselect with -m "not e2e"')


def pytest_sessionstart(session):
  """TensorFlow's graph optimizer (Grappler) off in the test processes.

  It rewrites each traced graph for speed, which at the tests' tiny shapes costs
  more than it saves (about 12% of the in-process unit tests' CPU time, 25% of a
  test that traces 14 learners) and changes no value a test checks. The child
  processes the end-to-end tests start (`python -m impala_tf.train`, ...) keep it,
  as users run them.
  """
  del session
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.optimizer.set_experimental_options({'disable_meta_optimizer': True})


def pytest_collection_modifyitems(session, config, items):
  """Orders the test files slowest first; a file's tests keep their order."""
  del session, config
  items.sort(key=lambda item: -MODULE_SECONDS.get(
      os.path.basename(str(item.fspath)), 0))


if xdist_scheduler is not None:  # The hook exists only with pytest-xdist.

  def pytest_xdist_make_scheduler(config, log):
    """Each test file to one worker, in the collected order (see the docstring)."""
    config.option.loadscopereorder = False  # xdist >= 3.6 orders by test count.
    return xdist_scheduler.LoadFileScheduling(config, log)
