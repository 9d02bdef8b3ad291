"""Tests of impala_tf.ray_session: joining a running Ray.

An address where nothing answers fails in one line within the connect timeout;
a head started on 127.0.0.1 (outside the run) is joined as a loopback node and
left running.
"""

import socket
import sys
import threading
import time

import pytest
import ray
from ray import cluster_utils

from impala_tf import actor_pool
from impala_tf import ray_session

# A fixture of what the Ray tests share; pytest finds it by its name here.
from ray_testing import no_ray  # pylint: disable=unused-import


def _within(seconds, fn):
  """fn() in a thread; its result, its exception, or a failure after `seconds`."""
  out = {}

  def run():
    try:
      out['value'] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      out['error'] = e
  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(seconds)
  assert not thread.is_alive(), f'still running after {seconds} s'
  if 'error' in out:
    raise out['error']
  return out['value']


def test_an_address_where_nothing_answers_is_one_line_in_time(no_ray):
  del no_ray
  with socket.socket() as s:  # A loopback port where nothing listens.
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  start = time.monotonic()
  with pytest.raises(actor_pool.ActorPoolError) as e:
    _within(90, lambda: ray_session.RaySession(f'127.0.0.1:{port}'))
  message = str(e.value)
  assert message.startswith(f'--ray_address=127.0.0.1:{port}: no Ray cluster '
                            'answered (ConnectionRefusedError'), message
  assert '--ray_connect_timeout_secs=60' in message and '\n' not in message
  assert time.monotonic() - start < 60
  assert not ray.is_initialized()


def test_joins_a_head_started_on_loopback(no_ray):
  del no_ray
  # A single-machine head (listening on 127.0.0.1 only), started outside the run.
  with ray_session.loopback_only():
    cluster = cluster_utils.Cluster(initialize_head=True,
                                    head_node_args={'num_cpus': 1})
  try:
    session = _within(120, lambda: ray_session.RaySession(cluster.address))
    try:
      assert not session.started
      assert [n['NodeManagerAddress'] for n in ray.nodes()] == ['127.0.0.1']
      assert ray.get(ray.remote(lambda: 7).remote(), timeout=120) == 7
    finally:
      session.close()
    assert not ray.is_initialized()
  finally:
    cluster.shutdown()


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
