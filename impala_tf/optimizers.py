"""Optimizers and schedules for the learner, without Keras.

Two optimizers, both plain `tf.Module`s so they work whichever Keras is installed:

* `RMSProp`: the optimizer of the IMPALA paper and scalable_agent, with the semantics
  of TF1's `tf.compat.v1.train.RMSPropOptimizer` (non-centered):

      ms  <- decay * ms + (1 - decay) * g**2          (ms starts at 1.0, not 0)
      mom <- momentum * mom + lr * g / sqrt(ms + epsilon)   (epsilon inside the root)
      w   <- w - mom

  The `mom` slot exists only when `momentum > 0`; with `momentum == 0` the update is
  `w <- w - lr * g / sqrt(ms + epsilon)`, which is the same thing without the
  (always zero) momentum state.
  With `style='torch'` it is PyTorch's `torch.optim.RMSprop` (TorchBeast's) instead:
  `ms` starts at 0 and `mom <- momentum * mom + lr * g / (sqrt(ms) + epsilon)`
  (epsilon outside the root).
* `Adam`: Kingma & Ba (2015) with bias correction, in the "efficient" form of their
  section 2 (the form of TF1's `AdamOptimizer` and of Keras): epsilon is added to
  `sqrt(v)` *after* the bias correction has been folded into the step size:

      m <- beta1 * m + (1 - beta1) * g                (m, v start at 0)
      v <- beta2 * v + (1 - beta2) * g**2
      lr_t = lr * sqrt(1 - beta2**t) / (1 - beta1**t)   (t = 1 on the first step)
      w <- w - lr_t * m / (sqrt(v) + epsilon)

Protocol shared by both:

1. `opt.build(variables)` creates the slots and the int64 `iterations` counter. With a
   `tf.distribute` strategy it must run under `strategy.scope()` (the slots then are
   mirrored like the weights). Slots are tracked attributes, so
   `tf.train.Checkpoint(optimizer=opt)` saves and restores them; they are stored in the
   order of `variables`, so build with the same variable list (same order) before
   restoring. Without a strategy, `apply_gradients` builds lazily on first use.
2. `opt.apply_gradients(grads_and_vars)` applies one update and increments
   `iterations` exactly once. It works eagerly, inside `tf.function`, and inside
   `strategy.run(...)` in a `MirroredStrategy` replica context. In the replica case
   the gradients must already be all-reduced (identical on every replica, e.g. with
   `tf.distribute.get_replica_context().all_reduce(SUM, grads)`); the optimizer does
   not reduce them. It uses `merge_call` and `strategy.extended.update(...)`, so each
   device updates its own copy of every weight and slot, and the learning rate and
   step counter are evaluated once per apply. `None` gradients are skipped.
   `apply_gradients(..., condition=c)` with a bool `[]` tensor applies the update only
   where `c` is True (in the graph, with `tf.cond`): when False, the weights, slots
   and `iterations` are left as they are (the learner skips non-finite updates so).

Schedules (`make_schedule`) map a position in environment frames to a float32 value;
a callable learning rate is re-evaluated at every `apply_gradients`.
"""

from typing import Callable, Iterable, Sequence, Tuple, Union

import tensorflow as tf

LearningRate = Union[float, Callable[[], tf.Tensor]]


def make_schedule(base_value: float, spec, total_frames: int
                  ) -> Callable[[tf.Tensor], tf.Tensor]:
  """Builds a schedule: a function of the position in environment frames.

  Args:
    base_value: float, the value at frame 0 for 'constant' and 'linear'. Ignored for
      piecewise points, whose values are absolute.
    spec: what `config.parse_schedule` returns: 'constant'; 'linear' (linear decay
      from `base_value` at frame 0 to 0 at `total_frames`, clamped at 0 after); or a
      non-empty sequence of `(frames, value)` pairs with increasing frames
      (piecewise-linear interpolation between the points, the first/last value held
      constant before/after them).
    total_frames: int > 0, the frames of the run (used by 'linear').

  Returns:
    `schedule(position)`: maps a numeric scalar (Python number or tensor of any real
    dtype, env frames) to a float32 `[]` tensor. Works eagerly and in `tf.function`.

  Raises:
    ValueError: for an unknown spec, or 'linear' with `total_frames <= 0`.
  """
  base_value = float(base_value)
  if isinstance(spec, str):
    if spec == 'constant':
      def constant(position):
        del position
        return tf.constant(base_value, tf.float32)
      return constant
    if spec == 'linear':
      if total_frames <= 0:
        raise ValueError(f'total_frames={total_frames}: must be > 0 for a linear '
                         'schedule')
      total = float(total_frames)

      def linear(position):
        x = tf.cast(position, tf.float64)
        frac = tf.maximum(1.0 - x / total, 0.0)
        return tf.cast(base_value * frac, tf.float32)
      return linear
    raise ValueError(f"schedule spec {spec!r}: must be 'constant', 'linear' or a "
                     'sequence of (frames, value) points')

  points = [(float(f), float(v)) for f, v in spec]
  if not points:
    raise ValueError('schedule points: must not be empty')
  frames = [f for f, _ in points]
  if any(b <= a for a, b in zip(frames, frames[1:])):
    raise ValueError(f'schedule points {points}: frames must increase')
  if len(points) == 1:
    only = points[0][1]
    return lambda position: tf.constant(only, tf.float32)
  xs = tf.constant(frames, tf.float64)
  ys = tf.constant([v for _, v in points], tf.float64)
  n = len(points)

  def piecewise(position):
    x = tf.clip_by_value(tf.cast(position, tf.float64), xs[0], xs[-1])
    # Index of the segment [xs[i], xs[i + 1]] holding x.
    i = tf.searchsorted(xs, tf.reshape(x, [1]), side='right')[0] - 1
    i = tf.clip_by_value(i, 0, n - 2)
    x0, x1 = tf.gather(xs, i), tf.gather(xs, i + 1)
    y0, y1 = tf.gather(ys, i), tf.gather(ys, i + 1)
    return tf.cast(y0 + (y1 - y0) * (x - x0) / (x1 - x0), tf.float32)
  return piecewise


class _VarIndex(dict):
  """var.ref() -> slot index. A dict subclass, so tf.Module does not track it."""


class _Optimizer(tf.Module):
  """Slot bookkeeping and the distribution protocol shared by the optimizers.

  Subclasses define `_slot_specs()` -> sequence of (name, initial value float) and
  `_update(var, grad, slots, hyper)` applied per device, plus `_hyper()` computed
  once per apply in cross-replica context.
  """

  def __init__(self, learning_rate: LearningRate, name: str):
    super().__init__(name=name)
    if not callable(learning_rate):
      learning_rate = float(learning_rate)
    self._learning_rate = learning_rate
    self._index = _VarIndex()  # var.ref() -> index into the slot lists.
    self.iterations = None  # int64 `[]` variable, created by build().
    self._built = False

  @property
  def built(self) -> bool:
    return self._built

  def learning_rate(self) -> tf.Tensor:
    """The current learning rate, float32 `[]` (calls the schedule if callable)."""
    lr = self._learning_rate
    value = lr() if callable(lr) else lr
    return tf.cast(value, tf.float32)

  def _slot_specs(self) -> Sequence[Tuple[str, float]]:
    raise NotImplementedError

  def _hyper(self) -> dict:
    raise NotImplementedError

  def _update(self, var, grad, slots, hyper):
    raise NotImplementedError

  def build(self, variables: Iterable[tf.Variable]) -> None:
    """Creates the `iterations` counter and one set of slots per variable.

    Call it under `strategy.scope()` when a strategy is used. Calling it again with
    more variables adds slots for the new ones only.

    Args:
      variables: the trainable variables (any float dtype and shape), in a fixed
        order: checkpoints store slots by position.
    """
    strategy = tf.distribute.get_strategy()
    with tf.init_scope():
      if self.iterations is None:
        self.iterations = tf.Variable(
            0, dtype=tf.int64, trainable=False, name='iterations',
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        for slot_name, _ in self._slot_specs():
          setattr(self, '_' + slot_name, [])
      for var in variables:
        if var.ref() in self._index:
          continue
        self._index[var.ref()] = len(self._index)
        base = var.name.split(':')[0].replace('/', '_')
        with strategy.extended.colocate_vars_with(var):
          for slot_name, init in self._slot_specs():
            slot = tf.Variable(
                tf.fill(var.shape, tf.constant(init, var.dtype)), trainable=False,
                name=f'{base}_{slot_name}')
            getattr(self, '_' + slot_name).append(slot)
    self._built = True

  def _slots_for(self, var) -> Tuple[tf.Variable, ...]:
    try:
      i = self._index[var.ref()]
    except KeyError:
      raise ValueError(f'variable {var.name} was not passed to build()') from None
    return tuple(getattr(self, '_' + name)[i] for name, _ in self._slot_specs())

  def apply_gradients(self, grads_and_vars, condition=None) -> None:
    """Applies one update and increments `iterations` once.

    Args:
      grads_and_vars: iterable of `(gradient, variable)`; a gradient is a tensor (or
        `tf.IndexedSlices`, densified) of the variable's shape and dtype, or None
        (that variable is skipped). In a replica context the gradients must be
        identical on every replica (already all-reduced).
      condition: optional bool `[]` tensor (identical on every replica); when it is
        False nothing changes: no weight, slot or `iterations` update.

    Raises:
      RuntimeError: when called in a replica context of a strategy before `build`.
      ValueError: for a variable that was not built.
    """
    grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
    strategy = tf.distribute.get_strategy()
    if not self._built:
      if tf.distribute.has_strategy():
        raise RuntimeError(
            f'{self.name}: call build(variables) under strategy.scope() before '
            'apply_gradients')
      self.build([v for _, v in grads_and_vars])
    if tf.distribute.in_cross_replica_context():
      # Under strategy.scope() but outside strategy.run: gradients are plain tensors.
      self._distributed_apply(strategy, grads_and_vars, condition)
      return
    tf.distribute.get_replica_context().merge_call(
        self._distributed_apply, args=(grads_and_vars, condition))

  def _distributed_apply(self, strategy, grads_and_vars, condition=None):
    """Runs in cross-replica context: one hyper evaluation, per-device updates."""
    if condition is None:
      self._apply_all(strategy, grads_and_vars)
      return
    # Identical on every replica (computed from all-reduced values): take the first.
    condition = strategy.experimental_local_results(condition)[0]

    def apply():
      self._apply_all(strategy, grads_and_vars)
      return tf.constant(True)

    tf.cond(condition, apply, lambda: tf.constant(False))

  def _apply_all(self, strategy, grads_and_vars):
    hyper = self._hyper()
    for grad, var in grads_and_vars:
      slots = self._slots_for(var)
      strategy.extended.update(
          var, self._update_dense, args=(grad, slots, hyper), group=False)
    self.iterations.assign_add(1)

  def _update_dense(self, var, grad, slots, hyper):
    if isinstance(grad, tf.IndexedSlices):
      grad = tf.convert_to_tensor(grad)
    grad = tf.cast(grad, var.dtype)
    hyper = {k: tf.cast(v, var.dtype) for k, v in hyper.items()}
    return self._update(var, grad, slots, hyper)


class RMSProp(_Optimizer):
  """RMSProp with TF1 `RMSPropOptimizer` semantics (the IMPALA paper's optimizer).

  Or PyTorch's with `style='torch'`. See the module docstring for the update.
  Slots: `ms` (initialised to 1.0, 0.0 for torch) for every variable, and `mom`
  (initialised to 0.0) only when `momentum > 0`.
  """

  def __init__(self, learning_rate: LearningRate, decay: float = 0.99,
               momentum: float = 0.0, epsilon: float = 0.01, style: str = 'tf1',
               name: str = 'RMSProp'):
    """Creates the optimizer (no variables until `build`).

    Args:
      learning_rate: float, or a zero-argument callable returning a float32 `[]`
        tensor, evaluated once at every `apply_gradients`.
      decay: float in [0, 1), the discount of the squared-gradient average.
      momentum: float in [0, 1).
      epsilon: float > 0, added to `ms` inside the square root (tf1) or to
        its root (torch).
      style: 'tf1' (ms from 1, epsilon inside the root) or 'torch' (ms from 0,
        epsilon outside).
      name: module name.

    Raises:
      ValueError: for another `style`.
    """
    super().__init__(learning_rate, name)
    if style not in ('tf1', 'torch'):
      raise ValueError(f"style={style!r}: must be 'tf1' or 'torch'")
    self.style = style
    self.decay = float(decay)
    self.momentum = float(momentum)
    self.epsilon = float(epsilon)

  def _slot_specs(self):
    ms = (('ms', 1.0 if self.style == 'tf1' else 0.0),)
    return ms + ((('mom', 0.0),) if self.momentum > 0 else ())

  def _hyper(self):
    return {'lr': self.learning_rate()}

  def _update(self, var, grad, slots, hyper):
    ms = slots[0]
    new_ms = self.decay * ms + (1.0 - self.decay) * tf.square(grad)
    ms.assign(new_ms)
    if self.style == 'tf1':
      step = hyper['lr'] * grad * tf.math.rsqrt(new_ms + self.epsilon)
    else:
      step = hyper['lr'] * grad / (tf.sqrt(new_ms) + self.epsilon)
    if self.momentum > 0:
      mom = slots[1]
      step = self.momentum * mom + step
      mom.assign(step)
    return var.assign_sub(step)


class Adam(_Optimizer):
  """Adam (Kingma & Ba) with bias correction; epsilon added to sqrt(v).

  See the module docstring for the exact update. Slots: `m`, `v` (both from 0).
  """

  def __init__(self, learning_rate: LearningRate, beta1: float = 0.9,
               beta2: float = 0.999, epsilon: float = 1e-7, name: str = 'Adam'):
    """Creates the optimizer (no variables until `build`).

    Args:
      learning_rate: float, or a zero-argument callable returning a float32 `[]`
        tensor, evaluated once at every `apply_gradients`.
      beta1: float in [0, 1), decay of the first moment.
      beta2: float in [0, 1), decay of the second moment.
      epsilon: float > 0, added to `sqrt(v)` (not bias-corrected `v`).
      name: module name.
    """
    super().__init__(learning_rate, name)
    self.beta1 = float(beta1)
    self.beta2 = float(beta2)
    self.epsilon = float(epsilon)

  def _slot_specs(self):
    return (('m', 0.0), ('v', 0.0))

  def _hyper(self):
    t = tf.cast(self.iterations + 1, tf.float32)
    lr_t = (self.learning_rate() * tf.sqrt(1.0 - tf.pow(self.beta2, t)) /
            (1.0 - tf.pow(self.beta1, t)))
    return {'lr_t': lr_t}

  def _update(self, var, grad, slots, hyper):
    m, v = slots
    new_m = self.beta1 * m + (1.0 - self.beta1) * grad
    new_v = self.beta2 * v + (1.0 - self.beta2) * tf.square(grad)
    m.assign(new_m)
    v.assign(new_v)
    return var.assign_sub(hyper['lr_t'] * new_m / (tf.sqrt(new_v) + self.epsilon))


def make_optimizer(config, learning_rate: LearningRate) -> _Optimizer:
  """Builds the optimizer a `Config` names (not yet built: call `build`).

  Args:
    config: an `impala_tf.config.Config`; reads `optimizer` ('rmsprop' or 'adam'),
      `rmsprop_decay`, `rmsprop_momentum`, `rmsprop_epsilon`, `rmsprop_style`,
      `adam_beta1`,
      `adam_beta2`, `adam_epsilon`.
    learning_rate: float, or a zero-argument callable returning a float32 `[]`
      tensor (e.g. a schedule bound to the frame counter).

  Returns:
    An `RMSProp` or `Adam`.

  Raises:
    ValueError: for an unknown `config.optimizer`.
  """
  if config.optimizer == 'rmsprop':
    return RMSProp(learning_rate, decay=config.rmsprop_decay,
                   momentum=config.rmsprop_momentum, epsilon=config.rmsprop_epsilon,
                   style=config.rmsprop_style)
  if config.optimizer == 'adam':
    return Adam(learning_rate, beta1=config.adam_beta1, beta2=config.adam_beta2,
                epsilon=config.adam_epsilon)
  raise ValueError(f'optimizer={config.optimizer}: must be rmsprop or adam')
