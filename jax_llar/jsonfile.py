"""Reading a JSON file that may be anything: a bounded, non-blocking read.

The files users point jax_llar at (tuning tables, result files) are read by
`read`: only a regular file is opened (never a FIFO or a device, which could
block), and JSON nested deeper than `MAX_JSON_DEPTH` is refused before
parsing (``json.loads`` recurses once per level). Each problem is an
`Unreadable` whose message follows the file's path ("is a directory, not a
file").
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any

# The deepest nesting of JSON arrays and objects that the readers of tables
# and result files take (a table nests 5 deep, a result file about as
# much). Checked by a scan that does not recurse, before json.loads, whose
# parser recurses once per level (200 thousand `[` would raise RecursionError).
MAX_JSON_DEPTH = 64

# A JSON string (or the rest of the text, for an unterminated one), or a
# bracket outside strings.
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\[\s\S][^"\\]*)*(?:"|\\?\Z)|[\[\]{}]')



class Unreadable(ValueError):
  """A file that `read` cannot give: the message says why, to follow
  the file's path ("is a directory, not a file")."""


def file_kind(mode: int) -> str:
  """What a file that is no regular file is, for a message."""
  if stat.S_ISDIR(mode):
    return "is a directory, not a file"
  for test, name in ((stat.S_ISFIFO, "a FIFO, a named pipe"), (stat.S_ISSOCK, "a socket"),
                     (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
    if test(mode):
      return f"is not a regular file ({name})"
  return "is not a regular file"


def problem(path: str) -> str | None:
  """Why `path` is no regular file that can be read, from ``os.stat`` alone
  (nothing is opened, so a FIFO cannot block); None when it is one."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return "does not exist"
  except NotADirectoryError:
    return "does not exist (a part of its path is not a directory)"
  except (OSError, ValueError) as e:
    return f"cannot be read: {getattr(e, 'strerror', None) or e}"
  return None if stat.S_ISREG(st.st_mode) else file_kind(st.st_mode)


def _too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
  """Whether the arrays and objects of the JSON `text` nest deeper than
  `limit`; a loop over its brackets outside strings, never a recursion."""
  depth = 0
  for m in _JSON_TOKENS.finditer(text):
    c = m.group()
    if c in "[{":
      depth += 1
      if depth > limit:
        return True
    elif c in "]}":
      depth -= 1
  return False


def read(path: str) -> tuple[Any, bytes]:
  """(the parsed JSON, the file's bytes) of the regular file `path`.

  Never blocks on a FIFO or a device: the path is checked with ``os.stat``
  first, opened non-blocking, and checked again on the open file. Never
  recurses deeply: nesting beyond `MAX_JSON_DEPTH` is refused before
  parsing.

  Raises:
    Unreadable: missing, a directory or another file that is not regular,
      unreadable, not UTF-8 JSON, or nested too deeply.
  """
  why = problem(path)
  if why is not None:
    raise Unreadable(why)
  flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
  try:
    fd = os.open(path, flags)
  except OSError as e:
    raise Unreadable(f"cannot be read: {e.strerror or e}") from None
  try:
    with os.fdopen(fd, "rb") as f:
      mode = os.fstat(f.fileno()).st_mode
      if not stat.S_ISREG(mode):  # replaced since the check above
        raise Unreadable(file_kind(mode))
      raw = f.read()
  except OSError as e:
    raise Unreadable(f"cannot be read: {e.strerror or e}") from None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise Unreadable(f"is not JSON: not UTF-8 ({e})") from None
  deep = (f"is not JSON that jax_llar reads: its arrays and objects nest deeper "
          f"than {MAX_JSON_DEPTH} levels")
  if _too_deep(text):
    raise Unreadable(deep)
  try:
    return json.loads(text), raw
  except RecursionError:  # not reached within the bound; kept as a guard
    raise Unreadable(deep) from None
  except ValueError as e:
    raise Unreadable(f"is not JSON: {e}") from None


def short(value: Any, limit: int = 40) -> str:
  """`value`'s repr for a message, cut to about `limit` characters."""
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


def kind(value: Any) -> str:
  """What a JSON value is, for a message."""
  if value is None:
    return "null"
  for kind, name in ((bool, "a boolean"), (dict, "an object"), (list, "an array"),
                     (str, "a string"), ((int, float), "a number")):
    if isinstance(value, kind):
      return name
  return type(value).__name__
