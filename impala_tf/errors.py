"""One-line error text, and the error a pool of actors raises.

An error quoted inside the run's own messages and log lines (`actor 3 died
(...)`, `Ray actor 0 failed (...)`) stays on one line and short: `one_line`
turns every run of whitespace (newlines included) into one space and cuts the
text at `LIMIT` characters, the last of them `MARKER`.

`ActorPoolError` is the pool's error (`impala_tf.actor_pool` names it too): it
lives here so that modules that raise it without TensorFlow
(`impala_tf.socket_audit`) need not import the pool.

Standard library only, so that any module may import it.
"""

from typing import Optional

# The most characters `one_line` returns by default, `MARKER` included.
LIMIT = 300
# What ends a text that `one_line` cut.
MARKER = '...'


def one_line(message, limit: Optional[int] = LIMIT) -> str:
  """`str(message)` on one line, at most `limit` characters.

  Args:
    message: an exception, a string or any object (its `str` is used).
    limit: the most characters returned, `MARKER` included; at least
      `len(MARKER)`. None: no limit (a message that is the whole error line).

  Returns:
    The text with each run of whitespace made one space; when that is longer
    than `limit`, its first `limit - len(MARKER)` characters followed by
    `MARKER`.
  """
  text = ' '.join(str(message).split())
  return text if limit is None or len(text) <= limit else text[:limit - len(MARKER)] + MARKER


class ActorPoolError(RuntimeError):
  """The pool cannot keep its actors alive; the message (one line) says why."""
