"""The run directory (--logdir): checks, the one-run lock, config.json, resume checks.

What a run leaves in its logdir is listed in the README ("Train, resume,
evaluate"); this module owns the parts that are not checkpoint files, and imports no TensorFlow (the CLI runs these checks
before it imports TensorFlow):

* `check_logdir`: the logdir is (or can be made) a writable directory.
* `LogdirLock` / `check_not_locked`: one run per logdir. A run holds an exclusive
  `flock` on `logdir/.impala_tf.lock` while it trains; a second run on the same
  logdir is refused with one line. The kernel drops the lock when the process
  dies, so a killed run (even SIGKILL) leaves nothing stuck.
* `write_config` / `load_config` / `read_saved_config`: `config.json`, written
  atomically (a temp file renamed over it: a reader never sees half of one).
* `check_resume` / `resume_differences`: a run refuses to resume checkpoints
  written with other shape-relevant flags or another env (naming each flag and
  both values, in one line, before anything is written), and refuses an
  unreadable config.json next to checkpoints. `learning_differences` lists the
  changed flags that alter the learning but not the variables (the driver warns
  about them in one line).
* `write_text_atomic` / `replace_dir_atomic`: temp + rename for files and
  directories (saved_policy).
"""

import dataclasses
import errno
import fcntl
import glob
import json
import os
import shutil
import sys
import tempfile
from typing import Callable, Dict, List, Optional, Tuple

from impala_tf import config as config_lib
from impala_tf import environments
from impala_tf import torso_choice

CHECKPOINT_SUBDIR = 'checkpoints'
CONFIG_FILE = 'config.json'
SAVED_POLICY_SUBDIR = 'saved_policy'
LOCK_FILE = '.impala_tf.lock'


class RunDirError(ValueError):
  """A run directory lacks what is asked of it (config.json, a checkpoint)."""


class CheckpointMismatchError(RunDirError):
  """The latest checkpoint does not fit the objects to restore (e.g. the network
  flags changed between the run that wrote it and this one)."""


class CheckpointUnreadableError(RunDirError):
  """No checkpoint of a run directory can be read (all truncated or corrupted)."""


def warn(message: str):
  """Writes `impala_tf: warning: MESSAGE` as one line on stderr."""
  sys.stderr.write(f'impala_tf: warning: {" ".join(message.split())}\n')
  sys.stderr.flush()


# --- checks and the lock ----------------------------------------------------------


def check_logdir(logdir: str) -> None:
  """Checks that `logdir` is (or can be made) a writable directory; writes nothing
  that stays (a probe file is created and removed).

  Raises:
    ConfigError: for field 'logdir', saying why.
  """
  path = os.path.abspath(logdir)
  existing = path
  while not os.path.exists(existing):
    parent = os.path.dirname(existing)
    if parent == existing:
      break
    existing = parent
  if not os.path.isdir(existing):
    where = 'is a file' if existing == path else f'{existing} is a file'
    raise config_lib.ConfigError(
        'logdir', logdir, f'{where}, not a directory; use another --logdir')
  try:
    fd, probe = tempfile.mkstemp(prefix='.impala_tf_probe_', dir=existing)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise config_lib.ConfigError(
        'logdir', logdir,
        f'cannot be written ({existing}: {e.strerror or e}); use another --logdir '
        'or fix its permissions') from None


def _busy_error(logdir: str, fd: int) -> config_lib.ConfigError:
  try:
    pid = os.pread(fd, 32, 0).decode('ascii', 'replace').strip()
  except OSError:
    pid = ''
  who = f'another run (pid {pid})' if pid.isdigit() else 'another run'
  return config_lib.ConfigError(
      'logdir', logdir, f'is in use by {who}; wait for it to finish, stop it, or '
      'use another --logdir')


class LogdirLock:
  """An exclusive lock on a logdir for the life of a run (see the module doc).

  Use as a context manager, or `acquire()` / `release()`.

  Args:
    logdir: the run directory (created if missing).
  """

  def __init__(self, logdir: str):
    self.logdir = logdir
    self.path = os.path.join(logdir, LOCK_FILE)
    self._fd: Optional[int] = None

  def acquire(self) -> 'LogdirLock':
    """Takes the lock; writes this process's pid into the lock file.

    Raises:
      ConfigError: for field 'logdir' when another process holds the lock.
    """
    os.makedirs(self.logdir, exist_ok=True)
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        os.close(fd)  # No lock support here (some network filesystems): go on.
        warn(f'cannot lock {self.path} ({e.strerror or e}); nothing stops a '
             'second run on this --logdir')
        return self
      error = _busy_error(self.logdir, fd)
      os.close(fd)
      raise error from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f'{os.getpid()}\n'.encode('ascii'), 0)
    self._fd = fd
    return self

  def release(self) -> None:
    """Drops the lock (the file stays: removing it would race a new locker)."""
    if self._fd is not None:
      fd, self._fd = self._fd, None
      try:
        fcntl.flock(fd, fcntl.LOCK_UN)
      finally:
        os.close(fd)

  def __enter__(self) -> 'LogdirLock':
    return self.acquire()

  def __exit__(self, *unused_exc):
    self.release()


def check_not_locked(logdir: str) -> None:
  """Refuses a logdir that a running run holds; creates nothing.

  Cheap (no TensorFlow): the CLI calls it while it checks the flags, so a second
  run is refused at once. The run itself takes the lock (`LogdirLock`) later.

  Raises:
    ConfigError: for field 'logdir', naming the holder's pid.
  """
  path = os.path.join(logdir, LOCK_FILE)
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return  # No lock file: no run has held this logdir.
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise _busy_error(logdir, fd) from None
      return
    fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)


# --- atomic writes ----------------------------------------------------------------


def _umask() -> int:
  """The process's umask, read without changing it (0o022 if unknown)."""
  try:
    with open('/proc/self/status', encoding='ascii') as f:
      for line in f:
        if line.startswith('Umask:'):
          return int(line.split()[1], 8)
  except (OSError, ValueError):
    pass
  return 0o022


def write_text_atomic(path: str, text: str) -> None:
  """Writes `text` to `path` through a temp file renamed over it.

  The file gets the mode a plain `open(path, 'w')` would give it (0o666 less the
  umask), not the temp file's 0o600.
  """
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=f'.{os.path.basename(path)}.', suffix='.tmp',
                             dir=directory)
  try:
    os.fchmod(fd, 0o666 & ~_umask())
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise


def replace_dir_atomic(path: str, write: Callable[[str], None]) -> None:
  """Has `write(tmp_dir)` fill a temp directory, then puts it at `path`.

  A directory cannot be renamed over a non-empty one: the old one is first renamed
  aside, then removed. `path` is thus never a half-written directory: it is the
  old one, or (briefly) missing, or the new one; if `write` raises, the old one
  stays.
  """
  path = os.path.abspath(path)
  parent, name = os.path.split(path)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f'.{name}.', suffix='.tmp', dir=parent)
  try:
    os.chmod(tmp, 0o777 & ~_umask())  # As os.makedirs would make it.
    write(tmp)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  old = None
  if os.path.lexists(path):
    old = tempfile.mkdtemp(prefix=f'.{name}.', suffix='.old', dir=parent)
    os.rename(path, os.path.join(old, name))
  os.rename(tmp, path)
  if old is not None:
    shutil.rmtree(old, ignore_errors=True)


# --- config.json ------------------------------------------------------------------


def write_config(config: config_lib.Config) -> None:
  """Writes `config.logdir/config.json` atomically (creating the logdir)."""
  os.makedirs(config.logdir, exist_ok=True)
  write_text_atomic(os.path.join(config.logdir, CONFIG_FILE), config.to_json() + '\n')


def read_saved_config(logdir: str) -> Optional[Dict[str, object]]:
  """The dict of `logdir/config.json`; None when there is no such file.

  Raises:
    RunDirError: the file exists but cannot be read or is not a JSON object.
  """
  path = os.path.join(logdir, CONFIG_FILE)
  try:
    with open(path, encoding='utf-8') as f:
      saved = json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError.
    detail = e.strerror if isinstance(e, OSError) and e.strerror else e
    raise RunDirError(f'{path} cannot be read ({" ".join(str(detail).split())})'
                      ) from None
  if not isinstance(saved, dict):
    raise RunDirError(f'{path} cannot be read (not a JSON object)')
  return saved


def load_config(logdir: str) -> config_lib.Config:
  """The Config a run wrote to `logdir/config.json`.

  Raises:
    RunDirError: no such directory, no config.json, or a config.json that does not
      parse into a valid Config.
  """
  if not os.path.isdir(logdir):
    raise RunDirError(f'--logdir={logdir}: no such directory')
  path = os.path.join(logdir, CONFIG_FILE)
  if not os.path.isfile(path):
    raise RunDirError(f'--logdir={logdir}: has no {CONFIG_FILE}; is it the --logdir '
                      'of an impala_tf.train run?')
  try:
    with open(path, encoding='utf-8') as f:
      d = json.load(f)
    if not isinstance(d, dict):
      raise ValueError('not a JSON object')
    if isinstance(d.get('mlp_hidden_sizes'), list):
      d['mlp_hidden_sizes'] = tuple(d['mlp_hidden_sizes'])
    return config_lib.Config.from_dict(d)
  except ValueError as e:  # json.JSONDecodeError and ConfigError are ValueErrors.
    raise RunDirError(f'{path}: not a valid impala_tf config: {e}') from None


# --- resume checks ----------------------------------------------------------------


def flag_value(value) -> str:
  """A Config value as it is written on the command line."""
  if isinstance(value, bool):
    return 'true' if value else 'false'
  if isinstance(value, (list, tuple)):
    return ','.join(str(v) for v in value)
  return str(value)


def _spaces_key(obs_space, action_space):
  return (tuple(obs_space.shape), str(obs_space.dtype), int(action_space.n))


def resume_differences(saved: Dict[str, object], config: config_lib.Config,
                       obs_space, action_space) -> List[Tuple[str, object, object]]:
  """The flags that make `config` unable to resume a run of the saved config.

  Those that change the variables a checkpoint holds: the torso (`network`, with
  'auto' resolved), `mlp_hidden_sizes` (mlp torso), `use_lstm`, `shared_torso`
  (resolved: whether a value MLP exists), `lstm_size` (with
  an LSTM), `weight_init` (the variables' start, which a resumed run cannot change:
  its config.json would misstate the run), `torso_activation` (the function the
  variables were trained in), `optimizer`, `rmsprop_momentum` being 0
  or not (its slot), and the
  env's spaces (`frame_stack`, `use_lstm` for Atari); and `env` itself, even with
  the same spaces (a policy trained on one env is not a start on another).

  Args:
    saved: the dict of a run's config.json (missing keys take Config's defaults).
    config: this run's Config.
    obs_space, action_space: this run's single-env spaces.

  Returns:
    (flag, saved value, value now) for each difference, in Config's field order.
  """
  defaults = config_lib.Config().to_dict()
  old = lambda k: saved.get(k, defaults[k])
  diffs = {}
  def differ(field, old_value, new_value):
    if old_value != new_value:
      diffs[field] = (field, old_value, new_value)

  differ('env', old('env'), config.env)
  old_obs, old_act = obs_space, action_space
  space_fields = ('env', 'frame_stack', 'use_lstm')
  if any(old(k) != getattr(config, k) for k in space_fields):
    try:
      old_cfg = config.replace(**{k: old(k) for k in space_fields})
      old_obs, old_act = environments.env_spaces(old_cfg.env,
                                                 **environments.env_kwargs(old_cfg))
    except Exception:  # pylint: disable=broad-except
      old_obs = old_act = None  # The old env cannot be built here: compare ids.
    if (old_obs is None or _spaces_key(old_obs, old_act) !=
        _spaces_key(obs_space, action_space)):
      for k in space_fields:
        differ(k, old(k), getattr(config, k))
      if old_obs is None:
        old_obs = obs_space
  old_torso = torso_choice.resolve_torso(old('network'), old_obs.shape)
  new_torso = torso_choice.resolve_torso(config.network, obs_space.shape)
  if old_torso != new_torso:
    differ('network', old('network'), config.network)
  if old_torso == new_torso == 'mlp':
    differ('mlp_hidden_sizes', tuple(old('mlp_hidden_sizes')),
           tuple(config.mlp_hidden_sizes))
  differ('use_lstm', old('use_lstm'), config.use_lstm)
  old_shared = config_lib.resolve_shared_torso(old('shared_torso'), old_torso,
                                               old('use_lstm'))
  if old_shared != config_lib.resolve_shared_torso(
      config.shared_torso, new_torso, config.use_lstm):
    differ('shared_torso', old('shared_torso'), config.shared_torso)
  if old('use_lstm') and config.use_lstm:
    differ('lstm_size', old('lstm_size'), config.lstm_size)
  differ('weight_init', old('weight_init'), config.weight_init)
  differ('torso_activation', old('torso_activation'), config.torso_activation)
  differ('optimizer', old('optimizer'), config.optimizer)
  if old('optimizer') == config.optimizer == 'rmsprop':
    if (old('rmsprop_momentum') > 0) != (config.rmsprop_momentum > 0):
      diffs['rmsprop_momentum'] = ('rmsprop_momentum', old('rmsprop_momentum'),
                                   config.rmsprop_momentum)
  order = list(defaults)
  return sorted(diffs.values(), key=lambda d: order.index(d[0]))


# Flags that change what a resumed run learns but not the variables it restores.
LEARNING_FLAGS = tuple(f.name for f in dataclasses.fields(config_lib.Config)
                       if f.metadata['resume'] == config_lib.RESUME_WARNED)


def _relative_to_the_budget(schedule) -> bool:
  """Whether a schedule string moves with total_environment_frames."""
  return isinstance(schedule, str) and (schedule == 'linear' or '%' in schedule)


def learning_differences(saved: Dict[str, object], config: config_lib.Config
                         ) -> List[Tuple[str, object, object]]:
  """The flags of LEARNING_FLAGS in which `config` differs from a saved config.

  Also `total_environment_frames` when a schedule is relative to it ('linear', or
  points at `P%` of the run, in `lr_schedule` or `entropy_cost_schedule`, before
  or now): a new budget moves the rest of the schedule.

  Returns:
    (flag, saved value, value now) for each difference, in Config's field order.
  """
  defaults = config_lib.Config().to_dict()
  old = lambda k: saved.get(k, defaults[k])
  fields = [k for k in LEARNING_FLAGS if k in defaults]
  schedules = (config.lr_schedule, config.entropy_cost_schedule,
               old('lr_schedule'), old('entropy_cost_schedule'))
  if any(_relative_to_the_budget(s) for s in schedules):
    fields.append('total_environment_frames')
  diffs = [(k, old(k), getattr(config, k)) for k in fields
           if old(k) != getattr(config, k)]
  order = list(defaults)
  return sorted(diffs, key=lambda d: order.index(d[0]))


def has_checkpoint_files(logdir: str) -> bool:
  directory = os.path.join(logdir, CHECKPOINT_SUBDIR)
  return bool(glob.glob(os.path.join(glob.escape(directory), 'ckpt-*')))


def no_checkpoint_error(logdir: str) -> RunDirError:
  """The error for a run directory without a checkpoint (evaluate, export)."""
  return RunDirError(
      f'--logdir={logdir}: has no checkpoint in {CHECKPOINT_SUBDIR}/ '
      '(a run writes one every --checkpoint_interval_secs and when it stops)')


def check_checkpoint_run(logdir: str) -> config_lib.Config:
  """The run's Config, once `logdir` is known to hold checkpoint files.

  Reads no checkpoint and imports no TensorFlow (evaluate and export check their
  input with it before importing TensorFlow).

  Raises:
    RunDirError: no such directory, no config.json, or no checkpoint files.
  """
  config = load_config(logdir)
  if not has_checkpoint_files(logdir):
    raise no_checkpoint_error(logdir)
  return config


def check_resume(config: config_lib.Config, obs_space, action_space
                 ) -> List[Tuple[str, object, object]]:
  """Refuses to resume a run written with other shapes or another env.

  Reads `config.logdir/config.json` when the logdir has checkpoint files; writes
  nothing.

  Returns:
    `learning_differences` (empty without checkpoints or config.json): the caller
    warns about them.

  Raises:
    CheckpointMismatchError: naming each differing flag with its saved value and
      its value now (one line).
    RunDirError: config.json exists next to checkpoints but cannot be read.
  """
  if not has_checkpoint_files(config.logdir):
    return []
  directory = os.path.join(config.logdir, CHECKPOINT_SUBDIR)
  path = os.path.join(config.logdir, CONFIG_FILE)
  try:
    saved = read_saved_config(config.logdir)
  except RunDirError as e:
    raise RunDirError(
        f'cannot resume from the checkpoints in {directory}: {e}; nothing was '
        f'changed: repair or remove {CONFIG_FILE} (the checkpoints are still '
        'checked against this run\'s flags), or use a new --logdir') from None
  if saved is None:
    return []  # No config.json: the checkpoint itself is checked on restore.
  diffs = resume_differences(saved, config, obs_space, action_space)
  if diffs:
    what = '; '.join(f'--{k}={flag_value(a)} there, {flag_value(b)} now'
                     for k, a, b in diffs)
    raise CheckpointMismatchError(
        f'cannot resume from the checkpoints in {directory}: they were written with '
        f'other env, network or optimizer flags ({what}); rerun with the flags in '
        f'{path} or use a new --logdir')
  return learning_differences(saved, config)


def learning_warning(diffs: List[Tuple[str, object, object]]) -> str:
  """The one-line warning about `learning_differences`."""
  what = '; '.join(f'--{k}={flag_value(a)} there, {flag_value(b)} now'
                   for k, a, b in diffs)
  return (f'resuming with other learning flags than the run that wrote the '
          f'checkpoints ({what}); the rest of the run learns with the new values')
