"""Learner devices: MirroredStrategy over GPUs, virtual CPU devices, or the CPU.

`configure_devices` must run before TensorFlow initialises its devices (before the
first op); `get_strategy` then returns a `tf.distribute.MirroredStrategy` over:

* `num_gpus` GPUs, all-reducing with NCCL;
* else `num_virtual_cpu_devices` logical devices carved out of the CPU (the tower path
  without a GPU: tests and CI use it);
* else the CPU as a single replica (still a MirroredStrategy, so every run takes the
  same code path: replica context, all-reduce, merge_call).
"""

from typing import List

from absl import logging
import tensorflow as tf

from impala_tf import config as config_lib


def visible_gpus() -> List[str]:
  """Names of the physical GPUs TensorFlow sees (does not initialise devices)."""
  return [d.name for d in tf.config.list_physical_devices('GPU')]


def check_gpus(num_gpus: int):
  """Raises ConfigError naming num_gpus when fewer GPUs are visible."""
  if num_gpus:
    found = len(visible_gpus())
    if found < num_gpus:
      raise config_lib.ConfigError(
          'num_gpus', num_gpus,
          f'only {found} GPU(s) are visible to TensorFlow; use --num_gpus<={found} '
          '(0 trains on the CPU)')


def configure_devices(num_virtual_cpu_devices: int = 0, num_gpus: int = 0):
  """Splits the CPU into logical devices and hides unused GPUs.

  Args:
    num_virtual_cpu_devices: int, logical CPU devices to create (0 or 1: none).
    num_gpus: int, GPUs the learner uses; the others are hidden from TensorFlow.

  Once TensorFlow has initialised its devices (an op ran), the GPUs seen can no
  longer change. GPUs that should be hidden but stay visible are only warned about
  (the learner names its devices, so it still trains on the ones asked for, but
  TensorFlow may reserve memory on the others); too few visible is an error.

  Raises:
    RuntimeError: when TensorFlow's devices are already initialised with a different
      layout (configure devices before running any TensorFlow op): fewer GPUs
      visible than `num_gpus`, or another number of CPU devices.
  """
  cpus = tf.config.list_physical_devices('CPU')
  gpus = tf.config.list_physical_devices('GPU')
  if gpus:
    want = gpus[:num_gpus]
    try:
      tf.config.set_visible_devices(want, 'GPU')
    except RuntimeError:  # Initialised: the layout it has stays.
      visible = tf.config.get_visible_devices('GPU')
      missing = [d.name for d in want if d not in visible]
      extra = [d.name for d in visible if d not in want]
      initialised = ('TensorFlow initialised its devices before configure_devices '
                     'ran (configure devices before any TensorFlow op runs, e.g. '
                     'in a fresh process)')
      if missing:
        raise RuntimeError(f'num_gpus={num_gpus}: {", ".join(missing)} hidden; '
                           f'{initialised}') from None
      if extra:
        logging.warning('num_gpus=%d: %s stay visible, not hidden; %s', num_gpus,
                        ', '.join(extra), initialised)
  try:
    if num_virtual_cpu_devices > 1:
      tf.config.set_logical_device_configuration(
          cpus[0], [tf.config.LogicalDeviceConfiguration()] * num_virtual_cpu_devices)
  except RuntimeError:
    have = len(tf.config.list_logical_devices('CPU'))
    if num_virtual_cpu_devices > 1 and have != num_virtual_cpu_devices:
      raise RuntimeError(
          f'num_virtual_cpu_devices={num_virtual_cpu_devices}: TensorFlow already '
          f'initialised {have} CPU device(s) in this process; configure devices '
          'before any TensorFlow op runs (e.g. in a fresh process)') from None


def get_strategy(num_gpus: int = 0,
                 num_virtual_cpu_devices: int = 0) -> tf.distribute.MirroredStrategy:
  """Returns the learner's MirroredStrategy (see the module docstring)."""
  if num_gpus:
    devices = [f'/gpu:{i}' for i in range(num_gpus)]
    ops = tf.distribute.NcclAllReduce() if num_gpus > 1 else None
    return tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
  if num_virtual_cpu_devices > 1:
    have = len(tf.config.list_logical_devices('CPU'))
    if have < num_virtual_cpu_devices:
      raise RuntimeError(
          f'num_virtual_cpu_devices={num_virtual_cpu_devices}: only {have} CPU '
          'device(s) exist; call configure_devices() before any TensorFlow op')
    devices = [f'/cpu:{i}' for i in range(num_virtual_cpu_devices)]
    return tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice('/cpu:0'))
  return tf.distribute.MirroredStrategy(['/cpu:0'])
