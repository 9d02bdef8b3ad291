"""Test helper: the loss functions called with one flat dict of inputs.

The loss tests build their inputs as one dict (`target_logits=..., mask=...,
baseline_cost=..., lambda_=...`); `compute_loss(**d)` and `compute_targets(**d)`
split it into `losses.Trajectory`, `LossOptions` and `TargetOptions` and call the
functions of `impala_tf.losses` (`tests/losses_test.py`, `tests/learner_test.py`).
"""

from impala_tf import losses


def _split(kwargs, cls):
  return cls(**{k: kwargs.pop(k) for k in cls._fields if k in kwargs})


def compute_targets(**kwargs) -> losses.VTraceTargets:
  """`losses.compute_targets` of the Trajectory and TargetOptions fields."""
  trajectory = _split(kwargs, losses.Trajectory)
  options = _split(kwargs, losses.TargetOptions)
  assert not kwargs, f'not an input of compute_targets: {sorted(kwargs)}'
  return losses.compute_targets(trajectory, options)


def compute_loss(**kwargs) -> losses.LossOutput:
  """`losses.compute_loss` of the Trajectory, LossOptions and TargetOptions fields.

  `targets` and `policy_advantages` are passed as they are.
  """
  trajectory = _split(kwargs, losses.Trajectory)
  options = _split(kwargs, losses.LossOptions)
  target_options = _split(kwargs, losses.TargetOptions)
  extra = {k: kwargs.pop(k) for k in ('targets', 'policy_advantages') if k in kwargs}
  assert not kwargs, f'not an input of compute_loss: {sorted(kwargs)}'
  return losses.compute_loss(trajectory, options, target_options, **extra)
