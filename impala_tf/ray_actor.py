"""One Ray actor of the `ray` actor backend: its body, its checks, its errors.

`ImpalaActor` is the class `impala_tf.ray_actors.RayActorPool` runs as a Ray
actor process: an `impala_tf.actor.Actor` built from the run's config, acting
one unroll per `unroll(version, [weights_ref])` call and answering
`(chunk, info)`: the chunk is a dict of arrays `[B, T + 1, ...]` (B =
num_envs_per_actor, T = unroll_length; dtypes those of a thread actor's chunk),
`info` the steps taken, the finished episodes and the sampling generator's state
(int64, as `tf.random.Generator.state`).

Before it acts the actor:

* hides every GPU from TensorFlow unless Ray gave it one
  (`hide_gpus_unless_assigned`), and sets its TensorFlow threads to the CPUs it
  reserved;
* checks that it runs the driver's impala_tf and TensorFlow versions
  (`local_versions`; else `VersionMismatchError`), at its first unroll, so the
  failure reaches the driver as that call's error;
* checks, for each new weights version, that the arrays fit its network's
  variables by canonical name and shape (`weight_spec`, `check_weights`; else
  `WeightsMismatchError`).

Those two errors are `FATAL_ERRORS`: no replacement actor can get past them.
`root_cause(error)` is the one line the driver says about a failed actor: the
original exception, its message and its innermost frame, or Ray's reason.
"""

from impala_tf import quiet

# A Ray actor process imports this module first: as quiet as the run that started it.
quiet.quiet_if_parent_was()

# pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order
import os
import re
import sys
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from impala_tf import actor as actor_lib
from impala_tf import actor_pool
from impala_tf import config as config_lib
from impala_tf import errors
from impala_tf import ray_session
from impala_tf import types

def hide_gpus_unless_assigned() -> bool:
  """In a Ray actor process: hides every GPU from TensorFlow unless Ray gave it one.

  Ray 2.60 sets `CUDA_VISIBLE_DEVICES` only for actors that reserved a GPU, so an
  actor with `--ray_actor_resources` without "GPU" would otherwise see every GPU of
  its node and create a CUDA context (and take memory) on each. Call it before
  TensorFlow initialises its devices.

  Returns:
    True when the GPUs were hidden.
  """
  if ray_session.import_ray().get_gpu_ids():
    return False  # Ray set CUDA_VISIBLE_DEVICES to the actor's own GPU(s).
  os.environ['CUDA_VISIBLE_DEVICES'] = ''  # Read when TensorFlow initialises CUDA.
  try:
    tf.config.set_visible_devices([], 'GPU')
  except RuntimeError:  # Devices already initialised; the variable is set anyway.
    pass
  return True


class VersionMismatchError(RuntimeError):
  """A Ray actor runs other impala_tf or TensorFlow versions than the driver."""


class WeightsMismatchError(RuntimeError):
  """The weights sent to a Ray actor do not fit its network's variables."""


# Errors no replacement actor can get past: they stop the run at once.
FATAL_ERRORS = (VersionMismatchError, WeightsMismatchError)


def local_versions() -> Dict[str, str]:
  """Versions that must agree between the driver and its Ray actors."""
  # The package (imported before any of its modules; not a BUILD dependency: it
  # depends on the driver, which depends on this module).
  package = sys.modules[__name__.rpartition('.')[0]]
  return {'impala_tf': package.__version__, 'TensorFlow': tf.__version__}


def _canonical_name(name: str) -> str:
  """A variable name without ':0' and Keras' uniquifying '_N' suffixes.

  The driver's reference network is built in a process that already holds the
  learner's, so Keras may have named its layers `dense_1` where an actor says
  `dense`.
  """
  name = name.split(':', 1)[0]
  return '/'.join(re.sub(r'_\d+$', '', part) for part in name.split('/'))


def weight_spec(variables) -> List[Tuple[str, Tuple[int, ...]]]:
  """(canonical name, shape) of each variable, in order (see `_canonical_name`)."""
  return [(_canonical_name(v.name), tuple(int(d) for d in v.shape))
          for v in variables]


def check_weights(spec, weights: Sequence[np.ndarray], variables,
                  actor_id: int):
  """Raises WeightsMismatchError unless `spec` and `weights` fit `variables`.

  Args:
    spec: `weight_spec` of the driver's network (the order of `weights`).
    weights: the arrays, one per variable.
    variables: the actor's network variables.
    actor_id: for the message.
  """
  mine = weight_spec(variables)
  problem = None
  if len(spec) != len(weights):
    problem = f'{len(weights)} arrays for {len(spec)} variables'
  elif len(spec) != len(mine):
    problem = (f'the driver\'s network has {len(spec)} variables, the actor\'s '
               f'{len(mine)}')
  else:
    for (name, shape), w, (my_name, my_shape) in zip(spec, weights, mine):
      if name != my_name or tuple(shape) != my_shape:
        problem = (f'the driver sends {name} {list(shape)} where the actor has '
                   f'{my_name} {list(my_shape)}')
        break
      if tuple(np.shape(w)) != my_shape:
        problem = f'{name}: an array of shape {list(np.shape(w))} for {list(my_shape)}'
        break
  if problem:
    raise WeightsMismatchError(
        f'the weights sent to Ray actor {actor_id} do not fit its network ('
        f'{problem}): the driver and the actor\'s node run different code or '
        'flags; install the same impala_tf on every node')


def _set_threads(num_threads: int):
  try:
    tf.config.threading.set_intra_op_parallelism_threads(num_threads)
    tf.config.threading.set_inter_op_parallelism_threads(num_threads)
  except RuntimeError:  # TensorFlow already started (an actor built in-process).
    pass


class ImpalaActor:
  """The body of one Ray actor process: an impala_tf Actor, one unroll per call.

  The constructor only hides GPUs and sets threads; the env and network are built
  at the first `unroll`, after the actor checked that it runs the driver's
  versions, so a failure there reaches the driver as that call's error (with its
  root cause), not as a dead actor.

  Args:
    config_dict: the run's `Config.to_dict()`.
    actor_id: in [0, num_actors).
    restarts: times this actor was replaced (fresh env seeds).
    observation_space: the single-env observation space.
    action_space: the single-env action space.
    rng_state: int64 state of the actor's sampling tf.random.Generator.
    rng_alg: its algorithm.
    num_threads: TensorFlow intra/inter-op threads (the CPUs it reserved, >= 1).
    resumes: times the run was resumed (enters the env seeds).
    driver_versions: the driver's `local_versions()` (None: not checked).
    id_offset: the pool's `first_actor_id` (`actor_pool.make_actor`).
  """

  def __init__(self, config_dict: dict, actor_id: int, restarts: int,
               observation_space, action_space, rng_state: np.ndarray, rng_alg,
               num_threads: int, resumes: int = 0,
               driver_versions: Optional[Dict[str, str]] = None,
               id_offset: int = 0):
    _set_threads(num_threads)
    hide_gpus_unless_assigned()  # Never take the learner's GPUs.
    self._args = (config_dict, actor_id, restarts, observation_space, action_space,
                  rng_state, rng_alg, resumes, id_offset)
    self._actor_id = actor_id
    self._driver_versions = driver_versions
    self._broadcast = actor_lib.ParameterBroadcast()
    self._episodes: List[types.EpisodeStats] = []
    self._actor = None
    self._unrolls = None
    self._rng = None

  def pid(self) -> int:
    return os.getpid()

  def ready(self) -> int:
    """Answers once the actor process is up (its imports done): its pid."""
    return os.getpid()

  def _check_versions(self):
    mine = local_versions()
    theirs = self._driver_versions
    if theirs is None or mine == theirs:
      return
    node = ray_session.import_ray().util.get_node_ip_address()

    def say(v):
      keys = list(mine) + [k for k in theirs if k not in mine]
      return ', '.join(f'{k} {v.get(k)}' for k in keys)
    raise VersionMismatchError(
        f'Ray actor {self._actor_id} on node {node} runs {say(mine)} but the '
        f'driver runs {say(theirs)}; install the same versions on every node')

  def _build(self):
    self._check_versions()
    (config_dict, actor_id, restarts, observation_space, action_space, rng_state,
     rng_alg, resumes, id_offset) = self._args
    config = config_lib.Config.from_dict(config_dict)
    self._rng = tf.random.Generator.from_state(rng_state, rng_alg)
    self._actor = actor_pool.make_actor(
        config, actor_id, restarts, observation_space, action_space,
        self._broadcast, None, self._episodes.extend, threading.Event(),
        rng=self._rng, resumes=resumes, id_offset=id_offset)
    self._unrolls = self._actor.unrolls()

  def unroll(self, version: int, weights_ref: list):
    """Acts one unroll with the weights of `version`.

    Args:
      version: the policy version (learner step) of `weights_ref[0]`.
      weights_ref: a one-element list holding the ObjectRef of the weights (a list,
        so Ray passes the reference and the weights are fetched only when new):
        `(spec, arrays)`, `spec` the driver network's `weight_spec`.

    Returns:
      (chunk, info): the chunk (dict of arrays `[B, T + 1, ...]`); info is a dict
      with `steps` (int, agent steps taken), `episodes` (list of (return, length))
      and `rng_state` (the sampling generator's state after this unroll).

    Raises:
      VersionMismatchError, WeightsMismatchError: see the classes; the env's own
        errors.
    """
    if self._actor is None:
      self._build()
    if version != self._broadcast.version:
      spec, weights = ray_session.import_ray().get(weights_ref[0])
      check_weights(spec, weights, self._actor.network.variables, self._actor_id)
      self._broadcast.publish(version, weights)
    steps = self._actor.steps
    try:
      chunk = next(self._unrolls)
    except BaseException:
      self._actor.close()  # The driver replaces this actor; free its env first.
      raise
    info = {'steps': self._actor.steps - steps,
            'episodes': [tuple(e) for e in self._episodes],
            'rng_state': self._rng.state.numpy()}
    self._episodes.clear()
    return chunk, info


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_EXCEPTION_LINE = re.compile(r'^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*: ')


def _where(frames) -> str:
  """' (at FILE:LINE in FUNCTION)' of the innermost of `_FRAME` matches, or ''."""
  if not frames:
    return ''
  path, line, function = frames[-1]
  return f' (at {path}:{line} in {function})'


def root_cause(error: BaseException) -> str:
  """One line naming what made a Ray actor fail: `Type: message (at FILE:LINE in F)`.

  For an exception raised in the actor (a `RayTaskError`): the original exception's
  type and message and the innermost frame of its traceback (the env's own code
  when the env raised). For an actor process that died: Ray's reason.
  """
  exceptions = ray_session.import_ray().exceptions
  if type(error).__name__ == 'UnserializableException':
    # The driver could not rebuild the actor's exception; its text holds the
    # remote traceback, whose last line says what it was.
    text = str(error)
    frames = _FRAME.findall(text)
    said = [l.strip() for l in text.splitlines() if _EXCEPTION_LINE.match(l.strip())]
    if said:
      return f'{errors.one_line(said[-1])}{_where(frames)}'
  if isinstance(error, exceptions.RayTaskError):
    cause = getattr(error, 'cause', None) or error
    # The exception ray.get raises derives from the cause's class too; its str is
    # the remote traceback (it has no traceback_str of its own).
    frames = _FRAME.findall(str(error))
    return (f'{type(cause).__name__}: '
            f'{errors.one_line(cause)}{_where(frames)}')
  if isinstance(error, exceptions.RayActorError):
    lines = [l.strip() for l in str(error).splitlines() if l.strip()]
    # An error in the actor's creation task: the last line is the exception.
    frames = _FRAME.findall(str(error))
    if getattr(error, 'actor_init_failed', False) and frames:
      return (f'{type(error).__name__}: '
              f'{errors.one_line(lines[-1])}{_where(frames)}')
    reason = [l for l in lines if not l.startswith(('class_name:', 'actor_id:',
                                                   'pid:', 'name:', 'namespace:'))]
    return f'{type(error).__name__}: {errors.one_line(" ".join(reason))}'
  return f'{type(error).__name__}: {errors.one_line(error)}'
