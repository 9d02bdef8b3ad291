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
