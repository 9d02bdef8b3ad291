"""Command-line entry point: `python -m impala_tf.train --logdir=DIR [flags]`.

The only module (with evaluate.py and export.py) that reads absl FLAGS. It turns the
flags into a validated `Config`, checks what needs the outside world (the env id, the
GPUs), and hands the Config to `impala_tf.driver.train`. A bad value ends the run with
exit status 2 and one line on stderr naming the flag, before any file is written;
so does a --logdir that cannot be written or that another run holds (checked
before TensorFlow is imported). An error in the user's --network torso names its
file and line. Ctrl-C and SIGTERM stop the run cleanly within seconds, also while
the learner waits for stalled actors: a final checkpoint, exit status 0.
TensorFlow's own start-up logs are off unless TF_CPP_MIN_LOG_LEVEL is set to 0 or 1
or `--verbosity=1` is passed (`impala_tf.quiet`).

Several learner workers (docs/scaling.md): a process started with a `TF_CONFIG`
naming several workers is that worker; `--num_learner_workers=N` without a
TF_CONFIG starts N such workers on this host and supervises them
(`impala_tf.launcher`), or with `--learner_backend=ray` places them as Ray actors
(`impala_tf.ray_learners`). A TF_CONFIG that does not parse, names a task index out
of range, or a port that is taken, is one line and exit status 2 before any work.
"""

import json
import os
import signal
import sys
import sysconfig
import threading
import traceback
import types
from typing import Optional

from absl import flags
from absl import logging

from impala_tf import config as config_lib
from impala_tf import env_defaults
from impala_tf import flags as flags_lib
from impala_tf import quiet

PROG = 'impala_tf.train'

flags_lib.define_flags()
flags.adopt_module_key_flags(flags_lib)
FLAGS = flags.FLAGS


def validated_config() -> config_lib.Config:
  """Config from FLAGS, with the env id, logdir and GPUs checked. Exits 2 when
  invalid."""
  def build():
    # The env's recorded settings under the flags given (env_defaults).
    cfg, applied = flags_lib.config_for_env_from_flags(FLAGS)
    if applied and not os.environ.get('IMPALA_TF_LAUNCHED_WORKER'):
      print(f'{PROG}: {env_defaults.describe(cfg.env, applied)}', file=sys.stderr,
            flush=True)
    from impala_tf import environments  # pylint: disable=g-import-not-at-top
    environments.check_env_id(cfg.env)
    from impala_tf import rundir  # pylint: disable=g-import-not-at-top
    rundir.check_logdir(cfg.logdir)
    if not _is_other_worker():  # The chief holds the lock of a worker's run.
      rundir.check_not_locked(cfg.logdir)  # Also taken by the run; this is quick.
    # Before anything imports TensorFlow; after the checks that need none, so a
    # bad flag is reported without importing it.
    quiet.quiet_tensorflow(FLAGS.verbosity)
    from impala_tf import envpool_env  # pylint: disable=g-import-not-at-top
    envpool_env.check_config(cfg)  # Refuses flags EnvPool ignores.
    if config_lib.is_user_network(cfg.network):
      from impala_tf import user_torso  # pylint: disable=g-import-not-at-top
      try:
        user_torso.resolve_torso_fn(cfg.network)  # Imports MODULE; runs no TF op.
      except config_lib.ConfigError as e:
        raise with_user_code_location(e, FLAGS.verbosity) from None
    from impala_tf import distribute  # pylint: disable=g-import-not-at-top
    try:  # A bad TF_CONFIG, or its port taken: one line before any work.
      _, cfg = distribute.resolve_cluster(cfg)
    except distribute.ClusterError as e:
      flags_lib.exit_with_error(str(e), PROG)
    try:
      distribute.check_gpus(cfg.num_gpus)
      if _launches_local_workers(cfg):
        from impala_tf import launcher  # pylint: disable=g-import-not-at-top
        launcher.gpu_assignment(cfg.num_learner_workers, cfg.num_gpus,
                                len(distribute.visible_gpus()) if cfg.num_gpus else 0)
    except config_lib.ConfigError:
      # TensorFlow's start-up lines, dropped as benign, may say why it found no
      # GPU (no driver, cuInit failed): shown before the error.
      quiet.show_captured_lines()
      raise
    return cfg
  return flags_lib.exit_on_config_error(PROG, build)


def _launches_local_workers(cfg) -> bool:
  """Whether this process is the local launcher of --num_learner_workers."""
  return (cfg.num_learner_workers > 1 and cfg.learner_backend == 'local' and
          not os.environ.get('TF_CONFIG', '').strip())


def main(argv):
  if len(argv) > 1:
    print(f'{PROG}: error: unexpected arguments {" ".join(argv[1:])!r} '
          '(options are --flags)', file=sys.stderr)
    sys.exit(2)
  cfg = validated_config()
  launched = bool(os.environ.get('IMPALA_TF_LAUNCHED_WORKER'))
  if cfg.num_learner_workers > 1 and not os.environ.get('TF_CONFIG', '').strip():
    # --num_learner_workers=N: this process starts the N workers and waits.
    if cfg.learner_backend == 'ray':
      from impala_tf import ray_learners  # pylint: disable=g-import-not-at-top
      _exit_now(ray_learners.launch_ray(argv_without_program(), cfg, PROG))
    from impala_tf import distribute  # pylint: disable=g-import-not-at-top
    from impala_tf import launcher  # pylint: disable=g-import-not-at-top
    devices = launcher.gpu_assignment(  # Checked in validated_config.
        cfg.num_learner_workers, cfg.num_gpus,
        len(distribute.visible_gpus()) if cfg.num_gpus else 0)
    _exit_now(launcher.launch_local(
        argv_without_program(), cfg.num_learner_workers,
        cfg.learner_worker_timeout_secs, PROG, cuda_devices=devices))
  from impala_tf import driver  # pylint: disable=g-import-not-at-top
  stop = threading.Event()
  _stop_on_signals(stop)
  try:
    result = driver.train(cfg, stop_event=stop, on_stall=_stalled)
  except driver.TrainingError as e:
    # A launched worker that lost a peer says nothing: its launcher names the
    # worker that died, in one line.
    if not (launched and isinstance(e, driver.PeerLostError)):
      print(f'{PROG}: error: {e}', file=sys.stderr)
    if cfg.num_learner_workers > 1:
      _exit_now(1)  # Not waiting for TensorFlow's collectives to unwind.
    sys.exit(1)
  except config_lib.ConfigError as e:  # E.g. a --network torso that does not fit.
    flags_lib.exit_with_error(
        f'--{with_user_code_location(e, FLAGS.verbosity)}', PROG)
  m = result.metrics
  if cfg.num_learner_workers > 1 and not _is_chief():
    _exit_now(0)  # The chief reports the run.
  ret = m.get('episode_return_mean')
  print(f'{PROG}: done: env_frames={m.get("env_frames")} learner_steps='
        f'{m.get("learner_steps")} episode_return_mean='
        f'{"n/a" if ret is None else round(ret, 2)} wall_seconds='
        f'{m.get("wall_seconds", 0.0):.1f} logdir={result.logdir}', flush=True)
  _exit_now(0)


def _is_other_worker() -> bool:
  """Whether TF_CONFIG makes this process a learner worker other than the chief.

  Read without importing TensorFlow; a TF_CONFIG that does not parse is
  reported later (`distribute.cluster_from_env`), so here it is not a worker.
  """
  try:
    index = json.loads(os.environ.get('TF_CONFIG', ''))['task']['index']
  except (ValueError, KeyError, TypeError):
    return False
  return isinstance(index, int) and index > 0


def _is_chief() -> bool:
  """Whether this process is worker 0 of its TF_CONFIG (or has none)."""
  from impala_tf import distribute  # pylint: disable=g-import-not-at-top
  cluster = distribute.cluster_from_env()
  return cluster is None or cluster.is_chief


def argv_without_program() -> list:
  """This process's command-line arguments, for the workers it starts."""
  return list(sys.argv[1:])


def _is_library_file(filename: str) -> bool:
  """Whether `filename` is impala_tf's, an installed package's or Python's own."""
  if filename.startswith('<'):  # <frozen importlib._bootstrap>, <string>, ...
    return True
  path = os.path.realpath(filename)
  package_dir = os.path.dirname(os.path.realpath(__file__))
  if path.startswith(package_dir + os.sep):
    return True
  parts = path.split(os.sep)
  if 'site-packages' in parts or 'dist-packages' in parts:
    return True
  stdlib = os.path.realpath(sysconfig.get_paths()['stdlib'])
  return path.startswith(stdlib + os.sep)


def user_code_location(error: BaseException) -> Optional[str]:
  """`file:line` of the innermost frame of `error`'s traceback in the user's code.

  The user's code is any file that is not impala_tf's, an installed package's
  (site-packages) or Python's. A SyntaxError names its own file and line.
  """
  if isinstance(error, SyntaxError) and error.filename and error.lineno:
    return f'{error.filename}:{error.lineno}'
  found = None
  for frame in traceback.extract_tb(error.__traceback__):
    if not _is_library_file(frame.filename):
      found = f'{frame.filename}:{frame.lineno}'
  return found


def with_user_code_location(error: config_lib.ConfigError,
                            verbosity: int) -> config_lib.ConfigError:
  """`error` (about --network=MODULE:FUNCTION) with where the user's code failed.

  The one-line error of a user torso that raised says what it raised; this adds
  `(at FILE:LINE)`, the innermost frame in the user's own file, from the
  exception the error was raised while handling. With `--verbosity=1` (or more)
  that exception's full traceback is printed to stderr first.
  """
  cause = error.__cause__ or error.__context__
  if error.field != 'network' or cause is None:
    return error
  if verbosity >= 1:
    traceback.print_exception(type(cause), cause, cause.__traceback__)
  where = user_code_location(cause)
  if where is None:
    return error
  return config_lib.ConfigError(error.field, error.value,
                                f'{error.allowed} (at {where})')


def _ignore_in_handler(signum, frame):
  """SIGINT/SIGTERM's Python handler: nothing (the wakeup fd carries the signal)."""
  del signum, frame


def _stop_on_signals(stop: threading.Event) -> None:
  """Sets `stop` on SIGINT and SIGTERM, within milliseconds.

  A Python signal handler runs only when the main thread runs Python code; while
  the learner waits inside a TensorFlow op for data that stalled actors do not
  send, that is not until --learner_queue_timeout. So the signal is taken from a
  wakeup fd: the C-level handler writes the signal number to a pipe at once, and a
  thread reading it sets `stop`.
  """
  def on_signal(signum):
    if stop.is_set():
      return
    stop.set()
    logging.info('Received signal %d: stopping cleanly.', signum)

  # The Python-level handler does nothing: a handler may run again inside itself
  # (a second signal while the first is handled), and anything that takes a lock
  # (Event.set does) would then wait forever on the lock its outer call holds. The
  # C-level handler still writes the signal to the wakeup fd, and the thread below
  # does the work.
  signal.signal(signal.SIGTERM, _ignore_in_handler)
  signal.signal(signal.SIGINT, _ignore_in_handler)
  read_fd, write_fd = os.pipe()
  os.set_blocking(write_fd, False)
  signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

  def watch():
    while True:
      received = os.read(read_fd, 64)
      if not received:
        return
      for signum in received:
        if signum in (signal.SIGINT, signal.SIGTERM):
          on_signal(signum)

  threading.Thread(target=watch, name='signal-watcher', daemon=True).start()


def _stalled(line: str) -> None:
  """The progress watchdog fired: its line, then exit at once (status 1)."""
  print(f'{PROG}: error: {line}', file=sys.stderr)
  _exit_now(1)


def _exit_now(status: int) -> None:
  """Ends the process at once, after a run that has shut down completely.

  Everything is written and closed by now (checkpoint, metrics, saved_policy; the
  actors and Ray stopped). What is left is interpreter teardown, in which
  TensorFlow destroys the tf.data iterator the learner's step graph still holds;
  its destructor waits for the pipeline's threads, which may wait for an
  interpreter that is going away and stall the exit for seconds (py-spy:
  `~IteratorResource` waiting in `UnboundedThreadPool`). `os._exit` skips that
  teardown.
  """
  sys.stdout.flush()
  sys.stderr.flush()
  logging.flush()
  os._exit(status)  # pylint: disable=protected-access


def run():
  flags_lib.run_program(main)


class _CallableModule(types.ModuleType):
  """This module's type outside `python -m`: callable as `impala_tf.train(config)`.

  The package's function `impala_tf.train` and this module share a name: once the
  module is imported (`import impala_tf.train`, as tests and tools do), Python makes
  the package attribute the module. Calling it still trains, as the function does.
  """

  def __call__(self, config, **kwargs):
    from impala_tf import driver  # pylint: disable=g-import-not-at-top
    return driver.train(config, **kwargs)


if __name__ == '__main__':
  run()
else:
  sys.modules[__name__].__class__ = _CallableModule
