"""Which torso a `network` value builds: the built-in names and 'auto' resolved.

Imports no TensorFlow: the resume checks (`rundir`) compare torsos before the CLI
imports TensorFlow. The torsos themselves are in `impala_tf.torsos` (built-in)
and `impala_tf.user_torso` ('MODULE:FUNCTION').
"""

from typing import Sequence

# The built-in torsos (`network=mlp|shallow|deep`).
TORSOS = ('mlp', 'shallow', 'deep')


def resolve_torso(network: str, observation_shape: Sequence[int]) -> str:
  """The torso `network` names for observations of `observation_shape`.

  `network='auto'` is 'mlp' for rank-1 (vector) observations and 'deep' for any
  other rank; `networks.make_network` builds 'auto' only for ranks 1 to 3 (images
  `[H, W]` or `[H, W, C]`) and refuses the rest. Any other value ('mlp',
  'shallow', 'deep', 'MODULE:FUNCTION') is returned as it is; whether it fits the
  observations is `make_network`'s check.

  Args:
    network: a `Config.network` value.
    observation_shape: one observation's shape (the single env's space's `shape`).

  Returns:
    'mlp', 'shallow', 'deep' or the user's 'MODULE:FUNCTION'.
  """
  if network != 'auto':
    return network
  return 'mlp' if len(observation_shape) == 1 else 'deep'


def acts_with_numpy(torso: str, use_lstm: bool, compute_dtype: str) -> bool:
  """Whether thread and process actors act with numpy (`NumpyMLPPolicy`).

  They do for the 'mlp' torso without LSTM in float32; every other network acts
  through TensorFlow. Decided here once, for the actors (`NumpyMLPPolicy.supports`)
  and for the inter-op pool, which is chosen from the config before any network
  exists (`distribute.inter_op_threads`).

  Args:
    torso: a resolved torso name (`resolve_torso`).
    use_lstm: `Config.use_lstm`.
    compute_dtype: `Config.compute_dtype`.
  """
  return torso == 'mlp' and not use_lstm and compute_dtype == 'float32'
