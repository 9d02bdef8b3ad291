"""The user's own torso, `--network=MODULE:FUNCTION`, as a tf.Module.

`resolve_torso_fn` imports `MODULE` and returns `FUNCTION` (no TensorFlow op
runs); `UserTorso` builds the torso `FUNCTION(observation_space, action_space)`
returns and records the variables it creates. The torso maps float32
`[N, *observation_shape]` (N is e.g. T * B of a time-major sequence, see
`impala_tf/types.py`; uint8 images already scaled to [0, 1]) to float32
`[N, F]`. Every problem is a one-line `ConfigError` naming field `network`.
"""

import importlib
from typing import Callable, Optional, Sequence

import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import errors


def _user_network_error(spec: str, what: str) -> config_lib.ConfigError:
  """A one-line ConfigError for field `network` (the CLI prints `--network=...`)."""
  return config_lib.ConfigError('network', spec, errors.one_line(what, limit=None))


def _describe(e: Exception) -> str:
  """`Type: message` of an exception, on one line (`errors.one_line`)."""
  return errors.one_line(f'{type(e).__name__}: {e}')


def resolve_torso_fn(spec: str) -> Callable:
  """Imports `MODULE` and returns its `FUNCTION` for `spec` = 'MODULE:FUNCTION'.

  Cheap (an import; no TensorFlow op runs), so entry points call it while they
  validate flags, before any device is configured.

  Raises:
    ConfigError: naming `network` when the module cannot be imported (or fails
      while importing) or has no callable of that name.
  """
  if not config_lib.is_user_network(spec):
    raise _user_network_error(spec, config_lib.NETWORK_ALLOWED)
  module_name, fn_name = spec.split(':')
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise _user_network_error(
        spec, f'cannot import module {module_name!r} ({_describe(e)}); MODULE must '
        'be importable from sys.path (the current directory or PYTHONPATH)') from None
  except Exception as e:  # pylint: disable=broad-except
    raise _user_network_error(
        spec, f'importing module {module_name!r} failed: {_describe(e)}') from None
  fn = getattr(module, fn_name, None)
  if fn is None:
    raise _user_network_error(
        spec, f'module {module_name!r} ({getattr(module, "__file__", "?")}) has no '
        f'function {fn_name!r}')
  if not callable(fn):
    raise _user_network_error(
        spec, f'{module_name}.{fn_name} is not callable (type {type(fn).__name__}); '
        'it must be a function '
        'FUNCTION(observation_space, action_space) returning a torso')
  return fn


class _Untracked:
  """Holds objects out of sight of tf.Module and checkpoint tracking."""

  def __init__(self, **items):
    self.__dict__.update(items)


class UserTorso(tf.Module):
  """The torso `FUNCTION(observation_space, action_space)` builds, as a tf.Module.

  `FUNCTION` returns a Keras 3 model or layer, a tf-keras one (with
  `TF_USE_LEGACY_KERAS=1`), a tf.Module or any callable that maps float32
  `[N, *observation_shape]` (uint8 images already scaled to [0, 1]) to float32
  `[N, F]`. Both `FUNCTION` and a first call on a zero batch run here, inside a
  variable-creator scope that records every variable they create; those
  variables (plain or mirrored `tf.Variable`s, also the ones under Keras 3's
  `keras.Variable`s) become `torso_variables`, in creation order, except
  trainable variables of a non-float dtype, which nothing can train (tf-keras
  models' batch counters): those are neither trained nor checkpointed. So the
  variables exist before a checkpoint restore or an optimizer build, tf.Module's
  `variables` / `trainable_variables` and tf.train.Checkpoint see them whatever
  the framework, and the Keras object itself is not tracked (a SavedModel of the
  network loads with TensorFlow alone). `FUNCTION` must build a new torso at
  each call: impala_tf builds one for the learner, one per actor and one per
  export.

  Attributes:
    spec: 'MODULE:FUNCTION'.
    output_size: F.
    torso_variables: list of the torso's tf.Variables.
    spaces: `(observation_space, action_space)` it was built for.
    module: the object FUNCTION returned.

  Raises:
    ConfigError: naming `network` (one line) when FUNCTION cannot be imported,
      raises, returns something that is not callable, reuses variables that
      existed before the call, or whose output is not float `[N, F]`.
  """

  def __init__(self, spec: str, observation_space, action_space,
               observation_shape: Sequence[int], name: Optional[str] = None):
    super().__init__(name=name)
    fn = resolve_torso_fn(spec)
    self.spec = spec
    shape = tuple(int(d) for d in observation_shape)
    created = []

    def record(next_creator, **kwargs):
      v = next_creator(**kwargs)
      created.append(v)
      return v

    call = f'{spec.replace(":", ".")}(observation_space, action_space)'
    probe_batch = 2
    with tf.variable_creator_scope(record):
      try:
        torso = fn(observation_space, action_space)
      except Exception as e:  # pylint: disable=broad-except
        raise _user_network_error(
            spec, f'{call} raised {_describe(e)}') from None
      if not callable(torso):
        raise _user_network_error(
            spec, f'{call} returned {type(torso).__name__}, not a torso: return a '
            'Keras model or layer, a tf.Module or a callable mapping float32 '
            f'[B, {", ".join(map(str, shape))}] to [B, F]')
      try:
        out = torso(tf.zeros((probe_batch,) + shape, tf.float32))
        out = tf.convert_to_tensor(out)
      except Exception as e:  # pylint: disable=broad-except
        raise _user_network_error(
            spec, f'the torso of {call} failed on a float32 batch of shape '
            f'{[probe_batch, *shape]}: {_describe(e)}') from None
    if out.shape.rank != 2 or out.shape[0] != probe_batch or not out.shape[1]:
      raise _user_network_error(
          spec, f'the torso of {call} maps float32 {[probe_batch, *shape]} to '
          f'shape {out.shape.as_list() if out.shape.rank is not None else "?"} '
          f'(rank {out.shape.rank}); it must return features [B, F] of rank 2 with '
          'a known F >= 1 (flatten or pool the rest)')
    if not out.dtype.is_floating:
      raise _user_network_error(
          spec, f'the torso of {call} returns {out.dtype.name}; it must return '
          'floating-point features [B, F]')
    unique, untrained, seen = [], [], set()
    for v in created:
      if id(v) not in seen:
        seen.add(id(v))
        # A "trainable" integer variable cannot be trained: e.g. tf-keras models'
        # batch counters. They stay out of the network's variables.
        (untrained if v.trainable and not v.dtype.is_floating else unique).append(v)
    existing = getattr(torso, 'variables', None)
    try:
      num_existing = len(existing() if callable(existing) else existing or ())
    except TypeError:
      num_existing = 0
    if num_existing > len(unique) + len(untrained):
      raise _user_network_error(
          spec, f'{call} returned a torso whose variables existed before the call '
          f'({num_existing} variables, {len(unique)} created by it); FUNCTION must '
          'build a new torso at each call (impala_tf builds one for the learner '
          'and one per actor)')
    self.torso_variables = unique
    self.output_size = int(out.shape[1])
    self._held = _Untracked(module=torso, spaces=(observation_space, action_space),
                            untrained=untrained)

  @property
  def module(self):
    return self._held.module

  @property
  def spaces(self):
    return self._held.spaces

  def __call__(self, x: tf.Tensor) -> tf.Tensor:
    """Maps float32 `[N, *observation_shape]` to float32 `[N, output_size]`."""
    return tf.cast(self._held.module(x), tf.float32)
