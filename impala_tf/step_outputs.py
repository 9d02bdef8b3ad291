"""The steps of one learner call in one graph, and their outputs packed.

`Learner.step_from_iterator` makes several train steps in one `tf.function` call
(`CallSteps`: fetch a batch, time its wait, prepare it once, step `reuse` times,
loop over more batches). The outputs of the steps of one call are carried
through its loops as one float64 vector `[len(keys)]` (`Packed`) and come back
as that vector and one flat vector of the network's weights per dtype, unpacked
into Python floats and numpy arrays (`Unpacker`) with one `.numpy()` each.
"""

from typing import Callable, Dict, Sequence

import tensorflow as tf

# Step outputs that `Learner.step_from_iterator` sums over the steps of one call.
SUMMED = ('policy_lag_sum', 'num_unrolls', 'fresh_frames', 'replayed_frames',
          'trained_frames', 'grad_clipped', 'nonfinite', 'empty_shards',
          'data_wait_seconds')


class Packed:
  """A call's step outputs as one float64 vector, and how to fold more into it.

  The outputs of the steps of one call are carried through its loops as one
  vector (keys in a fixed order) rather than as ~35 scalars: every loop variable
  costs the executor a few control-flow ops per step. float64 holds every int32
  count and float32 value exactly.

  Folding (`fold`): counts in `SUMMED` and `steps` add up, `policy_lag_max` is
  the maximum, and the rest is the newer step's, except keys the newer steps do
  not have (the first step's `grad_norm_*`, a reused batch's
  `data_wait_seconds`), which stay.

  Args:
    keys: the outputs of the call's first step (a superset of the others').
  """

  def __init__(self, keys):
    self.keys = sorted(keys)

  def pack(self, results: Dict[str, tf.Tensor]) -> tf.Tensor:
    """float64 `[len(keys)]`; keys `results` lacks are 0."""
    zero = tf.zeros([], tf.float64)
    return tf.stack([tf.cast(results[k], tf.float64) if k in results else zero
                     for k in self.keys])

  def fold(self, acc: tf.Tensor, new: tf.Tensor, new_keys) -> tf.Tensor:
    """`acc` (packed) with a later step's packed outputs `new` (of `new_keys`)."""
    summed = [k in SUMMED + ('steps',) and k in new_keys for k in self.keys]
    kept = [k not in new_keys for k in self.keys]
    out = tf.where(tf.constant(kept), acc, new)
    out = tf.where(tf.constant([k == 'policy_lag_max' for k in self.keys]),
                   tf.maximum(acc, new), out)
    return tf.where(tf.constant(summed), acc + new, out)


class Unpacker:
  """A call's packed outputs as `Learner.step_from_iterator` returns them.

  Plain Python containers on purpose: a `tf.Module` wraps its list attributes in
  trackable wrappers, which are slow to iterate (py-spy, on every call).

  Args:
    variables: the network's variables, in `network.variables` order.

  Attributes:
    keys: tuple of str, the order of the scalars (set when the call is traced).
    dtypes: tuple of str, the weight dtypes, one flat vector each.
  """

  def __init__(self, variables):
    layout, sizes = [], {}
    for v in variables:  # Where each variable sits in the vector of its dtype.
      dtype, size = v.dtype.name, int(v.shape.num_elements())
      layout.append((dtype, sizes.get(dtype, 0), size, tuple(v.shape)))
      sizes[dtype] = sizes.get(dtype, 0) + size
    self._layout = tuple(layout)
    self.dtypes = tuple(sorted(sizes))
    self.keys = ()

  def __call__(self, packed: Dict[str, tf.Tensor], keys=None) -> Dict[str, object]:
    """packed: 'scalars' float64 `[len(keys)]`, and a flat vector per dtype;
    keys: the scalars' names (default: `self.keys`)."""
    keys = self.keys if keys is None else keys
    out = dict(zip(keys, packed['scalars'].numpy().tolist()))
    flat = {dtype: packed[dtype].numpy() for dtype in self.dtypes}
    out['weights'] = [flat[dtype][start:start + size].reshape(shape)
                      for dtype, start, size, shape in self._layout]
    return out


class CallSteps:
  """The steps of one `Learner.step_from_iterator` call, built as one graph.

  Plain Python (not a `tf.Module`), like `Unpacker`.

  Args:
    train_step: `train_step(shards, term_norms, reuse_index=None)`, the learner's
      train step on a prepared distributed batch; returns its dict of scalar
      tensors.
    prepare: distributed batch -> the prepared batch `train_step` takes; run
      once per fetched batch, whose `reuse` steps share what it returns.
    strategy: the learner's `tf.distribute.Strategy`.
    steps_per_call: `config.learner_steps_per_call`.
    variables: the network's variables, in `network.variables` order.
    read_weights: returns their values (a list of tensors, the same order).

  Attributes:
    unpack: the `Unpacker` of the call's outputs.
  """

  def __init__(self, train_step: Callable, prepare: Callable,
               strategy: tf.distribute.Strategy, steps_per_call: int,
               variables: Sequence[tf.Variable], read_weights: Callable):
    self._train_step = train_step
    self._prepare = prepare
    self._strategy = strategy
    self._steps_per_call = int(steps_per_call)
    self._read_weights_fn = read_weights
    self.unpack = Unpacker(variables)

  def __call__(self, iterator, reuse=1, term_norms=None) -> Dict[str, tf.Tensor]:
    """The call's steps on batches from `iterator`, `reuse` steps on each.

    Returns:
      dict: 'scalars', the folded outputs packed (float64 `[len(keys)]`, keys
      in `unpack.keys`), and per weight dtype the weights after the last update,
      concatenated into one flat vector.
    """
    packer, packed, _ = self._timed_step(lambda: next(iterator),
                                         term_norms=term_norms, reuse=reuse)
    more = -(-self._steps_per_call // reuse) - 1  # Batches.
    if more > 0:
      packed = self._more_steps(iterator, packer, packed, more, reuse)
    self.unpack.keys = tuple(packer.keys)  # The order of the float64 vector.
    out = {'scalars': packed}
    with tf.control_dependencies([packed]):
      weights = self._read_weights_fn()
    for dtype in self.unpack.dtypes:
      out[dtype] = tf.concat(
          [tf.reshape(w, [-1]) for w in weights if w.dtype.name == dtype], axis=0)
    return out

  def _timed_step(self, fetch, start=None, term_norms=None, reuse=1, packer=None):
    """`reuse` train steps on the batch `fetch()` returns, with its data wait.

    The wait runs from `start` (float64 `[]`; default: now) until every shard of
    the batch is there. `term_norms` as `train_step`'s, for the first step (the
    others go without). The outputs of the steps are folded as `Packed` says;
    `steps` is `reuse`.

    Returns:
      `(packer, packed, keys)`: the `Packed` (`packer`, or one made from this
      step's outputs), the folded outputs packed by it, and the keys they have.
    """
    if start is None:
      start = tf.timestamp()
    with tf.control_dependencies([start]):
      shards = fetch()
    components = [x for x in tf.nest.flatten(
        tf.nest.map_structure(self._strategy.experimental_local_results, shards))]
    with tf.control_dependencies(components):
      ready = tf.timestamp()
    # Nothing of the step (counters included) runs before `ready`, so before its
    # batch is there: a call that finds the data ended leaves every variable as
    # it was. And only `ready` waits on the batch directly: were the step's
    # ~1,400 ops waiting on it too, the executor would run many of them before
    # `ready` once the batch came, and their time would count as a data wait
    # (it did: 0.2-0.26 of a CartPole step on an always-ready dataset).
    with tf.control_dependencies([ready]):
      shards = self._prepare(tf.nest.map_structure(tf.identity, shards))
      results = self._train_step(shards, term_norms)
    results['data_wait_seconds'] = ready - start
    results['steps'] = tf.constant(1, tf.int32)
    if packer is None:
      packer = Packed(results)
    packed = packer.pack(results)
    if reuse > 1:
      # The same shards, in a loop: the graph holds one copy of the step.
      def body(i, acc):
        new = dict(self._train_step(shards, False, reuse_index=i),
                   steps=tf.constant(1, tf.int32))
        return i + 1, packer.fold(acc, packer.pack(new), new)

      _, packed = tf.while_loop(
          lambda i, _: i < reuse, body, (tf.constant(1), packed),
          parallel_iterations=1)
    return packer, packed, set(results)

  def _more_steps(self, iterator, packer, first, more, reuse=1):
    """Up to `more` further batches (`reuse` steps each) in a `tf.while_loop`,
    folding their outputs into `first`'s (packed by `packer`).

    The loop ends early, without error, when the data ends (the iterator's next
    element is empty); `steps` says how many steps were made.
    """
    def body(i, _, acc):
      start = tf.timestamp()
      with tf.control_dependencies([start]):
        element = iterator.get_next_as_optional()
      has_value = element.has_value()

      def run():  # The wait counts from before the fetch.
        _, new, keys = self._timed_step(element.get_value, start,
                                        term_norms=False, reuse=reuse,
                                        packer=packer)
        return packer.fold(acc, new, keys)

      out = tf.cond(has_value, run, lambda: tf.identity(acc))
      return i + 1, has_value, out

    _, _, packed = tf.while_loop(
        lambda i, has_value, _: tf.logical_and(i < more, has_value), body,
        (tf.constant(0), tf.constant(True), first), parallel_iterations=1)
    return packed
