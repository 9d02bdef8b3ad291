"""The tower learner: one train step on every replica of a MirroredStrategy.

Variables (network, optimizer slots, counters) are created under `strategy.scope()`,
so each replica holds a mirror. A train step runs `strategy.run` over the per-replica
shards; on each replica: the network unrolls over its `[T + 1, B / N]` shard, V-trace
and the loss (a SUM over the shard, `impala_tf.losses`), the gradient; then the
gradients and diagnostics are all-reduced with SUM, clipped once by global norm, and
applied once by the optimizer (a merge_call that updates every mirror identically).
Because losses are sums, the applied update equals the single-device update on the
whole batch, for any number of replicas.

An update whose all-reduced loss or gradient norm is not finite is skipped in the
graph (`tf.cond` in the optimizer: weights, slots and the optimizer's `iterations`
unchanged; the same branch on every replica); the step still counts. The counters
`nonfinite_updates` (in all) and `nonfinite_streak` (in a row) follow it.

With PopArt (`config.popart`) each step first computes the V-trace targets with the
current statistics, moves the statistics towards the targets' moments over the whole
batch (all-reduced), rescales the value head so its outputs in return units are
preserved, and then takes the gradient of the losses normalised by the new sigma
(docs/design.md, "Value scale"). With `normalize_advantages` the policy term's
advantages are normalised over the whole batch the same way.

The learning-rate and entropy-cost schedules are functions of `consumed_frames`, the
fresh env frames the learner has trained on (counted once per batch, at its first
use), which is checkpointed with the rest.
"""

import functools
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import losses
from impala_tf import optimizers
from impala_tf import types

_SUM = tf.distribute.ReduceOp.SUM
# Step outputs that `step_from_iterator` sums over the steps of one call.
_SUMMED = ('policy_lag_sum', 'num_unrolls', 'fresh_frames', 'replayed_frames',
           'trained_frames', 'grad_clipped', 'nonfinite', 'data_wait_seconds')


def clip_rewards(rewards: tf.Tensor, mode: str) -> tf.Tensor:
  """Loss-side reward clipping. rewards: float32 `[T, B]`; mode as Config."""
  if mode == 'abs_one':
    return tf.clip_by_value(rewards, -1.0, 1.0)
  if mode == 'soft_asymmetric':
    squeezed = tf.tanh(rewards / 5.0)
    return tf.where(rewards < 0, 0.3 * squeezed, squeezed) * 5.0
  return rewards


def uses_jit(config: config_lib.Config, num_replicas: int) -> bool:
  """Whether the learner compiles its per-replica gradient with XLA.

  `learner_jit='on'` compiles it; 'off' does not; 'auto' takes what measured
  faster on this device type: on the CPU that is no XLA (bench/learner_step.py,
  docs/benchmarks.md); on GPUs it has not been measured, so 'auto' does not
  compile there either. The compiled part is the network's forward and backward
  pass, V-trace and the losses; with several replicas it must not need a sum over
  them before the gradient (PopArt, `loss_reduction='mean'` and
  `normalize_advantages` do; Config validation refuses 'on' with those).

  Args:
    config: the run's Config.
    num_replicas: the strategy's replicas in sync.
  """
  del num_replicas  # Config validation has checked 'on' against it.
  return config.learner_jit == 'on'


def _time_major(x: tf.Tensor) -> tf.Tensor:
  """`[B, T, ...]` -> `[T, B, ...]` (the same values as `tf.transpose`).

  With static B and T it is a gather of the `B * T` rows in time-major order:
  on CPU, oneDNN's transposes of a batch's three small float fields took ~10% of
  a CartPole learner step (docs/benchmarks.md).
  """
  b, t = x.shape[0], x.shape[1]
  if b is None or t is None or x.shape[2:].num_elements() is None:
    return tf.transpose(x, [1, 0] + list(range(2, x.shape.rank)))
  rest = x.shape[2:].as_list()
  rows = np.arange(b * t).reshape(b, t).T.reshape(-1)
  return tf.reshape(tf.gather(tf.reshape(x, [b * t] + rest), rows), [t, b] + rest)


def _sum_in_order(terms: Sequence[tf.Tensor]) -> tf.Tensor:
  """`terms[0] + terms[1] + ...`, added in the same order on every replica.

  A chain of `+` becomes one `AddN` under Grappler, and `AddN` starts from
  whichever input buffer it can reuse at run time, so two replicas adding the
  same all-reduced values can round differently and their mirrors drift apart
  (seen on CPU under load: 1e-8 in the gradient, then in the weights). A sum
  over a stacked axis has one order.

  Args:
    terms: float tensors of one shape and dtype.

  Returns:
    Their sum, of that shape and dtype.
  """
  return tf.reduce_sum(tf.stack(list(terms)), axis=0)


def reuse_in_call(config: config_lib.Config) -> int:
  """Steps `Learner.step_from_iterator` should make on each batch it fetches.

  `config.num_sgd_iter` when the reuse ring is one batch (the learner reuses it,
  and the dataset must emit each batch once: build it with `num_sgd_iter=1`);
  1 with a larger ring, which tf.data replays (`data.build_dataset`).
  """
  return config.num_sgd_iter if config.minibatch_buffer_size == 1 else 1


class _Packed:
  """A call's step outputs as one float64 vector, and how to fold more into it.

  The outputs of the steps of one call are carried through its loops as one
  vector (keys in a fixed order) rather than as ~35 scalars: every loop variable
  costs the executor a few control-flow ops per step. float64 holds every int32
  count and float32 value exactly.

  Folding (`fold`): counts in `_SUMMED` and `steps` add up, `policy_lag_max` is
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
    summed = [k in _SUMMED + ('steps',) and k in new_keys for k in self.keys]
    kept = [k not in new_keys for k in self.keys]
    out = tf.where(tf.constant(kept), acc, new)
    out = tf.where(tf.constant([k == 'policy_lag_max' for k in self.keys]),
                   tf.maximum(acc, new), out)
    return tf.where(tf.constant(summed), acc + new, out)


class _Unpacker:
  """A call's packed outputs as `step_from_iterator` returns them.

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


class Learner(tf.Module):
  """Owns the network, the optimizer and the counters, replicated by `strategy`.

  Args:
    config: the run's Config.
    network_fn: builds an `impala_tf.networks.AgentNetwork` (called under the scope).
    strategy: from `impala_tf.distribute.get_strategy`.
    action_repeat: env frames per agent step.
  """

  def __init__(self, config: config_lib.Config, network_fn: Callable[[], tf.Module],
               strategy: tf.distribute.Strategy, action_repeat: int = 1):
    super().__init__(name='learner')
    self._config = config
    self._strategy = strategy
    self._frames_per_unroll = config.unroll_length * action_repeat
    total = config.total_environment_frames
    with strategy.scope():
      self.network = network_fn()
      counter = lambda name: tf.Variable(
          0, dtype=tf.int64, trainable=False, name=name,
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self.learner_steps = counter('learner_steps')
      self.consumed_frames = counter('consumed_frames')
      self.replayed_frames = counter('replayed_frames')
      self.trained_frames = counter('trained_frames')
      # Updates skipped for a non-finite loss or gradient: in all, and in a row.
      self.nonfinite_updates = counter('nonfinite_updates')
      self.nonfinite_streak = counter('nonfinite_streak')
      lr = optimizers.make_schedule(config.learning_rate, config.lr_schedule_points,
                                    total)
      self._entropy_cost = optimizers.make_schedule(
          config.entropy_cost, config.entropy_cost_schedule_points, total)
      self.optimizer = optimizers.make_optimizer(
          config, lambda: lr(self.consumed_frames))
      self.optimizer.build(self.network.trainable_variables)
    self._num_state = len(self.network.initial_state(1))
    # XLA for the per-replica gradient (see `uses_jit`): one compiled function per
    # value of term_norms, with the mid-step reductions of one replica (sums over
    # itself) as identities.
    self._jit_gradients = None
    if uses_jit(config, strategy.num_replicas_in_sync):
      self._jit_gradients = {
          term_norms: tf.function(
              functools.partial(self._gradients, term_norms=term_norms,
                                reduce=lambda x: x),
              jit_compile=True, autograph=False)
          for term_norms in (False, True)}
    # No AutoGraph: the step has no data-dependent Python control flow, and
    # converting it costs seconds of start-up.
    self._train = tf.function(self._train_step, autograph=False)
    # Fetching the batch inside the same tf.function saves the distributed
    # iterator's Python overhead (~1.5 ms per step on 2 CPU cores, a third of a
    # CartPole step).
    self._train_from_iterator = tf.function(self._train_from_iterator_fn,
                                            autograph=False)
    self._bound_iterator = None
    self._bound_train = {}  # term_norms -> (concrete function, its output keys).
    self._bound_reuse = None
    self._unpack = _Unpacker(self.network.variables)
    # Reading all weights in one call (one dispatch, not one per variable).
    self._read_weights = tf.function(self._read_weights_fn, autograph=False)

  @property
  def strategy(self) -> tf.distribute.Strategy:
    return self._strategy

  def learning_rate(self) -> float:
    return float(optimizers.make_schedule(
        self._config.learning_rate, self._config.lr_schedule_points,
        self._config.total_environment_frames)(self.consumed_frames))

  def get_weights(self):
    """The network's variables as numpy arrays (order of `network.variables`)."""
    return [w.numpy() for w in self._read_weights()]

  def _read_weights_fn(self):
    return [tf.identity(v) for v in self.network.variables]

  def step(self, shards) -> Dict[str, tf.Tensor]:
    """Runs one train step on a distributed batch (from `data.distribute`).

    Returns:
      dict of scalar tensors: the all-reduced loss sums and counts of
      `losses.compute_loss`, plus grad_norm, learning_rate, entropy_cost,
      policy_lag_sum / policy_lag_max, the batch's fresh/replayed frames at
      first use, `nonfinite` (1.0 when this update was skipped because the
      all-reduced loss or gradient norm was not finite, else 0.0),
      `nonfinite_streak` (float32, skipped updates in a row up to this one),
      `grad_clipped` (1.0 when the norm exceeded grad_clip), with
      `loss_term_grad_norms` `grad_norm_policy`, `grad_norm_baseline` and
      `grad_norm_entropy` (norms of each weighted term's all-reduced gradient),
      and with PopArt `popart_mu` and `popart_sigma` (after this step).
    """
    return self._train(shards)

  def step_from_iterator(self, iterator, reuse: int = 1,
                         term_norms: Optional[bool] = None) -> Dict[str, object]:
    """Fetches batches and trains on them: `learner_steps_per_call` steps, one call.

    With `reuse` = k > 1 the call trains k steps on each batch it fetches (the
    `num_sgd_iter` reuse done here, so a batch is fetched, and its wait paid,
    once per k steps; the dataset must then emit each batch once, with `reuse`
    0). Step i of the k sees `reuse` = i, as from `data.build_dataset`'s ring, and
    the call makes k * ceil(learner_steps_per_call / k) steps: the multiple of k
    at or above `learner_steps_per_call`.

    The outputs come back as two or three tensors (the scalars stacked into one
    float64 vector, the weights concatenated into one flat vector per dtype) and
    are unpacked here with one `.numpy()` each: a call returns about 40 values,
    and converting each separately held the interpreter lock, which the actor
    threads need, for longer than the CartPole step's graph ran.

    Args:
      iterator: an iterator over `data.distribute(...)`.
      reuse: int >= 1, steps on each fetched batch.
      term_norms: whether the call's first step measures the per-term gradient
        norms (`grad_norm_policy`, ...: two more backward passes, ~10% of a
        CartPole step); None takes `config.loss_term_grad_norms`. The driver asks
        for them only on the calls whose outputs it logs.

    Returns:
      dict of Python floats: what `step` returns for the call's last step,
      except that these are summed
      over the call's steps: `policy_lag_sum`, `num_unrolls`, `fresh_frames`,
      `replayed_frames`, `trained_frames`, `grad_clipped` and `nonfinite` (counts);
      `policy_lag_max` is the maximum. Plus `steps` (int32 `[]`, the steps this
      call made: as above, or fewer when the data ended after its first batch),
      `data_wait_seconds` (the time the call spent waiting for batches,
      measured in the graph with `tf.timestamp`), and `weights`: the
      network's variables after the call's last update (a list of numpy arrays
      in `network.variables` order, views of one array per dtype), so that
      publishing them to the actors needs no second call.

    Raises:
      tf.errors.OutOfRangeError: the dataset ended before the call's first step
        (no step was made: the counters are unchanged).
    """
    # The iterator is bound into a tf.function of no arguments (captured, not
    # passed): passing a distributed iterator flattens its type spec on every call,
    # which cost more Python time per CartPole step than the step's graph.
    if reuse < 1:
      raise ValueError(f'reuse must be >= 1, got {reuse}')
    if term_norms is None:
      term_norms = self._config.loss_term_grad_norms
    term_norms = bool(term_norms)
    if self._bound_iterator is not iterator or self._bound_reuse != reuse:
      self._bound_iterator, self._bound_reuse = iterator, reuse
      self._bound_train = {}
    if term_norms not in self._bound_train:
      # Its concrete function, called directly: the polymorphic function's
      # per-call dispatch was ~10% of a CartPole call.
      fn = tf.function(
          lambda: self._train_from_iterator_fn(iterator, reuse, term_norms),
          autograph=False).get_concrete_function()
      self._bound_train[term_norms] = (fn, self._unpack.keys)
    fn, keys = self._bound_train[term_norms]
    return self._unpack(fn(), keys)

  def _train_from_iterator_fn(self, iterator, reuse=1, term_norms=None):
    packer, packed, _ = self._timed_step(lambda: next(iterator),
                                         term_norms=term_norms, reuse=reuse)
    more = -(-self._config.learner_steps_per_call // reuse) - 1  # Batches.
    if more > 0:
      packed = self._more_steps(iterator, packer, packed, more, reuse)
    self._unpack.keys = tuple(packer.keys)  # The order of the float64 vector.
    out = {'scalars': packed}
    with tf.control_dependencies([packed]):
      weights = self._read_weights_fn()
    for dtype in self._unpack.dtypes:
      out[dtype] = tf.concat(
          [tf.reshape(w, [-1]) for w in weights if w.dtype.name == dtype], axis=0)
    return out

  def _timed_step(self, fetch, start=None, term_norms=None, reuse=1, packer=None):
    """`reuse` train steps on the batch `fetch()` returns, with its data wait.

    The wait runs from `start` (float64 `[]`; default: now) until every shard of
    the batch is there. `term_norms` as `_train_step`, for the first step (the
    others go without). The outputs of the steps are folded as `_Packed` says;
    `steps` is `reuse`.

    Returns:
      `(packer, packed, keys)`: the `_Packed` (`packer`, or one made from this
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
      shards = tf.nest.map_structure(tf.identity, shards)
      results = self._train_step(shards, term_norms)
    results['data_wait_seconds'] = ready - start
    results['steps'] = tf.constant(1, tf.int32)
    if packer is None:
      packer = _Packed(results)
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

  def _train_step(self, shards, term_norms=None, reuse_index=None):
    """One step on a distributed batch; `term_norms` (default: the config's
    `loss_term_grad_norms`) adds the per-term gradient norms; `reuse_index`
    (int32 `[]`, optional) is added to the batch's `reuse`."""
    if term_norms is None:
      term_norms = self._config.loss_term_grad_norms
    results = self._strategy.run(self._replica_step,
                                 args=(shards, term_norms, reuse_index))
    results = tf.nest.map_structure(
        lambda x: self._strategy.experimental_local_results(x)[0], results)
    self.learner_steps.assign_add(1)
    self.consumed_frames.assign_add(tf.cast(results['fresh_frames'], tf.int64))
    self.replayed_frames.assign_add(tf.cast(results['replayed_frames'], tf.int64))
    self.trained_frames.assign_add(tf.cast(results['trained_frames'], tf.int64))
    skipped = results['nonfinite'] > 0
    self.nonfinite_updates.assign_add(tf.cast(skipped, tf.int64))
    streak = self.nonfinite_streak.assign(
        tf.where(skipped, self.nonfinite_streak + 1, tf.zeros([], tf.int64)))
    results['nonfinite_streak'] = tf.cast(streak, tf.float32)
    return results

  def _replica_step(self, batch, term_norms, reuse_index=None):
    if reuse_index is not None:
      batch = dict(batch, reuse=batch['reuse'] + reuse_index)
    # Built in the strategy's replica thread, which does not see the caller's
    # control dependencies: the step's ops wait for the batch here (see
    # `_timed_step`).
    with tf.control_dependencies([tf.group(tf.nest.flatten(batch))]):
      return self._replica_step_on(batch, term_norms)

  def _replica_step_on(self, batch, term_norms):
    c = self._config
    ctx = tf.distribute.get_replica_context()
    variables = self.network.trainable_variables
    popart = self.network.popart
    if self._jit_gradients is not None:  # One replica: nothing to reduce mid-step.
      grads, diags, lag_max, popart_stats = self._jit_gradients[term_norms](batch)
    else:
      grads, diags, lag_max, popart_stats = self._gradients(
          batch, term_norms, lambda x: ctx.all_reduce(_SUM, x))
    if term_norms:
      term_grads, diags = ctx.all_reduce(_SUM, (grads, diags))
      grads = [_sum_in_order(terms) for terms in zip(*term_grads)]
      for name, g in zip(('policy', 'baseline', 'entropy'), term_grads):
        diags[f'grad_norm_{name}'] = tf.linalg.global_norm(g)
    else:
      grads, diags = ctx.all_reduce(_SUM, (grads, diags))
    diags['policy_lag_max'] = tf.reduce_max(
        ctx.all_gather(tf.reshape(lag_max, [1]), axis=0))
    grad_norm = tf.linalg.global_norm(grads)
    # A non-finite loss or gradient (e.g. a too-high learning rate) skips the
    # update: weights and slots stay as they are. The values are all-reduced, so
    # every replica takes the same branch.
    finite = tf.logical_and(tf.math.is_finite(grad_norm),
                            tf.math.is_finite(diags['loss']))
    if popart is not None:
      diags.update(self._popart_apply(ctx, popart, *popart_stats, finite))
    if c.grad_clip > 0:
      grads, _ = tf.clip_by_global_norm(grads, c.grad_clip, use_norm=grad_norm)
      diags['grad_clipped'] = tf.cast(grad_norm > c.grad_clip, tf.float32)
    else:
      diags['grad_clipped'] = tf.zeros([], tf.float32)
    self.optimizer.apply_gradients(zip(grads, variables), condition=finite)
    diags['nonfinite'] = 1.0 - tf.cast(finite, tf.float32)
    diags['grad_norm'] = grad_norm
    diags['entropy_cost'] = tf.cast(self._entropy_cost(self.consumed_frames),
                                    tf.float32)
    return diags

  def _gradients(self, batch, term_norms, reduce):
    """This replica's gradient and diagnostics, before the all-reduce.

    Args:
      batch: this replica's shard, `[B / N, T + 1, ...]` (see `data`).
      term_norms: bool; True returns the three weighted loss terms' gradients.
      reduce: sums a structure of tensors over the replicas (the identity for
        one replica, which lets the whole function compile with XLA).

    Returns:
      `(grads, diags, lag_max, popart_stats)`: grads, a list of float tensors in
      `trainable_variables` order (with `term_norms`, three such lists: policy,
      baseline, entropy); diags, a dict of float32 `[]` sums of this shard
      (`losses.compute_loss`'s, the frame counts and the policy-lag sum);
      lag_max, float32 `[]`, the shard's largest policy lag;
      popart_stats, None without PopArt, else `(new_stats, old_mu, old_sigma)`
      for `_popart_apply`.
    """
    c = self._config
    obs = _time_major(batch['observation'])
    reward = _time_major(batch['reward'])
    terminated = _time_major(batch['terminated'])
    truncated = _time_major(batch['truncated'])
    first = _time_major(batch['first'])
    prev_action = _time_major(batch['prev_action'])
    action = _time_major(batch['action'])
    behaviour_logits = _time_major(batch['behaviour_logits'])
    state = tuple(batch[f'core_state_{i}'] for i in range(self._num_state))
    entropy_cost = self._entropy_cost(self.consumed_frames)
    variables = self.network.trainable_variables
    popart = self.network.popart
    discounts = c.discounting * (1.0 - tf.cast(terminated[1:], tf.float32))
    mask = tf.logical_not(tf.logical_or(terminated[:-1], truncated[:-1]))
    num_valid = tf.reduce_sum(tf.cast(mask, tf.float32))
    if c.loss_reduction == 'mean':  # The whole batch's count, on every replica.
      normalizer = tf.maximum(reduce(num_valid), 1.0)
    else:
      normalizer = 1.0
    if popart is not None:  # The statistics the forward pass uses.
      old_mu = tf.identity(popart.mu)
      old_sigma = popart.sigma_of(old_mu, tf.identity(popart.nu))  # float64
    with tf.GradientTape(persistent=term_norms) as tape:
      out, _ = self.network.unroll(
          types.AgentInput(obs, prev_action, reward, first), state)
      values = out.baseline
      loss_args = dict(
          target_logits=out.policy_logits[:-1],
          values=values[:-1],
          bootstrap_value=values[-1],
          actions=action[:-1],
          behaviour_logits=behaviour_logits[:-1],
          rewards=clip_rewards(reward[1:] * c.reward_scale, c.reward_clipping),
          discounts=discounts,
          mask=mask,
          clip_rho_threshold=c.clip_rho_threshold,
          clip_pg_rho_threshold=c.clip_pg_rho_threshold,
          lambda_=c.vtrace_lambda,
          use_vtrace=c.vtrace)
      targets = losses.compute_targets(**loss_args)
      scale = 1.0
      if popart is not None:
        new_stats = self._popart_statistics(reduce, popart, targets.vs, mask)
        scale = tf.cast(popart.sigma_of(new_stats[0], new_stats[1],
                                        new_stats[3])[0], tf.float32)
      policy_advantages = None
      if c.normalize_advantages:  # Moments of the whole batch, on every replica.
        moments = reduce(list(losses.advantage_moments(targets.pg_advantages,
                                                       mask)))
        policy_advantages = losses.normalize_advantages(
            targets.pg_advantages, mask, moments)
      loss, diags = losses.compute_loss(
          baseline_cost=c.baseline_cost, entropy_cost=entropy_cost,
          value_scale=scale, normalizer=normalizer, targets=targets,
          policy_advantages=policy_advantages, ppo_clip=c.ppo_clip,
          **loss_args)
      terms = (diags['policy_loss'], c.baseline_cost * diags['baseline_loss'],
               tf.cast(entropy_cost, tf.float32) * diags['entropy_loss'])
    # PopArt: the loss above is that of the rescaled head (new statistics), but
    # the tape saw the head before the rescale; its gradient differs from the
    # rescaled head's by old_sigma / new_sigma (the torso's is already exact).
    head = {v.ref() for v in (self.network.baseline_head.w,
                              self.network.baseline_head.b)}

    def fix_head(grads):
      if popart is None:
        return grads
      factor = scale / tf.cast(old_sigma[0], tf.float32)
      return [g * factor if v.ref() in head and g is not None else g
              for g, v in zip(grads, variables)]

    def dense(grads):
      return [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables)]

    if term_norms:
      term_grads = [dense(fix_head(tape.gradient(t, variables))) for t in terms]
      del tape
    else:
      grads = dense(fix_head(tape.gradient(loss, variables)))
    # Per-step bookkeeping, summed over replicas with the gradients.
    first_use = tf.equal(batch['reuse'], 0)
    replayed = batch['replayed']
    count = lambda m: tf.reduce_sum(tf.cast(m, tf.float32)) * self._frames_per_unroll
    lag = tf.cast(self.learner_steps - batch['policy_version'], tf.float32)
    extra = {
        'fresh_frames': count(first_use & ~replayed),
        'replayed_frames': count(first_use & replayed),
        'trained_frames': count(tf.ones_like(replayed)),
        'policy_lag_sum': tf.reduce_sum(lag),
        'num_unrolls': tf.cast(tf.size(lag), tf.float32),
    }
    diags = dict(diags, **extra)
    popart_stats = None if popart is None else (new_stats, old_mu, old_sigma)
    return (term_grads if term_norms else grads), diags, tf.reduce_max(lag), \
        popart_stats

  def _popart_statistics(self, reduce, popart, vs, mask):
    """PopArt's statistics after this batch (nothing assigned yet).

    Args:
      reduce: sums a list of tensors over the replicas.
      popart: the network's `PopArt`.
      vs: float32 `[T, B]`, this replica's V-trace targets (return units).
      mask: bool `[T, B]`, the valid steps.

    Returns:
      `(mu, nu, updates, peak)` as `PopArt.updated` gives them, from the moments of the
      targets of the whole batch (all-reduced: every replica gets the same); the
      old statistics when the batch has no valid step.
    """
    vs = tf.cast(vs, tf.float64)  # Sums of squares of targets near 1e5.
    zeros = tf.zeros_like(vs)
    moments = [tf.reduce_sum(tf.where(mask, vs, zeros)),
               tf.reduce_sum(tf.where(mask, tf.square(vs), zeros)),
               tf.reduce_sum(tf.cast(mask, tf.float64))]
    total, total_sq, n = reduce(moments)
    safe_n = tf.maximum(n, 1.0)
    new = popart.updated(tf.reshape(total / safe_n, [1]),
                         tf.reshape(total_sq / safe_n, [1]),
                         self._config.popart_beta)
    any_valid = n > 0
    return tuple(tf.where(any_valid, x, old) for x, old in zip(
        new, (popart.mu, popart.nu, popart.updates, popart.peak)))

  def _popart_apply(self, ctx, popart, new_stats, old_mu, old_sigma, finite):
    """Assigns the new statistics and rescales the value head to preserve it.

    Nothing changes when `finite` is False (the update is skipped). Runs on every
    replica with identical values; the assignments go through a merge_call, so
    every mirror gets them before the optimizer applies the gradients.

    Returns:
      dict of float32 `[]`: `popart_mu`, `popart_sigma` (task 0, after the update)
      and `popart_replica_spread`, the largest difference between this worker's
      replicas in the statistics and the rescaled value head each computed (0 on
      one replica; the mirrors all get the first replica's).
    """
    mu, nu, updates, peak = [tf.where(finite, new, old) for new, old in zip(
        new_stats, (popart.mu, popart.nu, popart.updates, popart.peak))]
    sigma = popart.sigma_of(mu, nu, peak)
    head = self.network.baseline_head
    w, b = popart.preserve(head.w, head.b, old_mu, old_sigma, mu, sigma)
    targets = (popart.mu, popart.nu, popart.updates, popart.peak, head.w, head.b)

    def assign_all(strategy, *values):
      spread = tf.constant(0.0, tf.float64)
      for var, value in zip(targets, values):
        # The first replica's value on every mirror: the values agree in exact
        # arithmetic, and taking one makes the mirrors equal by construction
        # (they are a few floats; the copy is free). What each replica computed
        # is kept as the spread, so a replica that computed apart shows.
        results = [tf.cast(r, tf.float64)
                   for r in strategy.experimental_local_results(value)]
        for other in results[1:]:
          spread = tf.maximum(spread, tf.reduce_max(tf.abs(other - results[0])))
        value = strategy.experimental_local_results(value)[0]
        strategy.extended.update(var, lambda v, x: v.assign(x), args=(value,),
                                 group=False)
      return spread

    spread = ctx.merge_call(assign_all, args=(mu, nu, updates, peak, w, b))
    return {'popart_mu': tf.cast(mu[0], tf.float32),
            'popart_sigma': tf.cast(sigma[0], tf.float32),
            'popart_replica_spread': tf.cast(spread, tf.float32)}
