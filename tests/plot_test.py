"""Tests of impala_tf/plot.py: `python -m impala_tf.plot DIR [DIR ...]`."""

import json
import re
import shlex
import sys

import imageio.v3 as iio
import numpy as np
import pytest

from impala_tf import plot

import helpers

REPO = helpers.REPO
PROG = 'impala_tf.plot'
_PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'


def _write_run(directory, config, returns, frames_per_line=1000,
               seconds_per_line=360.0):
  """A run directory: config.json and a metrics.jsonl with one line per return."""
  directory.mkdir(parents=True)
  (directory / 'config.json').write_text(json.dumps(config))
  with open(directory / 'metrics.jsonl', 'w', encoding='utf-8') as f:
    for i, ret in enumerate(returns):
      f.write(json.dumps({'env_frames': (i + 1) * frames_per_line,
                          'wall_seconds': (i + 1) * seconds_per_line,
                          'episodes': 10 * (i + 1),
                          'episode_return_mean': ret}) + '\n')
  return str(directory)


_CONFIG = {'env': 'CartPole-v1', 'learning_rate': 0.001, 'seed': 1,
           'logdir': '/tmp/a', 'target_return': 475.0,
           'mlp_hidden_sizes': [64, 64]}


@pytest.fixture
def runs(tmp_path):
  """Two seeds of one set of flags and one run with another learning rate."""
  seed1 = _write_run(tmp_path / 'lr1e-3_seed1', _CONFIG,
                     [None, 20.0, 100.0, 300.0, 500.0])
  seed2 = _write_run(tmp_path / 'lr1e-3_seed2', dict(_CONFIG, seed=2,
                                                      logdir='/tmp/b'),
                     [10.0, 30.0, 200.0, 400.0])
  other = _write_run(tmp_path / 'lr1e-2', dict(_CONFIG, learning_rate=0.01),
                     [15.0, 25.0, 35.0], frames_per_line=2000)
  return seed1, seed2, other


def _png_shape(path):
  with open(path, 'rb') as f:
    assert f.read(8) == _PNG_SIGNATURE
  return iio.imread(path).shape


def test_plot_groups_seeds_and_summarises_the_numbers(runs, tmp_path):
  seed1, seed2, other = runs
  out = str(tmp_path / 'curve.png')
  s = plot.plot([seed1, seed2, other], out)
  assert _png_shape(out)[:2] == (400, 700)  # 7x4 inches at 100 dpi.
  assert s['output'] == out and s['x'] == 'frames'
  assert s['title'] == 'CartPole-v1, 6k env frames'
  assert s['random'] == plot.RANDOM_SCORES['CartPole-v1']
  assert s['target'] == 475.0  # The runs' shared --target_return.
  by_path = {r['path']: r for r in s['runs']}
  r1 = by_path[seed1]
  # The first line has no return yet: 4 points, from 2,000 frames.
  assert (r1['points'], r1['first_return_mean'], r1['last_return_mean'],
          r1['best_return_mean']) == (4, 20.0, 500.0, 500.0)
  assert (r1['env_frames'], r1['wall_hours'], r1['episodes']) == (5000, 0.5, 50)
  assert r1['best_env_frames'] == 5000
  assert by_path[other]['env_frames'] == 6000
  # The shared target (475) is first reached by seed1's last line; never by seed2.
  assert r1['target_reached'] == {'env_frames': 5000, 'wall_hours': 0.5,
                                  'return_mean': 500.0}
  assert by_path[seed2]['target_reached'] is None
  assert r1['fps_median'] is None and r1['evals'] == []
  # Two lines: the two seeds (one line, a band) and the other learning rate,
  # named by the flag in which they differ.
  assert [l['label'] for l in s['lines']] == [
      'learning_rate=0.001 (2 seeds)', 'learning_rate=0.01']
  seeds_line = s['lines'][0]
  assert seeds_line['runs'] == [seed1, seed2]
  assert seeds_line['last_return_mean'] == 450.0
  assert (seeds_line['last_return_min'], seeds_line['last_return_max']) == (
      400.0, 500.0)
  assert r1['label'] == by_path[seed2]['label'] == 'learning_rate=0.001 (2 seeds)'


def _write_metrics(path, returns):
  """A bare metrics file (no config.json beside it), one line per 1,000 frames."""
  with open(path, 'w', encoding='utf-8') as f:
    for i, ret in enumerate(returns):
      f.write(json.dumps({'env_frames': (i + 1) * 1000,
                          'episode_return_mean': ret}) + '\n')
  return str(path)


def test_group_patterns_are_one_line_each_before_the_arguments(runs, tmp_path):
  seed1, seed2, other = runs
  b1 = _write_metrics(tmp_path / 'm_b_s1.jsonl', [-20.0, -10.0, 0.0])
  b2 = _write_metrics(tmp_path / 'm_b_s2.jsonl', [-21.0, -15.0, 10.0, 12.0])
  _write_metrics(tmp_path / 'm_c.jsonl', [5.0])  # Matched by neither pattern.
  bare = str(tmp_path / 'm_b_s*.jsonl')
  # Run directories whose flags differ (two learning rates) are one line when a
  # pattern groups them.
  dirs = str(tmp_path / 'lr1e-*')
  out = str(tmp_path / 'g.png')
  s = plot.plot([seed2], out, group=[bare, dirs], env='CartPole-v1')
  assert [l['label'] for l in s['lines']] == [
      f'{bare} (2 runs)', f'{dirs} (3 runs)', 'lr1e-3_seed2']
  assert [l['runs'] for l in s['lines']] == [[b1, b2], [other, seed1, seed2],
                                             [seed2]]
  assert s['lines'][0]['last_return_mean'] == 6.0  # (0 + 12) / 2.
  assert (s['lines'][0]['last_return_min'], s['lines'][0]['last_return_max']) == (
      0.0, 12.0)
  assert s['lines'][1]['last_return_mean'] == pytest.approx((35 + 500 + 400) / 3)
  assert [r['path'] for r in s['runs']] == [b1, b2, other, seed1, seed2, seed2]
  assert _png_shape(out)[:2] == (400, 700)
  # Only patterns; labels name the lines in the same order.
  s = plot.plot([], out, group=[bare], labels=['setup B'])
  assert [l['label'] for l in s['lines']] == ['setup B']
  assert [r['label'] for r in s['runs']] == ['setup B', 'setup B']
  with pytest.raises(plot.PlotError, match=r'--label: 1 given for 2 lines'):
    plot.plot([], out, group=[bare, dirs], labels=['setup B'])
  # Comma-separated patterns and paths are one line; a run matched twice counts
  # once.
  both = f'{b2},{tmp_path / "m_c.jsonl"},{bare}'
  s = plot.plot([], out, group=[both], labels=['three'])
  assert s['lines'][0]['runs'] == [b2, str(tmp_path / 'm_c.jsonl'), b1]
  missing = str(tmp_path / 'nothing_*.jsonl')
  with pytest.raises(plot.PlotError) as e:
    plot.plot([seed1], out, group=[f'{bare},{missing}'])
  assert str(e.value) == (f'--group={bare},{missing}: {missing} matches no run '
                          'directory or metrics.jsonl')
  with pytest.raises(plot.PlotError, match='give at least one run directory'):
    plot.plot([], out)


def test_eleven_lines_and_marks_do_not_share_a_style(tmp_path, monkeypatch):
  """Past matplotlib's 10 colours a line is dashed, not a copy of the first."""
  import matplotlib.axes  # pylint: disable=g-import-not-at-top
  drawn = {}
  real_plot = matplotlib.axes.Axes.plot

  def recording_plot(self, *args, **kwargs):
    (line,) = real_plot(self, *args, **kwargs)
    drawn[kwargs.get('label')] = (line.get_color(), line.get_linestyle())
    return [line]

  monkeypatch.setattr(matplotlib.axes.Axes, 'plot', recording_plot)
  paths = [_write_run(tmp_path / f'lr{k}', dict(_CONFIG, learning_rate=k + 1.0),
                      [1.0, 2.0]) for k in range(11)]
  s = plot.plot(paths, str(tmp_path / 'many.png'), marks=['1000:5:ref'])
  styles = [(l['color'], l['linestyle']) for l in s['lines']]
  assert styles[0] == ('C0', '-') and styles[10] == ('C0', '--')
  assert len(set(styles)) == 11
  # What was drawn is what the summary says, in matplotlib's own notation.
  for line in s['lines']:
    assert drawn[line['label']] == (line['color'], line['linestyle'])
  # The mark takes the colour after the lines' (C1), not the first line's.
  assert drawn['ref'][0] == 'C1'
  assert [plot.line_style(k) for k in (9, 10, 20, 30, 40)] == [
      ('C9', '-'), ('C0', '--'), ('C0', '-.'), ('C0', ':'), ('C0', '-')]


def test_summary_reads_fps_evals_and_the_first_line_at_the_target(tmp_path):
  path = tmp_path / 'run'
  path.mkdir()
  lines = [
      {'env_frames': 100, 'wall_seconds': 36.0, 'fps': 10.0},
      {'env_frames': 200, 'wall_seconds': 72.0, 'fps': 30.0,
       'episode_return_mean': 5.0},
      {'env_frames': 250, 'eval_return_mean': 9.5, 'eval_episodes': 2},
      {'env_frames': 300, 'wall_seconds': 108.0, 'fps': 20.0,
       'episode_return_mean': 8.0},
      {'env_frames': 400, 'wall_seconds': 144.0, 'fps': 40.0,
       'episode_return_mean': 7.0},
  ]
  (path / 'metrics.jsonl').write_text(''.join(json.dumps(l) + '\n' for l in lines))
  out = str(tmp_path / 'c.png')
  r = plot.plot([str(path)], out, target=7.5, env='Pong')['runs'][0]
  assert r['fps_median'] == 25.0  # Median of 10, 30, 20, 40.
  assert r['evals'] == [[250, 9.5]]
  assert (r['best_return_mean'], r['best_env_frames']) == (8.0, 300)
  # The first line at or above 7.5 (300 frames), not the best or the last.
  assert r['target_reached'] == {'env_frames': 300, 'wall_hours': 0.03,
                                 'return_mean': 8.0}
  reached = plot.plot([str(path)], out, target=8.0)['runs'][0]['target_reached']
  assert reached['env_frames'] == 300  # Equal to the target counts.
  assert plot.plot([str(path)], out, target=8.5)['runs'][0]['target_reached'] is None
  assert plot.plot([str(path)], out)['runs'][0]['target_reached'] is None
  # --at: the return when the run reached each frame count (its first point at
  # or past it; none past the last point).
  r = plot.plot([str(path)], out, at=['250', 400, '1e9', 50, 300])['runs'][0]
  assert r['returns_at'] == {'250': 8.0, '400': 7.0, '1000000000': None,
                             '50': 5.0, '300': 8.0}
  assert 'returns_at' not in plot.plot([str(path)], out)['runs'][0]
  for bad in ('x', '-1', 'nan', 'inf', '1.5'):
    with pytest.raises(
        plot.PlotError,
        match=rf'^--at={bad}: must be a whole number of env frames >= 0, e.g. 15e6$'):
      plot.plot([str(path)], out, at=[bad])


def test_band_is_mean_min_max_over_the_common_range(runs):
  seed1, seed2, _ = runs
  group = [plot.read_run(seed1), plot.read_run(seed2)]
  xs, mean, low, high = plot._band(group, 'frames')
  # seed1 has returns at 2k-5k frames, seed2 at 1k-4k: the common range is 2k-4k.
  assert (xs[0], xs[-1]) == (2000.0, 4000.0)
  np.testing.assert_allclose([mean[0], low[0], high[0]], [25.0, 20.0, 30.0])
  np.testing.assert_allclose([mean[-1], low[-1], high[-1]], [350.0, 300.0, 400.0])


def test_hours_axis_random_and_target_flags(runs, tmp_path):
  _, _, other = runs
  out = str(tmp_path / 'hours.png')
  s = plot.plot([other], out, x='hours', random='-3.5', target=30.0,
                title='mine', labels=['lr 0.01'])
  assert _png_shape(out)[:2] == (400, 700)
  assert (s['x'], s['random'], s['target'], s['title']) == ('hours', -3.5, 30.0,
                                                            'mine')
  assert s['lines'][0]['label'] == 'lr 0.01'
  assert plot.plot([other], out, random='none')['random'] is None
  with pytest.raises(plot.PlotError, match=r"--random=x: must be 'auto', 'none'"):
    plot.plot([other], out, random='x')
  with pytest.raises(plot.PlotError, match='--label: 2 given for 1 lines'):
    plot.plot([other], out, labels=['a', 'b'])


def test_marks_are_drawn_and_summarised(runs, tmp_path):
  _, _, other = runs
  out = str(tmp_path / 'marks.png')
  s = plot.plot([other], out, marks=['20e6:18:RLlib tuned IMPALA', '5:-1.5: x:y '])
  assert s['marks'] == [
      {'frames': 20e6, 'return': 18.0, 'text': 'RLlib tuned IMPALA'},
      {'frames': 5.0, 'return': -1.5, 'text': 'x:y'}]
  assert _png_shape(out)[:2] == (400, 700)
  assert plot.plot([other], out)['marks'] == []
  for bad in ('20e6:18', '20e6:18: ', 'a:18:x', '20e6:b:x', '-1:0:x', 'inf:0:x',
              '1:nan:x'):
    with pytest.raises(plot.PlotError, match=f'^--mark={re.escape(bad)}: '):
      plot.plot([other], out, marks=[bad])
  with pytest.raises(plot.PlotError, match='needs --x=frames'):
    plot.plot([other], out, x='hours', marks=['1:1:x'])


def test_legend_outside_widens_the_figure_and_bad_values_are_one_error(runs,
                                                                        tmp_path):
  _, _, other = runs
  out = str(tmp_path / 'outside.png')
  plot.plot([other], out, marks=['20e6:18:RLlib tuned IMPALA'], legend='outside')
  assert _png_shape(out)[:2] == (450, 1000)
  # Thirty references do not fit in 4.5 inches: the figure grows to hold them.
  marks = [f'{k}e5:{k - 20}:reference {k}' for k in range(1, 31)]
  plot.plot([other], out, marks=marks, legend='outside')
  height, width = _png_shape(out)[:2]
  assert width == 1000
  assert height >= 100 * (plot.OUTSIDE_LEGEND_PAD_IN +
                          plot.OUTSIDE_LEGEND_ENTRY_IN * 31) - 1
  with pytest.raises(plot.PlotError,
                     match='^--legend=left: must be one of inside, outside$'):
    plot.plot([other], out, legend='left')


def test_random_scores_by_game_name():
  assert plot._random_score('PongNoFrameskip-v4') == -20.7
  assert plot._random_score('ALE/Pong-v5') == -20.7
  assert plot._random_score('BreakoutNoFrameskip-v4') == 1.7
  assert plot._random_score('CartPole-v1') == 22.2
  assert plot._random_score('MountainCar-v0') is None
  assert plot._random_score(None) is None


def test_read_errors(tmp_path):
  with pytest.raises(plot.PlotError, match='no such run directory'):
    plot.read_run(str(tmp_path / 'missing'))
  with pytest.raises(plot.PlotError, match='has no metrics.jsonl'):
    plot.read_run(str(tmp_path))
  _write_run(tmp_path / 'early', _CONFIG, [None, None])
  with pytest.raises(plot.PlotError, match='has no episode_return_mean yet'):
    plot.read_run(str(tmp_path / 'early'))


def _python(args, extra_path=None):
  return helpers.run_python(['-m', PROG, *args], extra_path=extra_path)


@pytest.mark.e2e
def test_cli_two_logdirs_write_a_png_and_print_the_summary(runs, tmp_path):
  seed1, _, other = runs
  out = tmp_path / 'two.png'
  result = _python([seed1, other, f'--output={out}', '--at=3e3', '--at=6000'])
  assert result.returncode == 0, result.stderr[-3000:]
  s = json.loads(result.stdout.strip().splitlines()[-1])
  assert s['output'] == str(out) and _png_shape(out)[:2] == (400, 700)
  assert [r['path'] for r in s['runs']] == [seed1, other]
  assert [r['returns_at'] for r in s['runs']] == [
      {'3000': 100.0, '6000': None}, {'3000': 25.0, '6000': 35.0}]
  assert [l['label'] for l in s['lines']] == ['learning_rate=0.001',
                                             'learning_rate=0.01']


def test_outside_legend_height_is_whole_pixels_under_truncation_and_rounding():
  """Matplotlib releases truncate or round inches x dpi; both give one height."""
  for entries in range(1, 200):
    inches = plot.OUTSIDE_LEGEND_PAD_IN + plot.OUTSIDE_LEGEND_ENTRY_IN * entries
    height = plot._whole_pixels(inches) * plot.DPI
    assert int(height) == round(height) == round(inches * plot.DPI), entries
  # The case that differed: 38 entries, 7.82 inches (781.99... pixels).
  assert int((plot.OUTSIDE_LEGEND_PAD_IN + plot.OUTSIDE_LEGEND_ENTRY_IN * 38)
             * plot.DPI) == 781
  assert int(plot._whole_pixels(0.6 + 0.19 * 38) * plot.DPI) == 782


@pytest.mark.e2e
def test_cli_errors_are_one_line_exit_2(runs, tmp_path):
  seed1, _, _ = runs
  blocker = tmp_path / 'blocker'
  blocker.mkdir()
  (blocker / 'matplotlib.py').write_text(
      "raise ImportError('No module named matplotlib')\n")
  cases = [
      ([f'--output={tmp_path / "x.png"}'], 'give one or more run directories', None),
      ([seed1], '--output is required', None),
      ([str(tmp_path / 'missing'), f'--output={tmp_path / "x.png"}'],
       'no such run directory', None),
      ([seed1, '--x=steps', f'--output={tmp_path / "x.png"}'], '--x=steps', None),
      ([seed1, '--at=soon', f'--output={tmp_path / "x.png"}'],
       '--at=soon: must be a whole number of env frames >= 0', None),
      ([f'--group={tmp_path / "none_*"}', f'--output={tmp_path / "x.png"}'],
       f'--group={tmp_path / "none_*"}: {tmp_path / "none_*"} matches no run '
       'directory', None),
      ([seed1, f'--output={tmp_path / "x.png"}'],
       "needs matplotlib (the plot extra): pip install 'impala_tf[plot]'",
       str(blocker)),
  ]
  for args, message, extra_path in cases:
    result = _python(args, extra_path)
    assert result.returncode == 2, (args, result.stdout, result.stderr[-2000:])
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, (args, result.stderr)
    assert lines[0].startswith(f'{PROG}: error: ') and message in lines[0], lines[0]
    assert result.stdout == ''
  assert not (tmp_path / 'x.png').exists()


@pytest.mark.e2e
def test_docs_images_are_drawn_by_impala_tf_plot(tmp_path):
  """Each image in docs/ is named in a doc next to the `impala_tf.plot` command
  that draws it; the command runs and draws an image of the same size."""
  docs = REPO / 'docs'
  images = sorted(p.name for p in docs.glob('*.png'))
  assert images, 'docs/ has no images'
  text = '\n'.join(p.read_text(encoding='utf-8') for p in docs.glob('*.md'))
  for image in images:
    match = re.search(r'`python -m impala_tf\.plot ([^`]*--output=docs/'
                      + re.escape(image) + r'[^`]*)`', text)
    assert match, f'docs/{image}: no `python -m impala_tf.plot ...` command in docs/'
    args = shlex.split(match.group(1))
    out = tmp_path / image
    args = [f'--output={out}' if a.startswith('--output=') else a for a in args]
    result = _python(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _png_shape(out) == _png_shape(docs / image)


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
