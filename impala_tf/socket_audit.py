"""Which addresses a process tree listens on (Linux: /proc), and a check of them.

`check_loopback_only(root)` reads the listening TCP sockets of `root` and of
every process below it (`/proc/net/tcp`, `/proc/net/tcp6`, `/proc/PID/fd`) and
raises, in one line naming the address and the process, unless all of them are
on the loopback interface. `impala_tf.ray_session` runs it right after starting a
local Ray, whose loopback binding rests on a private Ray constant: a Ray release
that ignores it stops the run instead of opening ports to the network.
`socket_inodes(pid)` is the set of socket inodes a process holds (those it had
before Ray are left out of the check), `listening_sockets()` the listening ones
and `descendants(pid)` the processes below one. Elsewhere than Linux nothing is
checked. Standard library and `impala_tf.errors` only: no TensorFlow.
"""

import os
import socket
from typing import Dict, List

from impala_tf import errors


def listening_sockets() -> Dict[str, str]:
  """Listening TCP sockets: socket inode -> local address.

  Both str as /proc/net/tcp and /proc/net/tcp6 write them: the address is hex
  `ADDR:PORT` (e.g. '0100007F:1F90' for 127.0.0.1:8080). {} where /proc has none.
  """
  out = {}
  for path in ('/proc/net/tcp', '/proc/net/tcp6'):
    try:
      with open(path, encoding='utf-8') as f:
        rows = f.read().splitlines()[1:]
    except OSError:
      continue
    for row in rows:
      fields = row.split()
      if len(fields) > 9 and fields[3] == '0A':  # TCP_LISTEN
        out[fields[9]] = fields[1]
  return out


def socket_inodes(pid: int) -> set:
  """Inodes (str, as in /proc/net/tcp*) of the sockets process `pid` holds."""
  inodes = set()
  try:
    fds = os.listdir(f'/proc/{pid}/fd')
  except OSError:
    return inodes
  for fd in fds:
    try:
      target = os.readlink(f'/proc/{pid}/fd/{fd}')
    except OSError:
      continue
    if target.startswith('socket:['):
      inodes.add(target[8:-1])
  return inodes


def descendants(root: int) -> List[int]:
  """Pids of every process below `root`, from /proc (Linux; [] elsewhere)."""
  children: Dict[int, List[int]] = {}
  for d in os.listdir('/proc'):
    if not d.isdigit():
      continue
    try:
      with open(f'/proc/{d}/stat', encoding='utf-8') as f:
        ppid = int(f.read().rsplit(')', 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
    children.setdefault(ppid, []).append(int(d))
  out, todo = [], [root]
  while todo:
    for c in children.get(todo.pop(), []):
      out.append(c)
      todo.append(c)
  return out


def _is_loopback(hex_address: str) -> bool:
  """Whether a /proc/net/tcp* `ADDR:PORT` (hex) is on the loopback interface."""
  addr = hex_address.rsplit(':', 1)[0].upper()
  if len(addr) == 8:  # IPv4, little-endian: 127.x.x.x
    return addr.endswith('7F')
  return (addr == '00000000000000000000000001000000' or  # ::1
          (addr.startswith('0000000000000000FFFF0000') and addr.endswith('7F')))


def _readable(hex_address: str) -> str:
  addr, port = hex_address.rsplit(':', 1)
  raw = b''.join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
  family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
  host = socket.inet_ntop(family, raw)
  return f'{host}:{int(port, 16)}' if family == socket.AF_INET else f'[{host}]:{int(port, 16)}'


def _process_name(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/comm', encoding='utf-8') as f:
      return f.read().strip()
  except OSError:
    return '?'


def check_loopback_only(root: int, ignore: frozenset = frozenset()):
  """Raises unless every listening TCP socket of `root` and its descendants is local.

  On Linux (it reads /proc; elsewhere it checks nothing). The run's own Ray binds
  127.0.0.1 because impala_tf sets a private Ray constant
  (`ray_session.loopback_only`); this check makes a Ray release that ignores it
  stop the run instead of exposing it.

  Args:
    root: the process whose tree is checked (the driver: Ray's processes are its
      descendants).
    ignore: socket inodes of `root` to leave out (those it had before Ray).

  Raises:
    errors.ActorPoolError: (one line) naming the first non-loopback listener.
  """
  if not os.path.isdir('/proc/self/fd'):
    return
  listening = listening_sockets()
  for pid in [root] + descendants(root):
    for inode in sorted(socket_inodes(pid) - set(ignore if pid == root else ())):
      address = listening.get(inode)
      if address is not None and not _is_loopback(address):
        raise errors.ActorPoolError(
            f'the local Ray instance listens on {_readable(address)} (process '
            f'{pid}, {_process_name(pid)}), not only on 127.0.0.1: this Ray '
            'release ignores impala_tf\'s loopback setting, so the run stopped it '
            'rather than open ports to the network; use a Ray version that '
            "setup.py allows, or start Ray yourself and join it with --ray_address")
