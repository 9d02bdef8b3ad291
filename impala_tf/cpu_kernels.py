"""oneDNN for TensorFlow's CPU kernels on every x86-64 CPU, in the entry points.

TensorFlow's x86-64 builds run convolutions, matrix products and their gradients
through oneDNN by default only on CPUs with AVX512_VNNI, AVX512_BF16 or AMX; on
other x86-64 CPUs (AVX2 only: many laptops and cloud machines) they use
TensorFlow's Eigen kernels unless `TF_ENABLE_ONEDNN_OPTS=1` is set before
TensorFlow is imported. Eigen computes the weight gradient of a strided
convolution with few input channels slowly: on a 2-core AVX2 machine the weight
gradient of the shallow torso's first convolution (8x8, stride 4, 4 channels; a
batch of 168 frame stacks) took 78.6 ms of CPU against 10.4 ms with oneDNN, a
`configs/pong.cfg` learner step 123.8 against 71.3 ms, and the Pong trainer
stepped 1.3-1.6x the env frames/s (docs/benchmarks.md, "oneDNN on AVX2 CPUs").

The entry points (`impala_tf.train`, `.evaluate`, `.export`, when run as
programs) call `prefer_onednn()` before anything imports TensorFlow: on x86-64,
unless `TF_ENABLE_ONEDNN_OPTS` is already in the environment (any value, the
user's choice), it is set to 1. Processes started from them (learner workers,
actor processes, a local Ray instance's workers, env subprocesses) inherit it.
Where TensorFlow already turns oneDNN on, this changes nothing; elsewhere results
differ from TensorFlow's default by float round-off (oneDNN sums in another
order). `TF_ENABLE_ONEDNN_OPTS=0 python -m impala_tf.train ...` keeps Eigen.

Importing impala_tf's modules into your own code sets nothing: set the variable
yourself, before importing TensorFlow, for the same kernels.
"""

import os
import platform
import sys
from typing import MutableMapping, Optional

ENV_VAR = 'TF_ENABLE_ONEDNN_OPTS'

# platform.machine() of the CPUs whose TensorFlow builds ship oneDNN's x86 kernels.
X86_64_MACHINES = ('x86_64', 'amd64')


def prefer_onednn(environ: Optional[MutableMapping[str, str]] = None,
                  machine: Optional[str] = None,
                  tensorflow_imported: Optional[bool] = None) -> Optional[str]:
  """Sets `TF_ENABLE_ONEDNN_OPTS=1` for the TensorFlow to come, unless chosen.

  Nothing is set when the variable is already in `environ` (the user's choice),
  when the CPU is not x86-64 (TensorFlow's default stays), or when TensorFlow is
  already imported (the setting would reach only child processes, which would
  then compute with other kernels than this one).

  Args:
    environ: the environment to read and update (default `os.environ`).
    machine: `platform.machine()` (default: this machine's).
    tensorflow_imported: whether TensorFlow is imported in this process (default:
      whether `tensorflow` is in `sys.modules`).

  Returns:
    The variable's value after the call (str), or None when it is not set
    (TensorFlow's own default applies).
  """
  environ = os.environ if environ is None else environ
  if ENV_VAR in environ:
    return environ[ENV_VAR]
  machine = platform.machine() if machine is None else machine
  if tensorflow_imported is None:
    tensorflow_imported = 'tensorflow' in sys.modules
  if machine.lower() not in X86_64_MACHINES or tensorflow_imported:
    return None
  environ[ENV_VAR] = '1'
  return '1'
