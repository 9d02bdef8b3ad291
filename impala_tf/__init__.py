"""impala_tf: IMPALA (V-trace actor-critic) for TensorFlow 2.

The library's way in, without absl flags:

    import impala_tf
    result = impala_tf.train(impala_tf.Config(env='CartPole-v1', logdir='/tmp/run'))

Importing the package does not import TensorFlow (env subprocesses import
`impala_tf.environments` and must stay light); `train` imports the driver on first use.
"""

from impala_tf.config import Config  # pylint: disable=g-importing-member

__version__ = '0.1.0'


def train(config: Config, **kwargs):
  """Trains with `config`: the same run as `python -m impala_tf.train`.

  Args:
    config: an `impala_tf.Config`.
    **kwargs: passed to `impala_tf.driver.train` (`stop_event`, `on_metrics`,
      `on_stall`).

  Returns:
    `impala_tf.driver.RunResult` (final metrics line, logdir, reached_target,
    interrupted).
  """
  from impala_tf import driver  # pylint: disable=g-import-not-at-top
  return driver.train(config, **kwargs)
