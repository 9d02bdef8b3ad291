"""Tests of the bench/ scripts' arithmetic: the figures docs/ quotes come from it.

The scripts run as `python bench/NAME.py` (bench/ on sys.path, so they import each
other by name); here they are loaded from their files the same way. Each function
is checked against a hand computation: rates over a metrics window, the seed
syntax and its errors, a curve's frames to target and drops, the stability
summary, the soak's memory slope, the dead-unit count and the V-trace reference
the V-trace benchmark times against the package's op. The scripts' main paths take
minutes and are not run; instead every `module.attribute` they use of impala_tf's
modules (and of each other) is checked to exist, read from their source.
"""

import ast
import importlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

_BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      'bench')


def _load(name):
  """Imports bench/NAME.py as the scripts see each other (bench/ on sys.path)."""
  if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
  spec = importlib.util.spec_from_file_location(
      f'bench_{name}', os.path.join(_BENCH, f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _line(wall, env, trained, steps, **more):
  return dict(wall_seconds=wall, env_frames=env, trained_frames=trained,
              learner_steps=steps, **more)


def test_window_rates_are_counter_differences_over_wall_time():
  window = _load('metrics_window')
  first = _line(10.0, 1_000, 4_000, 50)
  last = _line(30.0, 141_000, 564_000, 925)
  # (141000 - 1000) / 20 = 7000; (564000 - 4000) / 20 = 28000; 875 / 20 = 43.75.
  assert window.window_rates(first, last) == {
      'env_fps': 7000, 'learner_fps': 28000, 'learner_steps_per_sec': 43.75,
      'window_seconds': 20.0}
  assert window.window_rates(first, last, steps_decimals=1)[
      'learner_steps_per_sec'] == 43.8
  with pytest.raises(ValueError, match='must be later than the first'):
    window.window_rates(last, first)
  with pytest.raises(ValueError, match='must be later than the first'):
    window.window_rates(first, first)


def test_mean_of_skips_lines_without_the_key():
  window = _load('metrics_window')
  lines = [{'w': 0.1}, {'w': None}, {}, {'w': 0.4}]
  assert window.mean_of(lines, 'w') == 0.25
  assert window.mean_of([{'w': 1}, {'w': 2}, {'w': 2}], 'w', 2) == 1.67
  assert window.mean_of([{}, {'w': None}], 'w') is None


@pytest.mark.parametrize('spec, seeds', [
    ('0-4,7', [0, 1, 2, 3, 4, 7]),
    ('3', [3]),
    (' 2 , 5-6 ,', [2, 5, 6]),
    ('4-4', [4]),
])
def test_parse_seeds(spec, seeds):
  assert _load('stability').parse_seeds(spec) == seeds


@pytest.mark.parametrize('spec, message', [
    ('3-1', "--seeds=3-1: the range 3-1 is empty"),
    ('1,x', "--seeds=1,x: 'x' is neither a seed nor a range"),
    ('1-2-3', "--seeds=1-2-3: '1-2-3' is neither a seed nor a range"),
    (',', '--seeds=,: no seeds'),
])
def test_parse_seeds_names_the_flag_and_the_bad_part(spec, message):
  with pytest.raises(ValueError) as info:
    _load('stability').parse_seeds(spec)
  assert str(info.value).startswith(message)


@pytest.mark.parametrize('script', ['stability', 'time_to_target'])
def test_a_bad_seed_list_is_one_line_before_any_run(script, tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(_BENCH, f'{script}.py'), '--seeds=5-2',
       f'--output={tmp_path / "out.json"}'] if script == 'stability' else
      [sys.executable, os.path.join(_BENCH, f'{script}.py'), '--seeds=5-2'],
      capture_output=True, text=True, timeout=60, check=False)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1] == (
      f'{script}.py: error: --seeds=5-2: the range 5-2 is empty (LO > HI)')
  assert 'Traceback' not in proc.stderr
  assert not (tmp_path / 'out.json').exists()


def _metrics_file(path, returns, frames_per_line=1000):
  """A bare metrics file: one line per return, 360 s apart."""
  with open(path, 'w', encoding='utf-8') as f:
    for i, ret in enumerate(returns):
      f.write(json.dumps({'env_frames': (i + 1) * frames_per_line,
                          'wall_seconds': (i + 1) * 360.0,
                          'episode_return_mean': ret}) + '\n')
  return str(path)


def test_setups_counts_runs_at_the_target_within_the_frames(tmp_path):
  setups = _load('setups')
  a = _metrics_file(tmp_path / 'a_s1.jsonl', [-20.0, 5.0, 18.5, 17.0])  # 3,000.
  b = _metrics_file(tmp_path / 'a_s2.jsonl', [-20.0, -10.0, 0.0, 12.0, 19.0])
  c = _metrics_file(tmp_path / 'a_s3.jsonl', [-21.0, -20.0])  # Stopped at 2,000.
  runs = [setups.plot.read_run(p) for p in (a, b, c)]
  s = setups.summarize('A', runs, 18.0, within=4000, at=[2000, 4000])
  assert (s['name'], s['runs'], s['reached']) == ('A', 3, 1)
  assert [(r['path'], r['target_env_frames'], r['target_wall_hours'])
          for r in s['per_run']] == [(a, 3000, 0.3), (b, None, None),
                                     (c, None, None)]  # b: at 5,000, too late.
  assert [r['returns_at'] for r in s['per_run']] == [
      {'2000': 5.0, '4000': 17.0}, {'2000': -10.0, '4000': 12.0},
      {'2000': -20.0, '4000': None}]
  assert s['mean_at'] == {'2000': pytest.approx(-25.0 / 3), '4000': 14.5}
  assert [r['best_return_mean'] for r in s['per_run']] == [18.5, 19.0, -20.0]
  assert [r['env_frames'] for r in s['per_run']] == [4000, 5000, 2000]
  anytime = setups.summarize('A', runs, 18.0, at=[9000])
  assert anytime['reached'] == 2 and anytime['mean_at'] == {'9000': None}
  proc = subprocess.run(
      [sys.executable, os.path.join(_BENCH, 'setups.py'), '--target=18',
       f'--setup=A={tmp_path / "a_s*.jsonl"}', f'--setup=B={c},{a}',
       '--within=4e3', '--at=2000'],
      capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout)
  assert (out['target'], out['within'], out['at']) == (18.0, 4000, [2000])
  assert [(x['name'], x['runs'], x['reached']) for x in out['setups']] == [
      ('A', 3, 1), ('B', 2, 1)]
  assert [r['path'] for r in out['setups'][1]['per_run']] == [c, a]


@pytest.mark.parametrize('args,message', [
    (['--setup=A'], '--setup=A: must be NAME=PATTERN[,PATTERN...]'),
    (['--setup=A=nothing_*'],
     '--setup=A=nothing_*: nothing_* matches no run directory or metrics.jsonl'),
    (['--setup=A=x', '--within=soon'],
     '--within=soon: must be a whole number of env frames >= 0, e.g. 15e6'),
    (['--setup=A=x', '--at=-5'],
     '--at=-5: must be a whole number of env frames >= 0, e.g. 15e6'),
])
def test_setups_bad_arguments_are_one_line(args, message, tmp_path):
  proc = subprocess.run(
      [sys.executable, os.path.join(_BENCH, 'setups.py'), '--target=18', *args],
      capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [f'setups.py: error: {message}']
  assert proc.stdout == ''


def test_curve_statistics_counts_each_fall_below_drop_once():
  stability = _load('stability')
  returns = [None, 100.0, 480.0, 290.0, 250.0, 310.0, 280.0, 500.0]
  frames = [0, 10, 20, 30, 40, 50, 60, 70]
  # First >= 475 at frame 20; after it the lowest is 250; the mean falls below 300
  # at 290 (one fall through 250), comes back at 310, falls again at 280: 2.
  assert stability.curve_statistics(returns, frames, 475.0, 300.0) == {
      'frames_to_target': 20, 'lowest_after_target': 250.0, 'drops_below': 2}
  assert stability.curve_statistics(returns, frames, 475.0, None) == {
      'frames_to_target': 20, 'lowest_after_target': 250.0, 'drops_below': 0}
  assert stability.curve_statistics([None, 100.0], [0, 10], 475.0, 300.0) == {
      'frames_to_target': None, 'lowest_after_target': None, 'drops_below': None}


def test_summarize_counts_per_seed_and_over_all_runs():
  stability = _load('stability')
  args = type('Args', (), dict(target=475.0, eval_target=490.0))
  seed = lambda final, greedy, frames, lowest, drops, held: dict(
      final_return_mean=final, greedy_eval_mean=greedy, frames_to_target=frames,
      lowest_after_target=lowest, drops_below=drops, held=held)
  results = [
      seed(500.0, 500.0, 30_000, 480.0, 0, True),
      seed(476.0, 480.0, 50_000, 250.0, 1, False),
      seed(120.0, 90.0, None, None, None, False),
      {'seed': 3, 'returncode': 1, 'error': ['boom']},
  ]
  summary = stability.summarize(results, args)
  assert summary == {
      'ended_solved': '2/4', 'greedy_passed': '1/4', 'never_dropped': '1/4',
      'held': '1/4', 'reached_target': '2/4',
      'median_frames_to_target': 40_000, 'max_frames_to_target': 50_000,
      'min_lowest_after_target': 250.0, 'min_final_return_mean': 120.0,
      'min_greedy_eval_mean': 90.0, 'failed_runs': 1}


def test_soak_slope_is_the_least_squares_fit_in_mb_per_hour():
  soak = _load('soak')
  # 5 MB more every 1,800 s, with noise that cancels in the fit: 10 MB/hour.
  samples = [{'t': 1800.0 * k, 'rss_mb': 100.0 + 5.0 * k + (0.5 if k % 2 else -0.5)}
             for k in range(4)]
  ts = np.array([s['t'] for s in samples])
  ys = np.array([s['rss_mb'] for s in samples])
  expected = np.polyfit(ts, ys, 1)[0] * 3600.0
  assert soak.slope_per_hour(samples) == pytest.approx(expected)
  assert soak.slope_per_hour(samples[:1]) is None
  assert soak.slope_per_hour([{'t': 5.0, 'rss_mb': 1.0}] * 2) is None


def test_a_unit_is_dead_when_its_preactivation_never_exceeds_zero():
  dead_units = _load('dead_units')
  z = np.array([[[0.5, 0.0, -1.0], [0.2, -3.0, -2.0]],
                [[-0.1, -0.5, -1.0], [0.0, -0.1, 1e-6]]], np.float32)  # [2, 2, 3]
  counts = dead_units.dead_counts({'conv': z})
  # Unit 0 fires (0.5), unit 1 never > 0 (0.0 at most), unit 2 fires (1e-6).
  assert counts['conv']['units'] == 3
  assert counts['conv']['dead'] == 1
  assert counts['conv']['dead_fraction'] == round(1 / 3, 4)
  assert counts['conv']['preactivation_std'] == round(float(z.std()), 4)


def test_the_vtrace_benchmarks_numpy_reference_matches_the_op():
  vtrace_bench = _load('vtrace_bench')
  from impala_tf import vtrace  # pylint: disable=g-import-not-at-top
  inputs = vtrace_bench.make_inputs(5, 3, seed=1)
  vs_np, pg_np = vtrace_bench.numpy_vtrace(*inputs)
  out = vtrace.from_importance_weights(*inputs)
  np.testing.assert_allclose(vs_np, out.vs.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(pg_np, out.pg_advantages.numpy(), rtol=1e-5,
                             atol=1e-5)



def test_cpu_kernels_reads_the_cpu_flags_line():
  bench = _load('cpu_kernels')
  cpuinfo = ('processor\t: 0\nmodel name\t: AMD EPYC\n'
             'flags\t\t: fpu sse2 avx fma avx2 avx512f avx512_bf16 rdrand\n')
  assert bench.cpu_flags(cpuinfo) == ['avx2', 'fma', 'avx512f', 'avx512_bf16']
  assert bench.cpu_flags('flags\t: fpu sse2\n') == []
  assert bench.cpu_flags('model name\t: x\n') == []


def test_cpu_kernels_counts_the_shallow_torsos_multiply_adds():
  bench = _load('cpu_kernels')
  macs = bench.layer_macs(2)
  # 84x84x4 -> conv 8x8/4 -> 20x20x16 -> conv 4x4/2 -> 9x9x32 -> fc 2592 -> 256.
  assert macs['conv1'] == 2 * 400 * 256 * 16 == macs['conv1_filter_grad']
  assert macs['conv2'] == 2 * 81 * 256 * 32 == macs['conv2_input_grad']
  assert macs['fc'] == 2 * 2592 * 256
  assert macs['torso_forward_backward'] == (2 * 400 * 256 * 16 * 2
                                            + 2 * 81 * 256 * 32 * 3
                                            + 2 * 2592 * 256 * 3)
  row = lambda ms: {'ms_cpu': ms}
  out = bench.summary({'conv1': row(30.0), 'fc': row(2.0)},
                      {'conv1': row(4.0), 'fc': row(2.5)})
  assert out['conv1']['off_over_on'] == 7.5
  assert out['fc']['off_over_on'] == 0.8
  assert out['conv1']['off'] == row(30.0)


def _module_references(source, local_modules):
  """`(line, alias, module, attribute)` for each `alias.attribute` in `source`
  whose alias names an imported module: one of impala_tf's
  (`from impala_tf import x [as y]`) or a script beside it (`import metrics_window`).

  Scopes as Python has them, simplified: a function sees the module's imports and
  its own (nested functions included), less the names it assigns or takes as
  arguments, so a local variable that shadows a module is not read as the module.
  """
  tree = ast.parse(source)

  def imports(nodes):
    bound = {}
    for node in nodes:
      if (isinstance(node, ast.ImportFrom) and node.module == 'impala_tf'
          and not node.level):
        bound.update({a.asname or a.name: 'impala_tf.' + a.name for a in node.names})
      elif isinstance(node, ast.Import):
        bound.update({a.asname or a.name: a.name for a in node.names
                      if a.name in local_modules})
    return bound

  def scope(nodes, inherited, arguments=()):
    assigned = {n.id for n in nodes
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound = {k: v for k, v in inherited.items()
             if k not in assigned and k not in arguments}
    bound.update(imports(nodes))
    return bound, {(n.lineno, n.value.id, bound[n.value.id], n.attr)
                   for n in nodes if isinstance(n, ast.Attribute)
                   and isinstance(n.value, ast.Name) and n.value.id in bound}

  module_nodes = [n for stmt in tree.body
                  if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef))
                  for n in ast.walk(stmt)]
  top, found = scope(module_nodes, {})
  for fn in ast.walk(tree):
    if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
      arguments = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
      found |= scope(list(ast.walk(fn)), top, arguments)[1]
  return sorted(found)


def test_module_references_follow_imports_and_shadowing():
  source = (
      'import metrics_window\n'
      'from impala_tf import environments as envs, vtrace\n'
      'def f(vtrace):\n'
      '  return vtrace.anything, envs.env_kwargs, metrics_window.rates\n'
      'def g():\n'
      '  from impala_tf import checkpoints\n'
      '  envs = 3\n'
      '  return checkpoints.env_kwargs, envs.real\n')
  assert _module_references(source, {'metrics_window'}) == [
      (4, 'envs', 'impala_tf.environments', 'env_kwargs'),
      (4, 'metrics_window', 'metrics_window', 'rates'),
      (8, 'checkpoints', 'impala_tf.checkpoints', 'env_kwargs'),
  ]


def test_every_module_attribute_a_bench_script_uses_exists():
  # The suite does not run the scripts' main paths (minutes each); this catches
  # what once broke bench/throughput.py: a function that moved to another module.
  scripts = sorted(f for f in os.listdir(_BENCH) if f.endswith('.py'))
  local = {f[:-3] for f in scripts}
  if _BENCH not in sys.path:
    sys.path.insert(0, _BENCH)
  missing, checked = [], 0
  for script in scripts:
    with open(os.path.join(_BENCH, script)) as f:
      references = _module_references(f.read(), local)
    for line, alias, module, attribute in references:
      checked += 1
      if not hasattr(importlib.import_module(module), attribute):
        missing.append(f'bench/{script}:{line}: {alias}.{attribute} '
                       f'({module} has no {attribute})')
  assert not missing, '\n'.join(missing)
  assert checked > 40  # The scripts do use the package (49 references today).


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
