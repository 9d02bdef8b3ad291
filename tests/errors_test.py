"""Tests of impala_tf.errors: one-line error text."""

import sys

import pytest

from impala_tf import errors


def test_one_line_collapses_newlines_and_runs_of_whitespace():
  error = ValueError('bad value\n  at step 3\t(env 1)\n')
  assert errors.one_line(error) == 'bad value at step 3 (env 1)'


def test_one_line_keeps_a_text_of_exactly_the_limit():
  assert errors.one_line('x' * 300) == 'x' * 300
  assert errors.one_line('abcdef', limit=6) == 'abcdef'


def test_one_line_cuts_at_the_limit_with_the_marker():
  assert errors.LIMIT == 300 and errors.MARKER == '...'
  assert errors.one_line('x' * 301) == 'x' * 297 + '...'
  assert errors.one_line('abc\ndefgh', limit=6) == 'abc...'


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))


def test_no_limit_keeps_the_whole_text_on_one_line():
  assert errors.one_line('a\n  b' + 'c' * 400, limit=None) == 'a b' + 'c' * 400
