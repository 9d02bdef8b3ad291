"""Command-line entry point: `python -m impala_tf.train --logdir=DIR [flags]`.

The only module (with evaluate.py and export.py) that reads absl FLAGS. It turns the
flags into a validated `Config`, checks what needs the outside world (the env id, the
GPUs), and hands the Config to `impala_tf.driver.train`. A bad value ends the run with
exit status 2 and one line on stderr naming the flag, before any file is written.
Ctrl-C and SIGTERM stop the run cleanly: a final checkpoint, exit status 0.
"""

import signal
import sys
import threading

from absl import app
from absl import flags
from absl import logging

from impala_tf import config as config_lib
from impala_tf import flags as flags_lib

PROG = 'impala_tf.train'

flags_lib.define_flags()
flags.adopt_module_key_flags(flags_lib)
FLAGS = flags.FLAGS


def validated_config() -> config_lib.Config:
  """Config from FLAGS, with the env id and GPUs checked. Exits 2 when invalid."""
  def build():
    cfg = flags_lib.config_from_flags(FLAGS)
    from impala_tf import environments  # pylint: disable=g-import-not-at-top
    environments.check_env_id(cfg.env)
    from impala_tf import distribute  # pylint: disable=g-import-not-at-top
    distribute.check_gpus(cfg.num_gpus)
    return cfg
  return flags_lib.exit_on_config_error(PROG, build)


def main(argv):
  if len(argv) > 1:
    print(f'{PROG}: error: unexpected arguments {" ".join(argv[1:])!r} '
          '(options are --flags)', file=sys.stderr)
    sys.exit(2)
  cfg = validated_config()
  from impala_tf import driver  # pylint: disable=g-import-not-at-top
  stop = threading.Event()

  def on_signal(signum, frame):
    del frame
    logging.info('Received signal %d: stopping cleanly.', signum)
    stop.set()

  signal.signal(signal.SIGTERM, on_signal)
  signal.signal(signal.SIGINT, on_signal)
  try:
    result = driver.train(cfg, stop_event=stop)
  except driver.TrainingError as e:
    print(f'{PROG}: error: {e}', file=sys.stderr)
    sys.exit(1)
  m = result.metrics
  ret = m.get('episode_return_mean')
  print(f'{PROG}: done: env_frames={m.get("env_frames")} learner_steps='
        f'{m.get("learner_steps")} episode_return_mean='
        f'{"n/a" if ret is None else round(ret, 2)} wall_seconds='
        f'{m.get("wall_seconds", 0.0):.1f} logdir={result.logdir}', flush=True)


def run():
  app.run(main, flags_parser=flags_lib.parse_flags)


if __name__ == '__main__':
  run()
