"""Tests for impala_tf.vtrace against the golden file and an independent numpy loop.

The numpy reference and the golden cases come from
`testdata/generate_vtrace_golden.py` (loaded with importlib). Every case runs eagerly,
in a tf.function (static and unknown shapes) and in TF1 graph mode with placeholders
fed through a Session. The 2-replica MirroredStrategy check runs this file as a
script in a subprocess (`python tests/vtrace_test.py mirrored`), because logical CPU
devices must be configured before TensorFlow initialises; it is started with the
module's first test so that it overlaps the others.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf

from impala_tf import vtrace

import helpers

_REPO = str(helpers.REPO)
_GOLDEN_PATH = os.path.join(_REPO, 'testdata', 'vtrace_golden.npz')


def _load_generator():
  path = os.path.join(_REPO, 'testdata', 'generate_vtrace_golden.py')
  spec = importlib.util.spec_from_file_location('generate_vtrace_golden', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


gen = _load_generator()


def _load_golden():
  """Returns {case name: {field: array}} from testdata/vtrace_golden.npz."""
  with np.load(_GOLDEN_PATH) as data:
    cases = {}
    for name in data['case_names']:
      prefix = f'{name}__'
      cases[str(name)] = {
          key[len(prefix):]: data[key] for key in data.files
          if key.startswith(prefix)
      }
  return cases


GOLDEN = _load_golden()
CASE_NAMES = sorted(GOLDEN)
LOGITS_CASES = [n for n in CASE_NAMES if 'actions' in GOLDEN[n]]
# Batch 1 (one replica gets an empty batch), trailing dims, masking, no clipping,
# T=100, lambda 0.9 and logits; the other cases differ only in numbers.
MIRRORED_CASES = ['b1_t5', 'b2x3x2_t7_trailing_lambda_0.9', 'b5_t100_masked',
                  'b5_t100_noclip', 'b5_t20_logits']
MODES = ('eager', 'function', 'function_unknown_shapes', 'graph_unknown_time',
         'graph_unknown_dims')
_IW_INPUTS = ('log_rhos', 'discounts', 'rewards', 'values', 'bootstrap_value')
_LOGITS_INPUTS = ('behaviour_policy_logits', 'target_policy_logits', 'actions',
                  'discounts', 'rewards', 'values', 'bootstrap_value')


def _options(case):
  """The keyword options (thresholds, lambda_) of a golden case."""
  return dict(
      clip_rho_threshold=gen.decode_threshold(case['clip_rho_threshold']),
      clip_pg_rho_threshold=gen.decode_threshold(case['clip_pg_rho_threshold']),
      lambda_=float(case['lambda_']))


def _evaluate(mode, fn, arrays, **options):
  """Runs fn(**arrays, **options) in `mode`; returns {output field: np.ndarray}.

  Args:
    mode: one of MODES.
    fn: a vtrace function returning a namedtuple.
    arrays: {argument name: np.ndarray}, passed as tensors (or placeholders).
    **options: passed as Python values.
  """
  names = sorted(arrays)
  if mode == 'eager':
    out = fn(**{n: tf.constant(arrays[n]) for n in names}, **options)
    return {k: v.numpy() for k, v in out._asdict().items()}
  if mode.startswith('function'):
    signature = None
    if mode == 'function_unknown_shapes':
      signature = [tf.TensorSpec([None] * arrays[n].ndim, arrays[n].dtype)
                   for n in names]

    @tf.function(input_signature=signature)
    def run(*tensors):
      return dict(fn(**dict(zip(names, tensors)), **options)._asdict())

    out = run(*[tf.constant(arrays[n]) for n in names])
    return {k: v.numpy() for k, v in out.items()}
  assert mode.startswith('graph'), mode
  with tf.Graph().as_default():
    placeholders = {}
    for n in names:
      shape = [None] * arrays[n].ndim
      if mode == 'graph_unknown_time' and arrays[n].ndim:
        shape = list(arrays[n].shape)
        if n != 'bootstrap_value':
          shape[0] = None
      placeholders[n] = tf.compat.v1.placeholder(arrays[n].dtype, shape, name=n)
    out = fn(**placeholders, **options)
    with tf.compat.v1.Session() as sess:
      return sess.run(dict(out._asdict()),
                      {placeholders[n]: arrays[n] for n in names})


def _assert_close(actual, expected, what):
  """float32 results against float64 references, scaled by their magnitude."""
  scale = max(1.0, float(np.max(np.abs(expected))))
  np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=2e-6 * scale,
                             err_msg=what)


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('name', CASE_NAMES)
def test_from_importance_weights_matches_golden_and_reference(name, mode):
  case = GOLDEN[name]
  options = _options(case)
  out = _evaluate(mode, vtrace.from_importance_weights,
                  {k: case[k] for k in _IW_INPUTS}, **options)
  ref_vs, ref_pg = gen.vtrace_reference(*[case[k] for k in _IW_INPUTS], **options)
  for field, ref in (('vs', ref_vs), ('pg_advantages', ref_pg)):
    assert out[field].dtype == np.float32
    assert out[field].shape == case['values'].shape
    assert np.all(np.isfinite(out[field])), field
    _assert_close(out[field], case[field], f'{field} vs golden')
    _assert_close(out[field], ref, f'{field} vs numpy reference')


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('name', LOGITS_CASES)
def test_from_logits_matches_golden_and_reference(name, mode):
  case = GOLDEN[name]
  out = _evaluate(mode, vtrace.from_logits, {k: case[k] for k in _LOGITS_INPUTS},
                  **_options(case))
  target = gen.action_log_probs(case['target_policy_logits'], case['actions'])
  behaviour = gen.action_log_probs(case['behaviour_policy_logits'],
                                   case['actions'])
  _assert_close(out['target_action_log_probs'], target, 'target log-probs')
  _assert_close(out['behaviour_action_log_probs'], behaviour, 'behaviour')
  _assert_close(out['log_rhos'], target - behaviour, 'log_rhos')
  _assert_close(out['vs'], case['vs'], 'vs')
  _assert_close(out['pg_advantages'], case['pg_advantages'], 'pg_advantages')


def test_golden_file_matches_the_reference():
  """The stored outputs are what the generator's reference computes today."""
  rebuilt = gen.build_cases()
  assert sorted(rebuilt) == CASE_NAMES
  for name in CASE_NAMES:
    for field, array in rebuilt[name].items():
      np.testing.assert_allclose(GOLDEN[name][field], array, rtol=1e-12,
                                 err_msg=f'{name}/{field}')


def test_golden_file_covers_the_required_cases():
  shapes = [GOLDEN[n]['values'].shape for n in CASE_NAMES]
  assert {s[1] for s in shapes} >= {1, 5}
  assert {s[0] for s in shapes} >= {5, 100}
  assert any(len(s) > 2 for s in shapes)
  options = {tuple(_options(GOLDEN[n]).values()) for n in CASE_NAMES}
  assert {o[:2] for o in options} >= {(1.0, 1.0), (3.7, 2.2), (None, None)}
  assert {o[2] for o in options} >= {1.0, 0.9}
  assert any(np.isneginf(GOLDEN[n]['log_rhos']).any() for n in CASE_NAMES)


def _random_inputs(num_steps, batch_shape, seed=0):
  rng = np.random.RandomState(seed)
  shape = (num_steps,) + tuple(batch_shape)
  return dict(
      log_rhos=rng.uniform(-2, 2, shape).astype(np.float32),
      discounts=(0.99 * (rng.uniform(size=shape) > 0.05)).astype(np.float32),
      rewards=rng.normal(size=shape).astype(np.float32),
      values=rng.normal(size=shape).astype(np.float32),
      bootstrap_value=rng.normal(size=shape[1:]).astype(np.float32))


@pytest.mark.parametrize('mode', ('eager', 'function_unknown_shapes'))
@pytest.mark.parametrize('num_steps', (1, 2, 3, 64, 65, 300))
def test_any_unroll_length(num_steps, mode):
  """Static and while-loop scans for lengths around powers of two."""
  inputs = _random_inputs(num_steps, (3,), seed=num_steps)
  out = _evaluate(mode, vtrace.from_importance_weights, inputs, lambda_=0.95)
  ref_vs, ref_pg = gen.vtrace_reference(**inputs, lambda_=0.95)
  _assert_close(out['vs'], ref_vs, 'vs')
  _assert_close(out['pg_advantages'], ref_pg, 'pg_advantages')


def _recursive_reference(log_rhos, discounts, rewards, values, bootstrap_value):
  """O(T) float64 backward recursion (clip 1, lambda 1), for long unrolls."""
  log_rhos, discounts, rewards, values, bootstrap_value = (
      np.asarray(x, np.float64)
      for x in (log_rhos, discounts, rewards, values, bootstrap_value))
  rhos = np.minimum(1.0, np.exp(log_rhos))
  vs = np.zeros_like(values)
  v_next, value_next = bootstrap_value, bootstrap_value
  for t in reversed(range(len(values))):
    delta = rhos[t] * (rewards[t] + discounts[t] * value_next - values[t])
    vs[t] = values[t] + delta + discounts[t] * rhos[t] * (v_next - value_next)
    v_next, value_next = vs[t], values[t]
  vs_next = np.concatenate([vs[1:], bootstrap_value[None]])
  return vs, rhos * (rewards + discounts * vs_next - values)


def test_long_unroll_with_underflowing_traces():
  """T=2000, traces of ~1e-13 per step: products underflow to 0, no harm."""
  inputs = _random_inputs(2000, (4,), seed=7)
  inputs['log_rhos'] = np.full_like(inputs['log_rhos'], -30.)
  inputs['log_rhos'][::7] = 0.
  inputs['log_rhos'][500:700] = 0.  # and a long stretch of full traces
  out = _evaluate('function', vtrace.from_importance_weights, inputs)
  ref_vs, ref_pg = _recursive_reference(**inputs)
  _assert_close(out['vs'], ref_vs, 'vs')
  _assert_close(out['pg_advantages'], ref_pg, 'pg_advantages')


@pytest.mark.parametrize('mode', MODES)
def test_masked_steps_give_values_and_zero_advantages(mode):
  inputs = _random_inputs(9, (4, 2), seed=3)
  mask = np.zeros(inputs['log_rhos'].shape, bool)
  mask[::3] = True
  mask[:, 1] = True  # a whole sequence masked
  inputs['log_rhos'][mask] = -np.inf
  for clip in (1.0, None):
    out = _evaluate(mode, vtrace.from_importance_weights, inputs,
                    clip_rho_threshold=clip, clip_pg_rho_threshold=clip)
    for field in ('vs', 'pg_advantages'):
      assert np.all(np.isfinite(out[field])), (field, clip)
    np.testing.assert_array_equal(out['vs'][mask], inputs['values'][mask])
    np.testing.assert_array_equal(out['pg_advantages'][mask], 0.)
    ref_vs, ref_pg = gen.vtrace_reference(**inputs, clip_rho_threshold=clip,
                                          clip_pg_rho_threshold=clip)
    _assert_close(out['vs'], ref_vs, 'vs')
    _assert_close(out['pg_advantages'], ref_pg, 'pg_advantages')


def test_no_gradient_through_targets():
  case = GOLDEN['b5x3_t5_trailing']
  inputs = {k: tf.Variable(case[k]) for k in _IW_INPUTS}
  with tf.GradientTape(persistent=True) as tape:
    out = vtrace.from_importance_weights(**inputs)
    loss = tf.reduce_sum(out.vs) + tf.reduce_sum(out.pg_advantages)
  for name, variable in inputs.items():
    grad = tape.gradient(loss, variable)
    assert grad is None or not np.any(grad.numpy()), name


def test_from_logits_gradients_only_through_log_probs():
  case = GOLDEN[LOGITS_CASES[0]]
  target = tf.Variable(case['target_policy_logits'])
  values = tf.Variable(case['values'])
  with tf.GradientTape(persistent=True) as tape:
    out = vtrace.from_logits(
        case['behaviour_policy_logits'], target, case['actions'],
        case['discounts'], case['rewards'], values, case['bootstrap_value'])
    targets = tf.reduce_sum(out.vs) + tf.reduce_sum(out.pg_advantages)
    log_probs = tf.reduce_sum(out.target_action_log_probs)
  for variable in (target, values):
    grad = tape.gradient(targets, variable)
    assert grad is None or not np.any(grad.numpy())
  assert np.any(tape.gradient(log_probs, target).numpy())


@pytest.mark.parametrize('actions_dtype', (np.int32, np.int64))
def test_log_probs_from_logits_and_actions(actions_dtype):
  rng = np.random.RandomState(0)
  logits = rng.normal(size=(6, 5, 3, 7)).astype(np.float32) * 3
  actions = rng.randint(0, 7, size=(6, 5, 3)).astype(actions_dtype)
  out = vtrace.log_probs_from_logits_and_actions(logits, actions)
  assert out.shape == (6, 5, 3) and out.dtype == tf.float32
  _assert_close(out.numpy(), gen.action_log_probs(logits, actions), 'log_probs')


def test_inputs_are_converted_to_float32():
  inputs = {k: v.astype(np.float64) for k, v in _random_inputs(4, (2,)).items()}
  out = vtrace.from_importance_weights(**inputs)
  assert out.vs.dtype == tf.float32 and out.pg_advantages.dtype == tf.float32
  ref_vs, _ = gen.vtrace_reference(**inputs)
  _assert_close(out.vs.numpy(), ref_vs, 'vs')


def test_float_actions_raise_type_error():
  with pytest.raises(TypeError, match='actions'):
    vtrace.log_probs_from_logits_and_actions(np.zeros((2, 3, 4), np.float32),
                                             np.zeros((2, 3), np.float32))


def test_namedtuple_fields_match_scalable_agent():
  assert vtrace.VTraceReturns._fields == ('vs', 'pg_advantages')
  assert vtrace.VTraceFromLogitsReturns._fields == (
      'vs', 'pg_advantages', 'log_rhos', 'behaviour_action_log_probs',
      'target_action_log_probs')


# Rank errors: one argument at a time gets an extra or a missing dim.


def _iw_arrays(num_steps=4, batch=3):
  return {k: v for k, v in _random_inputs(num_steps, (batch,)).items()}


def _logits_arrays(num_steps=4, batch=3, num_actions=5):
  arrays = _iw_arrays(num_steps, batch)
  del arrays['log_rhos']
  rng = np.random.RandomState(1)
  arrays['behaviour_policy_logits'] = rng.normal(
      size=(num_steps, batch, num_actions)).astype(np.float32)
  arrays['target_policy_logits'] = rng.normal(
      size=(num_steps, batch, num_actions)).astype(np.float32)
  arrays['actions'] = rng.randint(0, num_actions, (num_steps, batch))
  return arrays


def _with_wrong_rank(arrays, name, change):
  arrays = dict(arrays)
  arrays[name] = arrays[name][..., None] if change == 'extra' else arrays[name][0]
  return arrays


@pytest.mark.parametrize('change', ('extra', 'missing'))
@pytest.mark.parametrize('name', _IW_INPUTS)
def test_from_importance_weights_rank_error_names_argument(name, change):
  arrays = _with_wrong_rank(_iw_arrays(), name, change)
  with pytest.raises(ValueError, match=f'^{name} must have rank'):
    vtrace.from_importance_weights(**arrays)


def test_bootstrap_rank_error_message():
  arrays = _iw_arrays()
  arrays['bootstrap_value'] = arrays['values']
  with pytest.raises(ValueError,
                     match=r'bootstrap_value must have rank 1 .* got rank 2'):
    vtrace.from_importance_weights(**arrays)


def test_graph_mode_with_unknown_ranks():
  """Placeholders of unknown rank skip the static checks and still work."""
  case = GOLDEN['b5x3_t5_trailing']
  with tf.Graph().as_default():
    placeholders = {k: tf.compat.v1.placeholder(tf.float32, None, name=k)
                    for k in _IW_INPUTS}
    out = vtrace.from_importance_weights(**placeholders, lambda_=0.9)
    with tf.compat.v1.Session() as sess:
      vs, pg_advantages = sess.run(
          out, {placeholders[k]: case[k] for k in _IW_INPUTS})
  ref_vs, ref_pg = gen.vtrace_reference(*[case[k] for k in _IW_INPUTS],
                                        lambda_=0.9)
  _assert_close(vs, ref_vs, 'vs')
  _assert_close(pg_advantages, ref_pg, 'pg_advantages')


def test_rank_error_in_graph_mode_with_unknown_dims():
  with tf.Graph().as_default():
    args = [tf.compat.v1.placeholder(tf.float32, [None, None]) for _ in range(4)]
    bootstrap = tf.compat.v1.placeholder(tf.float32, [None, None])
    with pytest.raises(ValueError, match='bootstrap_value must have rank 1'):
      vtrace.from_importance_weights(*args, bootstrap)


def test_time_only_inputs_are_rejected():
  arrays = {k: v[:, 0] for k, v in _iw_arrays().items() if k != 'bootstrap_value'}
  with pytest.raises(ValueError, match=r'log_rhos must have rank >= 2'):
    vtrace.from_importance_weights(**arrays, bootstrap_value=np.float32(0.))


@pytest.mark.parametrize('change', ('extra', 'missing'))
@pytest.mark.parametrize('name', _LOGITS_INPUTS)
def test_from_logits_rank_error_names_argument(name, change):
  arrays = _with_wrong_rank(_logits_arrays(), name, change)
  with pytest.raises(ValueError, match=f'^{name} must have rank'):
    vtrace.from_logits(**arrays)


@pytest.mark.parametrize('name', ('policy_logits', 'actions'))
def test_log_probs_rank_error_names_argument(name):
  arrays = {'policy_logits': np.zeros((4, 3, 5), np.float32),
            'actions': np.zeros((4, 3), np.int32)}
  arrays[name] = arrays[name][..., None]
  # With two arguments either may be the wrong one: the message names both.
  with pytest.raises(ValueError, match='^policy_logits must have rank') as info:
    vtrace.log_probs_from_logits_and_actions(**arrays)
  assert name in str(info.value)


def test_time_only_actions_are_rejected():
  with pytest.raises(ValueError, match='^actions must have rank >= 2'):
    vtrace.log_probs_from_logits_and_actions(np.zeros((4, 5), np.float32),
                                             np.zeros((4,), np.int32))


@pytest.mark.parametrize('name', ('clip_rho_threshold', 'clip_pg_rho_threshold',
                                  'lambda_'))
def test_non_scalar_options_raise(name):
  with pytest.raises(ValueError, match=f'^{name} must be a scalar'):
    vtrace.from_importance_weights(**_iw_arrays(), **{name: [1.0, 1.0]})


@pytest.mark.parametrize('name', ('discounts', 'rewards', 'values'))
def test_shape_mismatch_names_argument(name):
  arrays = _iw_arrays()
  arrays[name] = np.zeros((4, 2), np.float32)
  with pytest.raises(ValueError, match=f'^{name} has shape'):
    vtrace.from_importance_weights(**arrays)


def test_bootstrap_shape_mismatch_names_argument():
  arrays = _iw_arrays()
  arrays['bootstrap_value'] = np.zeros((2,), np.float32)
  with pytest.raises(ValueError, match='^bootstrap_value has shape'):
    vtrace.from_importance_weights(**arrays)


_MIRRORED_TEST = 'test_mirrored_strategy_two_replicas_matches_golden'


class _MirroredRun:
  """`python tests/vtrace_test.py mirrored` in a subprocess, output to temp files."""

  def __init__(self):
    env = dict(os.environ, PYTHONPATH=_REPO, TF_CPP_MIN_LOG_LEVEL='2',
               CUDA_VISIBLE_DEVICES='')
    self._stdout = tempfile.TemporaryFile(mode='w+')
    self._stderr = tempfile.TemporaryFile(mode='w+')
    self.process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), 'mirrored'], cwd=_REPO,
        env=env, stdout=self._stdout, stderr=self._stderr, text=True)

  def result(self, timeout=180):
    """Waits; returns (returncode, stdout, stderr)."""
    returncode = self.process.wait(timeout=timeout)
    outputs = []
    for f in (self._stdout, self._stderr):
      f.seek(0)
      outputs.append(f.read())
    return (returncode, *outputs)

  def close(self):
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait()
    self._stdout.close()
    self._stderr.close()


@pytest.fixture(scope='module', autouse=True)
def _mirrored_run(request):
  """Starts the MirroredStrategy subprocess with the module's first test.

  It then runs on the second core while the in-process tests run, and the
  MirroredStrategy test only collects its result. It is started only when that
  test is selected, and not in advance under pytest-xdist (where it may be
  scheduled on another worker).
  """
  selected = any(item.name == _MIRRORED_TEST for item in request.session.items)
  run = None
  if selected and not os.environ.get('PYTEST_XDIST_WORKER'):
    run = _MirroredRun()
  yield run
  if run is not None:
    run.close()


def test_mirrored_strategy_two_replicas_matches_golden(_mirrored_run):
  run = _mirrored_run or _MirroredRun()
  try:
    returncode, stdout, stderr = run.result()
  finally:
    if run is not _mirrored_run:
      run.close()
  assert returncode == 0, stdout[-3000:] + stderr[-3000:]
  report = json.loads(stdout.strip().splitlines()[-1])
  assert report['num_replicas'] == 2
  assert sorted(report['checked']) == sorted(
      MIRRORED_CASES + [f'{n}/from_logits' for n in LOGITS_CASES])


def _mirrored_main():
  """Splits each golden batch over 2 CPU replicas; checks the concatenated result.

  Prints one JSON line {"num_replicas": 2, "checked": [...]}; an AssertionError
  (non-zero exit) on any mismatch.
  """
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  strategy = tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
  num_replicas = strategy.num_replicas_in_sync
  assert num_replicas == 2, num_replicas

  def distribute(arrays):
    """{name: array} -> {name: per-replica values}, batch (axis 1) split."""
    parts = {}
    for name, array in arrays.items():
      axis = 0 if name == 'bootstrap_value' else 1
      split = np.array_split(array, num_replicas, axis=axis)
      parts[name] = strategy.experimental_distribute_values_from_function(
          lambda ctx, s=split: tf.constant(s[ctx.replica_id_in_sync_group]))
    return parts

  def check(fn, arrays, options, case, label):
    names = sorted(arrays)

    @tf.function
    def step(*tensors):
      def replica_fn(*replica_tensors):
        assert tf.distribute.get_replica_context() is not None
        return dict(fn(**dict(zip(names, replica_tensors)), **options)._asdict())
      return strategy.run(replica_fn, args=tensors)

    parts = distribute(arrays)
    out = step(*[parts[n] for n in names])
    for field in ('vs', 'pg_advantages'):
      local = [t.numpy() for t in strategy.experimental_local_results(out[field])]
      _assert_close(np.concatenate(local, axis=1), case[field],
                    f'{label}: {field}')
    return label

  checked = []
  for name in MIRRORED_CASES:
    case = GOLDEN[name]
    checked.append(check(vtrace.from_importance_weights,
                         {k: case[k] for k in _IW_INPUTS}, _options(case), case,
                         name))
    if name in LOGITS_CASES:
      checked.append(check(vtrace.from_logits,
                           {k: case[k] for k in _LOGITS_INPUTS}, _options(case),
                           case, f'{name}/from_logits'))
  print(json.dumps({'num_replicas': num_replicas, 'checked': checked}))


if __name__ == '__main__':
  if sys.argv[1:] == ['mirrored']:
    _mirrored_main()
  else:
    sys.exit(pytest.main([__file__, '-q']))
