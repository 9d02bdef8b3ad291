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
An update is skipped the same way when a replica's shard is empty: the
distributed iterator gives a learner worker whose data ended empty shards, and
the other workers' data alone is not the batch the run asked for (the workers'
agreement then stops the run naming that worker).

With PopArt (`config.popart`) each step first computes the V-trace targets with the
current statistics, moves the statistics towards the targets' moments over the whole
batch (all-reduced), rescales the value head so its outputs in return units are
preserved, and then takes the gradient of the losses normalised by the new sigma
(docs/design.md, "Value scale"). With `normalize_advantages` the policy term's
advantages are normalised over the whole batch the same way.

The learning-rate and entropy-cost schedules are functions of `consumed_frames`, the
fresh env frames the learner has trained on (counted once per batch, at its first
use), which is checkpointed with the rest.

`Learner` is the step; its parts live in their own modules: one replica's loss
and gradient in `impala_tf.gradients`, PopArt's update in `impala_tf.popart`, and
the steps of one `step_from_iterator` call with their packed outputs in
`impala_tf.step_outputs`.
"""

import functools
from typing import Callable, Dict, Optional

import tensorflow as tf

from impala_tf import config as config_lib
from impala_tf import gradients as gradients_lib
from impala_tf import optimizers
from impala_tf import popart as popart_lib
from impala_tf import step_outputs

_SUM = tf.distribute.ReduceOp.SUM


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


def reuse_in_call(config: config_lib.Config) -> int:
  """Steps `Learner.step_from_iterator` should make on each batch it fetches.

  `config.num_sgd_iter` when the reuse ring is one batch (the learner reuses it,
  and the dataset must emit each batch once: build it with `num_sgd_iter=1`);
  1 with a larger ring, which tf.data replays (`data.build_dataset`).
  """
  return config.num_sgd_iter if config.minibatch_buffer_size == 1 else 1


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
    self._train = tf.function(
        lambda shards: self._train_step(self._prepare(shards)), autograph=False)
    # Fetching the batch inside the same tf.function saves the distributed
    # iterator's Python overhead (~1.5 ms per step on 2 CPU cores, a third of a
    # CartPole step).
    self._call_steps = step_outputs.CallSteps(
        self._train_step, self._prepare, strategy,
        config.learner_steps_per_call, self.network.variables,
        self._read_weights_fn)
    self._bound_iterator = None
    self._bound_train = {}  # term_norms -> (concrete function, its output keys).
    self._bound_reuse = None
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
      `empty_shards` (the replicas whose shard was empty: the update was
      skipped, as for `nonfinite`, but the streak is not counted),
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
          lambda: self._call_steps(iterator, reuse, term_norms),
          autograph=False).get_concrete_function()
      self._bound_train[term_norms] = (fn, self._call_steps.unpack.keys)
    fn, keys = self._bound_train[term_norms]
    return self._call_steps.unpack(fn(), keys)

  def _prepare(self, shards):
    """A distributed batch -> the same, each shard `gradients.prepare_shard`'s
    (time-major, the observations scaled): once per batch, however many steps
    reuse it."""
    return self._strategy.run(
        functools.partial(gradients_lib.prepare_shard, self.network),
        args=(shards,))

  def _train_step(self, shards, term_norms=None, reuse_index=None):
    """One step on a prepared distributed batch (`_prepare`); `term_norms`
    (default: the config's `loss_term_grad_norms`) adds the per-term gradient
    norms; `reuse_index` (int32 `[]`, optional) is added to the batch's
    `reuse`."""
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
    # `step_outputs.CallSteps`).
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
      grads = [gradients_lib.sum_in_order(terms) for terms in zip(*term_grads)]
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
    # A replica with an empty shard (a worker whose data ended) skips it too: the
    # rest of the batch is not the batch the run asked for.
    apply = tf.logical_and(finite, tf.equal(diags['empty_shards'], 0.0))
    if popart is not None:
      diags.update(popart_lib.apply_update(
          ctx, popart, self.network.baseline_head, *popart_stats, apply))
    if c.grad_clip > 0:
      grads, _ = tf.clip_by_global_norm(grads, c.grad_clip, use_norm=grad_norm)
      diags['grad_clipped'] = tf.cast(grad_norm > c.grad_clip, tf.float32)
    else:
      diags['grad_clipped'] = tf.zeros([], tf.float32)
    self.optimizer.apply_gradients(zip(grads, variables), condition=apply)
    diags['nonfinite'] = 1.0 - tf.cast(finite, tf.float32)
    diags['grad_norm'] = grad_norm
    diags['entropy_cost'] = tf.cast(self._entropy_cost(self.consumed_frames),
                                    tf.float32)
    return diags

  def _gradients(self, batch, term_norms, reduce):
    """`gradients.shard_gradients` of this learner's network on `batch`."""
    return gradients_lib.shard_gradients(
        self.network, self._config, batch, term_norms, reduce,
        entropy_cost=self._entropy_cost(self.consumed_frames),
        learner_steps=self.learner_steps,
        frames_per_unroll=self._frames_per_unroll, num_state=self._num_state)
