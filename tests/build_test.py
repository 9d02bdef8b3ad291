"""Keeps BUILD, the import graph and the repo's commands in agreement.

No TensorFlow import; runs in well under a second.

* `check_build(build_text, repo_root)` compares a BUILD text with the sources and
  returns a list of problems, each naming the exact BUILD line to add or remove.
* `check_import_rules(repo_root)` checks docs/design.md's import rules on impala_tf/.
* `python tests/build_test.py` prints both lists; `python tests/build_test.py
  --print-build` prints the BUILD file the sources call for (to regenerate: `python
  tests/build_test.py --print-build > BUILD`).

BUILD conventions (also written at the top of BUILD):

* `py_library(name = "<module>", srcs = ["impala_tf/<module>.py"], deps = [...])` for
  each module; `impala_tf/__init__.py` is the library `impala_tf` (the package itself:
  `import impala_tf` / `from impala_tf import __version__`).
* deps of a library are exactly its direct imports: `":<module>"` for each impala_tf
  module, `"@pypi//<dist>"` for each third-party import (`_PYPI_LABELS` maps import
  names to labels). Standard-library imports are not listed.
* `py_test(name = "<stem>", srcs = ["tests/<stem>.py"], deps = [...])` for each
  tests/*_test.py; deps must include everything it imports (extra deps are allowed,
  e.g. an end-to-end test that runs `python -m impala_tf.train` in a subprocess);
  `data = [":testdata"]` when its source mentions testdata (`":bench"` when it
  mentions bench, whose scripts it loads). Other tests/*.py files
  (helpers) are `py_library(..., testonly = True)`.
* `py_binary(name = "<module>_bin", srcs = ["impala_tf/<module>.py"], main =
  "impala_tf/<module>.py", deps = [":<module>"])` for each entry point.
"""

import ast
import collections
import os
import pathlib
import re
import sys
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = 'impala_tf'
PACKAGE_TARGET = 'impala_tf'  # py_library for impala_tf/__init__.py
ENTRY_POINTS = ('train', 'evaluate', 'export', 'plot')
BINARY_SUFFIX = '_bin'
# Spelled so that this file's own strings do not look like a read of testdata/.
TESTDATA_TARGET = ''.join(('test', 'data'))
# Folders a test may read, each a filegroup of that name (glob of the folder):
# a test whose strings name a path through one gets it in its data.
DATA_DIRS = (TESTDATA_TARGET, ''.join(('ben', 'ch')))
_DATA_PATH_RES = {d: re.compile(rf'(^|/){d}(/|$)') for d in DATA_DIRS}

# Third-party import name -> Bazel label of its PyPI distribution.
_PYPI_LABELS = {
    'absl': '@pypi//absl_py',
    'ale_py': '@pypi//ale_py',
    'envpool': '@pypi//envpool',
    'gymnasium': '@pypi//gymnasium',
    'keras': '@pypi//keras',
    'matplotlib': '@pypi//matplotlib',
    'numpy': '@pypi//numpy',
    'pytest': '@pypi//pytest',
    'ray': '@pypi//ray',
    'tensorflow': '@pypi//tensorflow',
    'tensorboard': '@pypi//tensorboard',
    'imageio': '@pypi//imageio',
    'imageio_ffmpeg': '@pypi//imageio_ffmpeg',
    'PIL': '@pypi//pillow',
    'tf_keras': '@pypi//tf_keras',
    'xdist': '@pypi//pytest_xdist',
}

# The README's test command; .ci/run must contain it verbatim.
_README_TEST_LINE_RE = re.compile(r'pip install -e "\.\[test\]" && (?P<cmd>.*pytest.*?)`?\s*$')

_BUILD_HEADER = '''\
# Bazel (Starlark) targets for impala_tf; they mirror the Python import graph.
#
# Conventions (checked by tests/build_test.py, which also prints the BUILD the
# sources call for: `python tests/build_test.py --print-build`):
# - one py_library per module impala_tf/<m>.py, named <m>; impala_tf/__init__.py is
#   the py_library "impala_tf". A library's deps are exactly its direct imports.
# - impala_tf deps are ":<m>"; third-party deps are "@pypi//<dist>" labels of a
#   pip.parse(hub_name = "pypi") hub: @pypi//tensorflow, @pypi//numpy,
#   @pypi//gymnasium, @pypi//absl_py (import absl), @pypi//ale_py, @pypi//tf_keras,
#   @pypi//pytest. The standard library is not listed.
# - one py_test per tests/<stem>_test.py, named <stem>_test; its deps include every
#   module it imports; data = [":testdata"] when it reads testdata/ (":bench"
#   when it loads the bench/ scripts).
# - one py_binary "<m>_bin" per entry point (train, evaluate, export):
#   `bazel run //:train_bin -- --logdir=/tmp/impala_cartpole`.
# - py_test runs the test file as __main__; pytest-style files end with
#   `if __name__ == "__main__": sys.exit(pytest.main([__file__]))`.

load("@rules_python//python:defs.bzl", "py_binary", "py_library", "py_test")

package(default_visibility = ["//visibility:public"])
'''


# ---------------------------------------------------------------------------
# Sources: what each file imports.


class Imports(NamedTuple):
  internal: Dict[str, int]   # impala_tf module stem ('__init__' = package) -> line
  local: Dict[str, int]      # tests/ helper module stem -> line
  external: Dict[str, int]   # third-party top-level import name -> line
  absl_flags: Optional[int]  # line of an absl.flags import, or None
  missing: Dict[str, int]    # impala_tf.<m> imported but impala_tf/<m>.py absent
  data_dirs: Tuple[str, ...]  # DATA_DIRS its strings name a path through


def _package_modules(repo_root: pathlib.Path) -> List[str]:
  pkg = repo_root / PACKAGE
  if not pkg.is_dir():
    return []
  return sorted(p.stem for p in pkg.glob('*.py'))


def _test_files(repo_root: pathlib.Path) -> List[str]:
  tests = repo_root / 'tests'
  if not tests.is_dir():
    return []
  return sorted(p.stem for p in tests.glob('*.py') if p.stem != '__init__')


def _stdlib() -> Set[str]:
  return set(sys.stdlib_module_names) | {'__future__'}


def scan_imports(path: pathlib.Path, repo_root: pathlib.Path) -> Imports:
  """Every import in `path` (module level, in functions, in try blocks)."""
  modules = set(_package_modules(repo_root))
  helpers = {s for s in _test_files(repo_root)}
  in_tests = path.parent.name == 'tests'
  in_package = path.parent.name == PACKAGE
  tree = ast.parse(path.read_text(encoding='utf-8'), filename=str(path))
  internal, local, external, missing = {}, {}, {}, {}
  absl_flags = None
  stdlib = _stdlib()

  def add(d, key, line):
    d.setdefault(key, line)

  def internal_module(name, line):
    if name in modules:
      add(internal, name, line)
    else:
      add(missing, name, line)

  def absolute(dotted: str, names: Optional[List[str]], line: int):
    nonlocal absl_flags
    parts = dotted.split('.')
    top = parts[0]
    if top == PACKAGE:
      if len(parts) > 1:
        internal_module(parts[1], line)
      elif names is None:
        add(internal, '__init__', line)
      else:
        for n in names:
          if n in modules:
            add(internal, n, line)
          else:
            add(internal, '__init__', line)
      return
    if in_tests and top == 'tests':
      targets = [parts[1]] if len(parts) > 1 else (names or [])
      for n in targets:
        if n in helpers:
          add(local, n, line)
      return
    if in_tests and top in helpers and top not in stdlib:
      add(local, top, line)
      return
    if top in stdlib:
      return
    if top == 'absl':
      if (len(parts) > 1 and parts[1] == 'flags') or (
          len(parts) == 1 and names and 'flags' in names):
        absl_flags = absl_flags or line
    add(external, top, line)

  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        absolute(alias.name, None, node.lineno)
    elif isinstance(node, ast.ImportFrom):
      names = [a.name for a in node.names]
      if node.level == 0:
        absolute(node.module, names, node.lineno)
      elif in_package and node.level == 1:
        absolute(PACKAGE + ('.' + node.module if node.module else ''), names,
                 node.lineno)
      elif in_tests and node.level == 1:
        absolute('tests' + ('.' + node.module if node.module else ''), names,
                 node.lineno)
  # Reads testdata/ when a string is a path through it: 'testdata', 'testdata/x',
  # '../testdata/x' (the same for each of DATA_DIRS).
  strings = [n.value for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)]
  data_dirs = tuple(d for d in DATA_DIRS
                    if any(_DATA_PATH_RES[d].search(v) for v in strings))
  return Imports(internal, local, external, absl_flags, missing, data_dirs)


def _target_of_module(stem: str) -> str:
  return PACKAGE_TARGET if stem == '__init__' else stem


def _has_main_block(path: pathlib.Path) -> bool:
  tree = ast.parse(path.read_text(encoding='utf-8'))
  for node in tree.body:
    if isinstance(node, ast.If):
      src = ast.unparse(node.test).replace('"', "'")
      if src in ("__name__ == '__main__'", "'__main__' == __name__"):
        return True
  return False


# ---------------------------------------------------------------------------
# What the sources call for.


class Expected(NamedTuple):
  kind: str                 # py_library | py_test | py_binary
  name: str
  src: str                  # repo-relative path
  deps: Tuple[str, ...]     # required deps, sorted (internal first)
  exact: bool               # deps must equal (True) or include (False)
  data: Tuple[str, ...]     # needs data = [":<d>" for each d]
  testonly: bool
  why: Dict[str, str]       # dep label -> 'path:line imports X'


def _external_label(name: str) -> str:
  return _PYPI_LABELS.get(name, '@pypi//' + name)


def expected_targets(repo_root: pathlib.Path) -> Tuple[List[Expected], List[str]]:
  """The targets the sources call for, and problems found in the sources."""
  repo_root = pathlib.Path(repo_root)
  out, problems = [], []

  def deps_of(rel: str, imp: Imports):
    why = {}
    for m, line in imp.internal.items():
      why.setdefault(':' + _target_of_module(m),
                     f'{rel}:{line} imports {PACKAGE}' + ('' if m == '__init__' else '.' + m))
    for m, line in imp.local.items():
      why.setdefault(':' + m, f'{rel}:{line} imports tests/{m}.py')
    for m, line in imp.external.items():
      if m not in _PYPI_LABELS:
        problems.append(
            f'{rel}:{line}: third-party import "{m}" has no Bazel label: add '
            f"'{m}': '@pypi//<distribution>', to _PYPI_LABELS in tests/build_test.py")
      why.setdefault(_external_label(m), f'{rel}:{line} imports {m}')
    for m, line in imp.missing.items():
      problems.append(f'{rel}:{line}: imports {PACKAGE}.{m} but {PACKAGE}/{m}.py '
                      'does not exist')
    internal = sorted(d for d in why if d.startswith(':'))
    external = sorted(d for d in why if not d.startswith(':'))
    return tuple(internal + external), why

  for stem in _package_modules(repo_root):
    rel = f'{PACKAGE}/{stem}.py'
    imp = scan_imports(repo_root / rel, repo_root)
    deps, why = deps_of(rel, imp)
    # A module's own package import (import impala_tf inside impala_tf) is not a dep.
    if stem == '__init__':
      deps = tuple(d for d in deps if d != ':' + PACKAGE_TARGET)
    out.append(Expected('py_library', _target_of_module(stem), rel, deps, True,
                        imp.data_dirs, False, why))
    if stem in ENTRY_POINTS or (stem != '__init__' and
                                _has_main_block(repo_root / rel)):
      out.append(Expected('py_binary', stem + BINARY_SUFFIX, rel, (':' + stem,),
                          False, (), False,
                          {':' + stem: f'{rel} is an entry point'}))
  for stem in _test_files(repo_root):
    rel = f'tests/{stem}.py'
    imp = scan_imports(repo_root / rel, repo_root)
    deps, why = deps_of(rel, imp)
    is_test = stem.endswith('_test')
    out.append(Expected('py_test' if is_test else 'py_library', stem, rel, deps,
                        not is_test, imp.data_dirs, not is_test, why))
  return out, problems


def _fmt_list(items) -> str:
  return '[' + ', '.join(f'"{i}"' for i in items) + ']'


def render_target(t: Expected) -> str:
  lines = [f'{t.kind}(', f'    name = "{t.name}",', f'    srcs = ["{t.src}"],']
  if t.kind == 'py_binary':
    lines.append(f'    main = "{t.src}",')
  if t.data:
    lines.append(f'    data = {_fmt_list(":" + d for d in t.data)},')
  if t.testonly:
    lines.append('    testonly = True,')
  if len(t.deps) <= 1:
    lines.append(f'    deps = {_fmt_list(t.deps)},')
  else:
    lines.append('    deps = [')
    lines.extend(f'        "{d}",' for d in t.deps)
    lines.append('    ],')
  lines.append(')')
  return '\n'.join(lines)


def generate_build(repo_root) -> str:
  targets, _ = expected_targets(pathlib.Path(repo_root))
  order = {'py_library': 0, 'py_binary': 1, 'py_test': 2}
  targets = sorted(targets, key=lambda t: (order[t.kind], t.src.startswith('tests'),
                                           t.name))
  return (_BUILD_HEADER + ''.join('\n' + _render_filegroup(d) + '\n' for d in DATA_DIRS)
          + ''.join('\n' + render_target(t) + '\n' for t in targets))


def _render_filegroup(folder: str) -> str:
  return f'filegroup(\n    name = "{folder}",\n    srcs = glob(["{folder}/**"]),\n)'


# ---------------------------------------------------------------------------
# BUILD: what it declares.


class Glob(NamedTuple):
  patterns: Tuple[str, ...]


class Target(NamedTuple):
  kind: str
  name: str
  attrs: dict
  lineno: int
  end_lineno: int


def _literal(node):
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
      node.func.id == 'glob'):
    return Glob(tuple(ast.literal_eval(node.args[0])))
  return ast.literal_eval(node)


def parse_build(build_text: str) -> Tuple[List[Target], List[str]]:
  """Targets declared in a BUILD text (Starlark that is also Python syntax)."""
  try:
    tree = ast.parse(build_text, filename='BUILD')
  except SyntaxError as e:
    return [], [f'BUILD:{e.lineno}: cannot parse: {e.msg}']
  targets, problems = [], []
  for stmt in tree.body:
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and
            isinstance(stmt.value.func, ast.Name)):
      problems.append(f'BUILD:{stmt.lineno}: only rule calls are supported here')
      continue
    call = stmt.value
    kind = call.func.id
    if kind in ('load', 'package', 'licenses', 'exports_files'):
      continue
    attrs = {}
    for kw in call.keywords:
      try:
        attrs[kw.arg] = _literal(kw.value)
      except (ValueError, TypeError, SyntaxError):
        problems.append(f'BUILD:{kw.value.lineno}: {kind} attribute {kw.arg} must be '
                        'a literal (or glob([...])) for tests/build_test.py to read it')
    name = attrs.get('name')
    if not isinstance(name, str):
      problems.append(f'BUILD:{stmt.lineno}: {kind}(...) has no name = "..."')
      continue
    targets.append(Target(kind, name, attrs, stmt.lineno, stmt.end_lineno))
  return targets, problems


# ---------------------------------------------------------------------------
# The checks.


def check_build(build_text: str, repo_root) -> List[str]:
  """Problems with `build_text` as the BUILD of `repo_root`; [] when it matches."""
  repo_root = pathlib.Path(repo_root)
  targets, problems = parse_build(build_text)
  expected, source_problems = expected_targets(repo_root)
  problems = problems + source_problems

  by_name = {}
  for t in targets:
    if t.name in by_name:
      problems.append(f'BUILD:{t.lineno}: duplicate target name "{t.name}" (first at '
                      f'BUILD:{by_name[t.name].lineno}); remove lines {t.lineno}-'
                      f'{t.end_lineno}')
    else:
      by_name[t.name] = t

  # Every label and file a target refers to exists.
  for t in targets:
    for attr in ('srcs', 'data', 'deps', 'main'):
      value = t.attrs.get(attr)
      if value is None:
        continue
      if isinstance(value, Glob):
        continue
      items = [value] if isinstance(value, str) else list(value)
      for item in items:
        if not isinstance(item, str):
          problems.append(f'BUILD:{t.lineno}: {t.kind} "{t.name}": {attr} entry '
                          f'{item!r} is not a string')
        elif item.startswith(':'):
          if item[1:] not in by_name:
            problems.append(f'BUILD:{t.lineno}: {t.kind} "{t.name}": {attr} refers to '
                            f'undefined target "{item}"; define it, or remove "{item}", '
                            f'from {attr}')
        elif item.startswith('@') or item.startswith('//'):
          continue
        elif not (repo_root / item).is_file():
          problems.append(f'BUILD:{t.lineno}: {t.kind} "{t.name}": {attr} file '
                          f'"{item}" does not exist; remove "{item}" (or the whole '
                          f'target, BUILD lines {t.lineno}-{t.end_lineno}, if its '
                          'file was deleted)')

  for d in DATA_DIRS:
    if d not in by_name and any(d in e.data for e in expected):
      problems.append(f'BUILD: no filegroup "{d}"; add:\n' + _render_filegroup(d))

  for e in expected:
    t = by_name.get(e.name)
    if t is None or t.kind != e.kind:
      where = (f' (the name "{e.name}" is taken by the {t.kind} at BUILD:{t.lineno})'
               if t is not None else '')
      problems.append(f'BUILD: no {e.kind} for {e.src}{where}; add:\n'
                      + render_target(e))
      continue
    head = f'BUILD:{t.lineno}: {t.kind} "{t.name}"'
    srcs = t.attrs.get('srcs')
    if srcs != [e.src]:
      problems.append(f'{head}: srcs = {srcs!r}; must be srcs = ["{e.src}"],')
    if e.kind == 'py_binary' and t.attrs.get('main') != e.src:
      problems.append(f'{head}: add main = "{e.src}",')
    deps = t.attrs.get('deps') or []
    deps = list(deps) if isinstance(deps, (list, tuple)) else []
    for dep in e.deps:
      if dep not in deps:
        problems.append(f'{head}: add "{dep}", to deps ({e.why[dep]})')
    if e.exact:
      for dep in deps:
        if dep not in e.deps:
          problems.append(f'{head}: remove "{dep}", from deps ({e.src} does not '
                          'import it)')
    seen = set()
    for dep in deps:
      if dep in seen:
        problems.append(f'{head}: remove the duplicate "{dep}", from deps')
      seen.add(dep)
    data = t.attrs.get('data') or []
    for d in e.data:
      if ':' + d not in data:
        problems.append(f'{head}: add ":{d}" to data ({e.src} reads {d}/)')
    if e.testonly and t.attrs.get('testonly') is not True:
      problems.append(f'{head}: add testonly = True, (test helper)')

  # Targets whose file is not a module, test or entry point any more.
  expected_names = {e.name for e in expected} | set(DATA_DIRS)
  for t in targets:
    if t.name not in expected_names and t.kind in ('py_library', 'py_test', 'py_binary'):
      problems.append(f'BUILD:{t.lineno}: {t.kind} "{t.name}" matches no source file '
                      f'(expected names: module stem, test stem, <entry>{BINARY_SUFFIX}); '
                      f'remove BUILD lines {t.lineno}-{t.end_lineno}')
  return problems


# Import rules of docs/design.md ("Layout: modules by role": "Imports run one way").
LEAVES = ('config', 'types')
FLAGS_ALLOWED = ('train', 'evaluate', 'export', 'plot', 'flags')
_FORBIDDEN = [  # (module, must not reach, why)
    ('vtrace', 'networks', 'vtrace and losses know no network'),
    ('losses', 'networks', 'vtrace and losses know no network'),
    ('networks', 'learner', 'networks knows no learner'),
    ('actor', 'data', 'actor, data and learner do not import each other'),
    ('actor', 'learner', 'actor, data and learner do not import each other'),
    ('data', 'actor', 'actor, data and learner do not import each other'),
    ('data', 'learner', 'actor, data and learner do not import each other'),
    ('learner', 'actor', 'actor, data and learner do not import each other'),
    ('learner', 'data', 'actor, data and learner do not import each other'),
]


def check_import_rules(repo_root) -> List[str]:
  """docs/design.md's import rules over impala_tf/ (transitively, with the chain)."""
  repo_root = pathlib.Path(repo_root)
  modules = [m for m in _package_modules(repo_root) if m != '__init__']
  graph, flag_line = {}, {}
  for m in modules:
    imp = scan_imports(repo_root / PACKAGE / f'{m}.py', repo_root)
    graph[m] = {k: v for k, v in imp.internal.items() if k in modules}
    flag_line[m] = imp.absl_flags

  def path_to(start, goal) -> Optional[List[str]]:
    """Shortest import chain start -> ... -> x with goal(x), or None."""
    prev = {start: None}
    queue = collections.deque([start])
    while queue:
      cur = queue.popleft()
      if cur != start and goal(cur):
        chain = [cur]
        while prev[chain[-1]] is not None:
          chain.append(prev[chain[-1]])
        return chain[::-1]
      for nxt in sorted(graph.get(cur, {})):
        if nxt not in prev:
          prev[nxt] = cur
          queue.append(nxt)
    return None

  def show(chain):
    return ' -> '.join(chain)

  def first_hop(chain):
    a, b = chain[0], chain[1]
    return f'{PACKAGE}/{a}.py:{graph[a][b]}'

  problems = []
  for m in LEAVES:
    for dep, line in sorted(graph.get(m, {}).items()):
      problems.append(f'{PACKAGE}/{m}.py:{line}: imports {PACKAGE}.{dep}, but {m} is a '
                      'leaf (config/types import no other impala_tf module); remove it')
  for m, target, why in _FORBIDDEN:
    if m not in graph:
      continue
    chain = path_to(m, lambda x, target=target: x == target)
    if chain:
      problems.append(f'{first_hop(chain)}: {show(chain)}: {why}; remove the import of '
                      f'{PACKAGE}.{chain[1]} from {PACKAGE}/{m}.py')
  for m in modules:
    if m in FLAGS_ALLOWED:
      continue
    if flag_line[m]:
      problems.append(f'{PACKAGE}/{m}.py:{flag_line[m]}: imports absl.flags; only '
                      f'{", ".join(f + ".py" for f in FLAGS_ALLOWED)} may (driver knows '
                      'no flags: take a Config or plain arguments); remove it')
      continue
    chain = path_to(m, lambda x: x != m and (flag_line.get(x) is not None or x == 'flags'))
    if chain:
      problems.append(f'{first_hop(chain)}: {show(chain)} reaches absl.flags; only '
                      f'{", ".join(f + ".py" for f in FLAGS_ALLOWED)} may (driver knows '
                      f'no flags); remove the import of {PACKAGE}.{chain[1]} from '
                      f'{PACKAGE}/{m}.py')
  return problems


def readme_test_command(repo_root) -> str:
  """The test command in README.md (the line `pip install -e ".[test]" && ...`)."""
  text = (pathlib.Path(repo_root) / 'README.md').read_text(encoding='utf-8')
  for line in text.splitlines():
    match = _README_TEST_LINE_RE.search(line.strip().strip('`'))
    if match:
      return match.group('cmd').strip().strip('`').strip()
  raise AssertionError('README.md has no line `pip install -e ".[test]" && python -m '
                       'pytest ...`')


# ---------------------------------------------------------------------------
# Tests.


def _read_build() -> str:
  return (REPO_ROOT / 'BUILD').read_text(encoding='utf-8')


def test_build_matches_sources():
  problems = check_build(_read_build(), REPO_ROOT)
  if problems:  # Raised, not asserted: pytest would repeat the list as a repr.
    raise AssertionError(
        f'{len(problems)} BUILD problem(s); fix by hand, or regenerate with '
        '`python tests/build_test.py --print-build > BUILD`:\n\n' +
        '\n\n'.join(problems))


def test_import_rules():
  problems = check_import_rules(REPO_ROOT)
  if problems:
    raise AssertionError('docs/design.md import rules broken:\n' + '\n'.join(problems))


def test_readme_test_command_is_what_ci_runs():
  command = readme_test_command(REPO_ROOT)
  ci = (REPO_ROOT / '.ci' / 'run').read_text(encoding='utf-8')
  assert command in ci, (f'.ci/run must run the README test command verbatim: '
                         f'{command!r}')
  assert 'pip install -e ".[test]"' in ci
  assert os.access(REPO_ROOT / '.ci' / 'run', os.X_OK), 'chmod +x .ci/run'


def test_ci_tests_the_oldest_tensorflow_setup_py_allows():
  setup_py = (REPO_ROOT / 'setup.py').read_text(encoding='utf-8')
  (lower,) = re.findall(r"'tensorflow>=(\d+\.\d+),<[\d.]+'", setup_py)
  pins = (REPO_ROOT / '.ci' / 'oldest-constraints.txt').read_text(encoding='utf-8')
  (pinned,) = re.findall(r'^tensorflow==(\d+\.\d+)\.\d+$', pins, re.M)
  assert pinned == lower, (pinned, lower)
  ci = (REPO_ROOT / '.ci' / 'run').read_text(encoding='utf-8')
  assert '-c .ci/oldest-constraints.txt' in ci
  assert '.ci/cross_version_check.py' in ci


def test_ci_tests_the_oldest_ray_setup_py_allows():
  setup_py = (REPO_ROOT / 'setup.py').read_text(encoding='utf-8')
  lowers = set(re.findall(r"'ray>=(\d+\.\d+),<[\d.]+'", setup_py))
  pins = (REPO_ROOT / '.ci' / 'oldest-constraints.txt').read_text(encoding='utf-8')
  (pinned,) = re.findall(r'^ray==(\d+\.\d+)\.\d+$', pins, re.M)
  assert lowers == {pinned}, (lowers, pinned)


def test_generated_build_passes_checker():
  assert check_build(generate_build(REPO_ROOT), REPO_ROOT) == []


def _remove_target(build_text: str, name: str) -> str:
  targets, _ = parse_build(build_text)
  (t,) = [t for t in targets if t.name == name]
  lines = build_text.splitlines(keepends=True)
  return ''.join(lines[:t.lineno - 1] + lines[t.end_lineno:])


def test_checker_reports_a_removed_library():
  text = _remove_target(_read_build(), 'config')
  problems = check_build(text, REPO_ROOT)
  assert any(p.startswith('BUILD: no py_library for impala_tf/config.py; add:\n'
                          'py_library(\n    name = "config",') for p in problems), problems


def test_checker_reports_a_removed_test():
  text = _remove_target(_read_build(), 'build_test')
  problems = check_build(text, REPO_ROOT)
  assert any('no py_test for tests/build_test.py' in p for p in problems), problems


def _fake_repo(root: pathlib.Path, files: Dict[str, str]) -> pathlib.Path:
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding='utf-8')
  return root


_FAKE = {
    'impala_tf/__init__.py': "__version__ = '0'\n",
    'impala_tf/config.py': 'import dataclasses\n',
    'impala_tf/vtrace.py': 'import tensorflow as tf\n',
    'impala_tf/losses.py': 'import tensorflow as tf\nfrom impala_tf import vtrace\n',
    'impala_tf/train.py': ('from absl import app\nfrom absl import flags\n'
                           'from impala_tf import config\n'),
    'tests/losses_test.py': ('import numpy as np\nfrom impala_tf import losses\n'
                             f"GOLDEN = '{TESTDATA_TARGET}/losses.json'\n"),
}


def test_checker_on_a_fake_repo(tmp_path):
  root = _fake_repo(tmp_path, _FAKE)
  build = generate_build(root)
  assert check_build(build, root) == []
  assert check_import_rules(root) == []
  assert '"@pypi//absl_py",' in build and 'name = "train_bin"' in build
  assert 'data = [":testdata"]' in build

  # Removing each target is reported with the block to add back.
  for name in ('vtrace', 'losses_test', 'train_bin', 'impala_tf'):
    problems = check_build(_remove_target(build, name), root)
    assert any(p.startswith('BUILD: no ') and f'name = "{name}"' in p
               for p in problems), (name, problems)

  # A target whose file was deleted.
  (root / 'impala_tf' / 'config.py').unlink()
  (root / 'impala_tf' / 'train.py').write_text('from absl import app\n')
  problems = check_build(build, root)
  assert any('"impala_tf/config.py" does not exist' in p for p in problems), problems


def test_a_test_that_loads_the_bench_scripts_gets_them_as_data(tmp_path):
  bench = DATA_DIRS[1]
  root = _fake_repo(tmp_path, dict(_FAKE, **{
      'tests/bench_test.py': f"import os\nHERE = os.path.join('..', '{bench}')\n",
      f'{bench}/atari.py': 'import json\n'}))
  build = generate_build(root)
  assert check_build(build, root) == []
  assert f'data = [":{bench}"]' in build
  assert f'name = "{bench}",\n    srcs = glob(["{bench}/**"])' in build
  assert f'data = [":{TESTDATA_TARGET}"]' in build  # losses_test's, unchanged.

  without = build.replace(f'    data = [":{bench}"],\n', '')
  assert any(f'py_test "bench_test": add ":{bench}" to data (tests/bench_test.py '
             f'reads {bench}/)' in p for p in check_build(without, root))
  no_group = build.replace(
      f'filegroup(\n    name = "{bench}",\n    srcs = glob(["{bench}/**"]),\n)\n', '')
  assert any(p.startswith(f'BUILD: no filegroup "{bench}"')
             for p in check_build(no_group, root))


def test_checker_reports_exact_dep_lines(tmp_path):
  root = _fake_repo(tmp_path, _FAKE)
  build = generate_build(root)
  without = build.replace('        ":vtrace",\n', '', 1)
  assert without != build
  problems = check_build(without, root)
  assert any(p.endswith('py_library "losses": add ":vtrace", to deps '
                        '(impala_tf/losses.py:2 imports impala_tf.vtrace)')
             for p in problems), problems
  extra = build.replace('deps = ["@pypi//tensorflow"]',
                        'deps = [":config", "@pypi//tensorflow"]', 1)
  assert extra != build
  problems = check_build(extra, root)
  assert any('py_library "vtrace": remove ":config", from deps' in p
             for p in problems), problems


def test_import_rules_on_a_fake_repo(tmp_path):
  files = dict(_FAKE)
  files.update({
      'impala_tf/types.py': 'from impala_tf import config\n',
      'impala_tf/networks.py': 'import tensorflow as tf\n',
      'impala_tf/vtrace.py': 'from impala_tf import losses\n',
      'impala_tf/losses.py': 'from impala_tf.networks import MLP\n',
      'impala_tf/actor.py': 'import numpy\n',
      'impala_tf/replay.py': 'from . import actor\n',
      'impala_tf/data.py': 'from impala_tf import replay\n',
      'impala_tf/learner.py': 'import tensorflow\n',
      'impala_tf/flags.py': 'from absl import flags\n',
      'impala_tf/driver.py': 'import absl.flags\n',
      'impala_tf/metrics.py': 'from impala_tf import flags\n',
  })
  root = _fake_repo(tmp_path, files)
  problems = '\n'.join(check_import_rules(root))
  assert 'impala_tf/types.py:1: imports impala_tf.config' in problems
  assert 'vtrace -> losses -> networks' in problems
  assert 'losses -> networks' in problems
  assert 'data -> replay -> actor' in problems
  assert 'impala_tf/driver.py:1: imports absl.flags' in problems
  assert 'metrics -> flags reaches absl.flags' in problems
  assert not re.search(r'^impala_tf/(train|flags)\.py', problems, re.M), problems


def main(argv):
  if '--print-build' in argv:
    sys.stdout.write(generate_build(REPO_ROOT))
    return 0
  problems = check_build(_read_build(), REPO_ROOT) + check_import_rules(REPO_ROOT)
  print('\n\n'.join(problems) if problems else 'BUILD and imports OK')
  return 1 if problems else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
