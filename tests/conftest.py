"""pytest configuration of the test suite: the `e2e` marker.

`@pytest.mark.e2e` marks a test that runs the package end to end: a child process
(`python -m impala_tf.train`, a CLI, a probe script) or a whole training run. The
README's command runs every test; `pytest -m "not e2e" tests` runs the unit tests
alone (about a minute), `pytest -m e2e tests` the end-to-end ones.
"""


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
