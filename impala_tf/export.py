"""SavedModel export of a policy; `python -m impala_tf.export --logdir=DIR`.

`saved_policy.save_policy(network, path)` writes a SavedModel whose `serving_default` signature maps a batch of
observations `[B, *obs_shape]` (the env's dtype) to `{'action': int32 [B] (sampled),
'greedy_action': int32 [B], 'policy_logits': float32 [B, A], 'baseline': float32
[B]}`. With a recurrent core it also takes `prev_action` int32 [B], `reward` float32
[B], `first` bool [B] and `core_state_0..k` float32 [B, S], and returns the new
`core_state_*`; an `initial_state` signature (`batch_size` -> zero states) comes with
it. Loading needs TensorFlow only:
`tf.saved_model.load(path).signatures['serving_default'](observation=...)`.

A training run writes `logdir/saved_policy` when it ends. The command line restores
the latest checkpoint of a run directory (also of a run that is still going, or was
killed) into a network built from `logdir/config.json`, and writes the SavedModel to
`logdir/saved_policy` or `--output`:

    python -m impala_tf.export --logdir=/tmp/impala_cartpole [--output=PATH]

A missing directory, config.json or checkpoint ends it with exit status 2 and one
line on stderr, before TensorFlow is imported. TensorFlow's own start-up logs are off unless TF_CPP_MIN_LOG_LEVEL
is set or `--verbosity=1` is passed (`impala_tf.quiet`).
"""

import os
import sys
from typing import Optional, Tuple

from absl import flags

from impala_tf import config as config_lib
from impala_tf import flags as flags_lib
from impala_tf import quiet
from impala_tf import rundir

PROG = 'impala_tf.export'



def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines --logdir and --output (not at import: importing defines no flags)."""
  if 'logdir' not in flag_values:
    flags.DEFINE_string('logdir', None,
                        'Run directory of an impala_tf.train run: config.json and '
                        'checkpoints/ are read from it. Required.',
                        flag_values=flag_values)
  if 'output' not in flag_values:
    flags.DEFINE_string('output', None,
                        'Where to write the SavedModel; default LOGDIR/saved_policy. '
                        'An existing SavedModel there is replaced.',
                        flag_values=flag_values)


def export_run(logdir: str, output: Optional[str] = None) -> Tuple[str, str]:
  """Restores the latest checkpoint of `logdir` and writes its SavedModel.

  Args:
    logdir: the run directory.
    output: output directory; default `logdir/saved_policy`.

  Returns:
    (output path, checkpoint path).

  Raises:
    rundir.RunDirError: no config.json or no checkpoint.
  """
  rundir.check_checkpoint_run(logdir)  # Before TensorFlow is imported (below).
  # pylint: disable=g-import-not-at-top
  from impala_tf import checkpoints
  from impala_tf import saved_policy
  # pylint: enable=g-import-not-at-top
  _, network, path = checkpoints.restore_network(logdir)
  output = output or os.path.join(logdir, rundir.SAVED_POLICY_SUBDIR)
  saved_policy.save_policy(network, output)
  return output, path


def main(argv):
  del argv  # parse_flags rejects positional arguments.
  fv = flags.FLAGS
  if not fv.logdir:
    flags_lib.exit_with_error('--logdir is required: the run directory to export',
                              PROG)
  try:
    rundir.check_checkpoint_run(fv.logdir)
    # The inputs are checked: now TensorFlow is imported, quietly.
    quiet.quiet_tensorflow(quiet.argv_verbosity(sys.argv))
    output, path = export_run(fv.logdir, fv.output)
  except rundir.RunDirError as e:
    flags_lib.exit_with_error(str(e), PROG)
  except config_lib.ConfigError as e:  # E.g. its --network MODULE is not importable.
    flags_lib.exit_with_error(f'{rundir.CONFIG_FILE} of --logdir: {e}', PROG)
  print(f'{PROG}: wrote {output} from {path}', flush=True)


def run():
  flags_lib.run_program(main, PROG, define_flags)


if __name__ == '__main__':
  run()
