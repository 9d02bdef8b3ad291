"""User torsos for the tests of `--network=MODULE:FUNCTION` (`testdata.torsos:NAME`).

Each function has the signature impala_tf calls, `FUNCTION(observation_space,
action_space)`, and returns a torso mapping float32 `[B, *observation_shape]` to
`[B, F]`, except the deliberately bad ones at the end.

`keras_mlp` uses `tf.keras`: Keras 3 by default, tf-keras when the process runs with
`TF_USE_LEGACY_KERAS=1`; `TORSO_KINDS` lets a test see which one it got.
"""

import math

import tensorflow as tf

TORSO_KINDS = []  # Top-level package of each Keras torso built: 'keras' / 'tf_keras'.


def keras_mlp(observation_space, action_space):
  """A small Keras MLP (16 ReLU units), flattening any observation shape."""
  del action_space
  model = tf.keras.Sequential([
      tf.keras.layers.Input(shape=observation_space.shape),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(16, activation='relu'),
  ])
  TORSO_KINDS.append(type(model).__module__.split('.')[0])
  return model


def keras_layer(observation_space, action_space):
  """A bare, unbuilt Keras layer: impala_tf builds it on a dummy batch."""
  del observation_space, action_space
  return tf.keras.layers.Dense(8, activation='tanh')


class _ModuleTorso(tf.Module):
  """A tf.Module torso: one tanh layer."""

  def __init__(self, input_size, units=8):
    super().__init__()
    self.input_size = input_size
    self.w = tf.Variable(tf.random.stateless_uniform([input_size, units], [1, 2],
                                                     -0.5, 0.5))
    self.b = tf.Variable(tf.zeros([units]))

  def __call__(self, x):
    return tf.tanh(tf.reshape(x, [-1, self.input_size]) @ self.w + self.b)


def module_mlp(observation_space, action_space):
  del action_space
  return _ModuleTorso(math.prod(observation_space.shape))


def identity(observation_space, action_space):
  """A plain function without variables: the observation is the feature."""
  del observation_space, action_space
  return lambda x: tf.reshape(x, [tf.shape(x)[0], -1])


# `hangs_in_the_learner`: batches of more rows than this are the learner's (the
# actors step a few envs at a time); the HANG_AFTER-th such batch never returns.
LEARNER_ROWS_ABOVE = 16
HANG_AFTER = 3
_learner_batches = [0]


def _block_on_the_learner_batch(x):
  """Returns `x`; blocks forever on the HANG_AFTER-th batch of the learner."""
  import time  # pylint: disable=g-import-not-at-top
  if x.shape[0] > LEARNER_ROWS_ABOVE:
    _learner_batches[0] += 1
    while _learner_batches[0] >= HANG_AFTER:
      time.sleep(1)
  return x


def hangs_in_the_learner(observation_space, action_space):
  """The identity torso, which hangs inside the learner's step (its 3rd batch).

  A test of the progress watchdog: the step never returns while the actors and the
  data pipeline keep working (the queue fills; no loader times out).
  """
  del observation_space, action_space
  def torso(x):
    x = tf.reshape(x, [tf.shape(x)[0], -1])
    y = tf.py_function(_block_on_the_learner_batch, [x], tf.float32)
    return tf.reshape(y, tf.shape(x))
  return torso


_SHARED = []


def shared(observation_space, action_space):
  """Bad: returns the same built torso at every call."""
  if not _SHARED:
    _SHARED.append(_ModuleTorso(math.prod(observation_space.shape)))
  del action_space
  return _SHARED[0]


def returns_int(observation_space, action_space):
  """Bad: not a torso."""
  del observation_space, action_space
  return 3


def wrong_rank(observation_space, action_space):
  """Bad: features of rank 3 `[B, F, 1]`."""
  del observation_space, action_space
  return lambda x: tf.reshape(x, [tf.shape(x)[0], -1])[..., tf.newaxis]


def raises(observation_space, action_space):
  """Bad: FUNCTION itself fails, with a message of several lines."""
  del observation_space, action_space
  raise ValueError('cannot build this torso\nsecond line of the message')


NOT_A_FUNCTION = 7
