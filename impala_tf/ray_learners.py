"""Learner workers placed by Ray (`--learner_backend=ray --num_learner_workers=N`).

`launch_ray(args, config)` connects to Ray (`--ray_address`: a cluster, or '' for a
local Ray on 127.0.0.1, as the Ray actor backend does: `ray_session.RaySession`),
places N `LearnerWorker` Ray actors with `--ray_learner_resources` each, all in one
placement group (gang-placed: all of them or none, within
`--ray_placement_timeout_secs`), checks that each runs the driver's impala_tf and
TensorFlow versions (one line naming the node otherwise), asks each for its
node's address and a port that is free there, and wires every worker's
`TF_CONFIG` from the nodes they landed on. Each Ray actor then runs
`python -m impala_tf.train ARGS` as a child process with its `TF_CONFIG`, its own
interpreter, working directory and environment (`--ray_runtime_env`'s): the same
program and code path as a worker started by hand (`impala_tf.distribute`), in a
fresh process (TensorFlow's strategy must come before any other op of its process,
and a Ray actor process may have run others).

Plain Ray actors, not Ray Train's `TensorflowTrainer`: that trainer does the same
`TF_CONFIG` wiring, but runs the training loop inside its own session (its own
checkpoint and reporting API, `ray[train]` as a dependency), while impala_tf's
driver already owns the loop, the checkpoints and the metrics (docs/design.md).

Supervision is the local launcher's (`impala_tf.launcher`): the ports are named in
one line at start; SIGINT and SIGTERM are forwarded to every worker; a worker that
dies (its process, or its Ray actor or node) stops the run within
`--learner_worker_timeout_secs` with one line naming it; at the end every Ray
actor is killed and a Ray this run started is shut down.

This module reads no flags; `impala_tf.train` calls it.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import List, Optional, Sequence

from absl import logging

from impala_tf import config as config_lib
from impala_tf import distribute
from impala_tf import launcher

_POLL_SECS = 0.1
# A worker's final status line (`impala_tf.train: done: ...` or `...: error: ...`).
# Ray streams an actor's output to the driver from its log files and drops what it
# had not read when the launcher shuts Ray down, which is when these lines come: so
# the actor holds them back and returns them, and the launcher prints them.
_STATUS_LINE = re.compile(r'^\S+: (done|error): ')


def _child_setup():  # Runs in the worker process between fork and exec.
  # Ray runs actor methods in threads that block SIGINT and SIGTERM; a child
  # inherits the mask across exec, and would never see the signals it is sent.
  signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT, signal.SIGTERM])
  launcher.die_with_parent()


class LearnerWorker:
  """The body of one Ray actor: runs one learner worker process.

  Runs with max_concurrency > 1, so `signal` reaches a worker that `run` waits for.
  """

  def __init__(self):
    self._proc: Optional[subprocess.Popen] = None
    self._lock = threading.Lock()

  def address(self) -> str:
    """'node_ip:port' of a port free on this actor's node now."""
    import ray  # pylint: disable=g-import-not-at-top
    ip = ray.util.get_node_ip_address()
    return f'{ip}:{distribute.free_local_ports(1)[0]}'

  def versions(self) -> dict:
    """The versions that must agree with the driver's (`ray_actor.local_versions`)."""
    from impala_tf import ray_actor  # pylint: disable=g-import-not-at-top
    return ray_actor.local_versions()

  def run(self, args: Sequence[str], env: dict):
    """Runs `python -m impala_tf.train ARGS` as this node's process, to its end.

    The worker runs with this actor's interpreter, working directory and
    environment (those of `--ray_runtime_env` on a cluster: its `working_dir`,
    `py_modules`, `env_vars`), with `env` added, and this actor's copy of
    impala_tf first on its PYTHONPATH: the code the actor itself imported, not the
    driver's paths. Its output is copied line by line to this actor's (which Ray
    streams to the driver), except its final status lines (`_STATUS_LINE`).

    Returns:
      (exit status, list of the held-back status lines).
    """
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(
        distribute.__file__)))
    with self._lock:
      full_env = dict(os.environ)
      full_env.update(env)
      full_env['PYTHONPATH'] = os.pathsep.join(
          p for p in (package_root, os.environ.get('PYTHONPATH', '')) if p)
      argv = [sys.executable, '-m', 'impala_tf.train'] + list(args)
      self._proc = subprocess.Popen(argv, env=full_env, cwd=os.getcwd(),
                                    preexec_fn=_child_setup,
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    errors='replace', bufsize=1)
    status = []
    for line in self._proc.stdout:
      if _STATUS_LINE.match(line):
        status.append(line.rstrip('\n'))
      else:
        sys.stdout.write(line)
        sys.stdout.flush()
    return self._proc.wait(), status

  def signal(self, signum: int) -> bool:
    """Sends `signum` to the worker process; False when none runs."""
    with self._lock:
      if self._proc is None or self._proc.poll() is not None:
        return False
      self._proc.send_signal(signum)
      return True

  def kill(self) -> None:
    with self._lock:
      if self._proc is not None and self._proc.poll() is None:
        self._proc.kill()
        self._proc.wait()


def _actor_options(resources: dict, group=None, index: int = 0) -> dict:
  """Ray actor options of learner worker `index` (in placement `group`, if any).

  The actor-level runtime env only adds an env var: Ray merges it into the
  job's (`--ray_runtime_env`), whose `working_dir` and modules the worker keeps.
  """
  res = dict(resources)
  # The actor process imports TensorFlow (for `distribute`) but runs no op: its
  # native start-up lines would only repeat the workers'.
  opts = dict(num_cpus=res.pop('CPU', 0.0), num_gpus=res.pop('GPU', 0.0),
              max_restarts=0, max_concurrency=4,
              runtime_env={'env_vars': {'TF_CPP_MIN_LOG_LEVEL': '3'}})
  if 'memory' in res:
    opts['memory'] = res.pop('memory')
  if res:
    opts['resources'] = res
  if group is not None:
    from ray.util import scheduling_strategies  # pylint: disable=g-import-not-at-top
    opts['scheduling_strategy'] = (
        scheduling_strategies.PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=index))
  return opts


def _bundle(resources: dict) -> dict:
  """One placement-group bundle: the nonzero resources of one learner worker."""
  return {k: float(v) for k, v in resources.items() if v > 0}


def version_mismatch(driver: dict, workers: Sequence[dict],
                     addresses: Sequence[str]) -> Optional[str]:
  """The one line naming the first worker whose versions differ, or None.

  Args:
    driver: the driver's `ray_actor.local_versions()`.
    workers: each worker's.
    addresses: each worker's `node:port`.
  """
  for i, (theirs, address) in enumerate(zip(workers, addresses)):
    if theirs != driver:
      keys = list(driver) + [k for k in theirs if k not in driver]
      say = lambda v: ', '.join(f'{k} {v.get(k)}' for k in keys)
      return (f'Ray learner worker {i} on node {address.rsplit(":", 1)[0]} runs '
              f'{say(theirs)} but the driver runs {say(driver)}; install the same '
              'versions on every node (or ship the code with --ray_runtime_env)')
  return None


def launch_ray(args: Sequence[str], config: config_lib.Config,
               prog: str = 'impala_tf.train') -> int:
  """Places and supervises the workers (module docstring); returns an exit status.

  Args:
    args: the flags every worker gets (the launcher's own command line).
    config: the run's Config (num_learner_workers, learner_worker_timeout_secs,
      ray_address, ray_connect_timeout_secs, ray_learner_resources,
      ray_placement_timeout_secs, ray_runtime_env).
    prog: the program name of the one-line messages.

  Returns:
    0 when every worker exited with 0, else 1.
  """
  from impala_tf import actor_pool  # pylint: disable=g-import-not-at-top
  from impala_tf import ray_actor  # pylint: disable=g-import-not-at-top
  from impala_tf import ray_session  # pylint: disable=g-import-not-at-top
  import ray  # pylint: disable=g-import-not-at-top
  num = config.num_learner_workers
  timeout = config.learner_worker_timeout_secs
  try:
    session = ray_session.RaySession(
        config.ray_address, connect_timeout=config.ray_connect_timeout_secs,
        runtime_env=config.ray_runtime_env_dict)
  except actor_pool.ActorPoolError as e:
    print(f'{prog}: error: {e}', file=sys.stderr, flush=True)
    return 1
  resources = config.ray_learner_resources_dict
  workers = []
  group = None
  # The handler only records a signal; the loop below sends it (Ray calls from a
  # signal handler, which interrupted a Ray call, did not reach the actors; and
  # a handler that took a lock would hang on one the loop held).
  inbox = launcher.SignalInbox(timeout).install()
  failed = False
  try:
    try:
      if _bundle(resources):  # All the workers or none: one placement group.
        from ray import util as ray_util  # pylint: disable=g-import-not-at-top
        group = ray_util.placement_group([_bundle(resources)] * num,
                                         strategy='PACK')
        ray.get(group.ready(), timeout=config.ray_placement_timeout_secs)
      actor_cls = ray.remote(LearnerWorker)
      workers.extend(actor_cls.options(**_actor_options(resources, group, i)).remote()
                     for i in range(num))
      addresses = ray.get([w.address.remote() for w in workers],
                          timeout=config.ray_placement_timeout_secs)
    except ray.exceptions.GetTimeoutError:
      print(f'{prog}: error: Ray could not place {num} learner workers with '
            f'--ray_learner_resources={config.ray_learner_resources} within '
            f'{config.ray_placement_timeout_secs:g} s (--ray_placement_timeout_secs): '
            'the cluster lacks the resources; add nodes or ask for less',
            file=sys.stderr, flush=True)
      return 1
    mismatch = version_mismatch(ray_actor.local_versions(),
                                ray.get([w.versions.remote() for w in workers],
                                        timeout=60), addresses)
    if mismatch:
      print(f'{prog}: error: {mismatch}', file=sys.stderr, flush=True)
      return 1
    cluster = distribute.Cluster(tuple(addresses), 0)
    print(distribute.exposure_line([int(a.rsplit(':', 1)[1]) for a in addresses])
          + f' [on the nodes {", ".join(addresses)}]', flush=True)
    refs = []
    for i, w in enumerate(workers):
      env = {distribute.TF_CONFIG: cluster.tf_config(i),
             distribute.LAUNCHED_ENV: '1'}
      refs.append(w.run.remote(list(args), env))
    codes: List[Optional[int]] = [None] * num
    while any(c is None for c in codes):
      for signum in inbox.take()[-1:]:
        sent = ray.get([w.signal.remote(signum) for j, w in enumerate(workers)
                        if codes[j] is None], timeout=30)
        logging.info('Forwarded signal %d to %d learner worker(s).', signum,
                     sum(sent))
      pending = [r for r, c in zip(refs, codes) if c is None]
      done, _ = ray.wait(pending, num_returns=1, timeout=_POLL_SECS)
      now = time.monotonic()
      for ref in done:
        i = refs.index(ref)
        try:
          codes[i], status = ray.get(ref)
          for line in status:  # See _STATUS_LINE.
            print(line, file=sys.stderr if ': error: ' in line else sys.stdout,
                  flush=True)
          what = launcher.describe_exit(codes[i])
        except ray.exceptions.RayError as e:  # The actor or its node died.
          codes[i] = -1
          what = f'was lost by Ray ({type(e).__name__})'
        inbox.start_deadline(now)
        if codes[i] != 0 and not failed:
          failed = True
          print(f'{prog}: error: learner worker {i} ({addresses[i]}) {what}; '
                f'stopping the other worker(s) within {timeout:g} s '
                '(--learner_worker_timeout_secs); the newest checkpoint is kept: '
                'rerun the same command to resume', file=sys.stderr, flush=True)
          for j, w in enumerate(workers):
            if codes[j] is None:
              w.signal.remote(signal.SIGTERM)
      if inbox.deadline is not None and now >= inbox.deadline:
        late = [i for i, c in enumerate(codes) if c is None]
        if late:
          if not failed:
            print(f'{prog}: error: learner worker(s) {", ".join(map(str, late))} '
                  f'did not stop within {timeout:g} s (--learner_worker_timeout_secs);'
                  ' killed', file=sys.stderr, flush=True)
          failed = True
        break
    return 0 if not failed and all(c == 0 for c in codes) else 1
  finally:
    for w in workers:
      try:
        ray.get(w.kill.remote(), timeout=10)
      except Exception:  # pylint: disable=broad-except
        pass  # Dead already; ray.kill below ends what is left.
      ray.kill(w)
    if group is not None:
      try:
        from ray import util as ray_util  # pylint: disable=g-import-not-at-top
        ray_util.remove_placement_group(group)
      except Exception:  # pylint: disable=broad-except
        pass  # Ray is shutting down.
    inbox.restore()
    session.close()
