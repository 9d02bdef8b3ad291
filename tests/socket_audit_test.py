"""Tests of impala_tf.socket_audit: a local Ray that listens beyond loopback.

As if a Ray release ignored impala_tf's loopback setting (every listening socket
read as on 0.0.0.0): starting a local Ray stops it, in one line naming the
address, and leaves no Ray initialised (fail closed).
"""

import sys

import pytest
import ray

from impala_tf import actor_pool
from impala_tf import ray_session
from impala_tf import socket_audit

import helpers

# A fixture of what the Ray tests share; pytest finds it by its name here.
from ray_testing import no_ray  # pylint: disable=unused-import


def test_a_local_ray_that_does_not_listen_on_loopback_only_is_stopped(no_ray,
                                                                     monkeypatch):
  del no_ray
  real = socket_audit.listening_sockets

  def as_if_on_every_interface():  # A Ray release that ignores the constant.
    return {inode: '00000000:' + addr.rsplit(':', 1)[1]
            for inode, addr in real().items()}
  monkeypatch.setattr(socket_audit, 'listening_sockets', as_if_on_every_interface)
  with pytest.raises(actor_pool.ActorPoolError) as e:
    ray_session.RaySession('', num_cpus=1)
  message = str(e.value)
  assert message.startswith('the local Ray instance listens on 0.0.0.0:'), message
  assert 'not only on 127.0.0.1' in message and '\n' not in message
  assert not ray.is_initialized()  # Failed closed: shut down.


def test_importing_it_does_not_import_tensorflow():
  # bench/actor_backends.py's parent process imports it only to read /proc.
  code = ('import sys; from impala_tf import socket_audit; '
          'print(sorted(m for m in ("tensorflow", "impala_tf.actor_pool") '
          'if m in sys.modules))')
  out = helpers.run_python(['-c', code], timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == '[]', (
      out.stdout + out.stderr[-2000:])


if __name__ == '__main__':
  sys.exit(pytest.main([__file__]))
