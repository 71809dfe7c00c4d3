"""What every command-line tool of jax_llar does around its main function.

absl turns logging up to INFO once flags are parsed unless ``--verbosity``
is given; the tools keep it at WARNING then, so that only what a user acts
on (jax_llar's fallback reasons, JAX's warnings) is printed.

absl's help flags (``--help``, ``-?``, ``--helpshort``, ``--helpfull``,
``--helpxml``) print the help and then exit with status 1, as if the command
had failed (absl.app.HelpFlag); the tools exit with status 0 instead: the
help asked for was given. A flag that does not parse still exits with 1.

Garbage on the command line (issue 23) ends a tool before it does any work,
in one line and a non-zero status, never in a traceback:

- a flag value absl's parser or a validator refuses: absl's two lines on
  stderr (``FATAL Flags parsing error: flag --NAME=VALUE: why`` and where to
  find help), status 1. Every float flag of a tool must be a finite number
  (`prepare` adds that validator to each; absl's own bounds let nan and inf
  through). Integer flags carry both bounds; seeds are 0..`SEED_MAX`; tags
  are file-name parts (`TAG_RE`).
- what only the machine can decide (an output folder that cannot be created
  or written, a world larger than the devices present, a tool that needs
  GPUs there are not): the tool raises `Refused` before its work starts;
  `run` prints ``jax_llar.tools.<tool>: <why>`` on stdout, one line, and
  exits with status 1.
- a stray positional argument: one line, status 1.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from typing import Any, Callable, Sequence

from absl import app, flags, logging

# absl's flags that print help and exit before main.
HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml")

# The largest seed a tool accepts (numpy's generators take any non-negative
# integer; the tools' records and the native harnesses keep 32 bits).
SEED_MAX = 2**32 - 1
# A tag: a part of a file name (letters, digits, '.', '_', '+', '-', at most
# 64 characters, no '/', not '.' or '..' alone).
TAG_RE = re.compile(r"[A-Za-z0-9._+-]{0,64}")
TAG_RULE = ("a file-name part: at most 64 letters, digits, '.', '_', '+' or '-' "
            "(no '/')")


class Refused(Exception):
  """A tool refuses its command line before doing any work; `run` prints
  the message as one line (prefixed with the tool's name) and exits with
  status 1."""


def _help_exits_zero() -> None:
  """Makes absl's help flags exit with status 0 after printing the help.

  Each of them prints from its ``parse`` and then raises SystemExit(1)
  (``absl.app._exit_before_main``); the SystemExit is re-raised with status 0.
  Defines the help flags first (``app.define_help_flags``, idempotent, as
  ``app.run`` does), so that the wrapping is in place before parsing;
  idempotent itself.
  """
  app.define_help_flags()
  for name in HELP_FLAGS:
    flag = flags.FLAGS[name]
    if getattr(flag, "_jax_llar_exits_zero", False):
      continue
    parse = flag.parse

    def parse_exiting_zero(argument, parse=parse):
      try:
        parse(argument)
      except SystemExit as e:
        if e.code == 1:  # the help was printed: a success
          raise SystemExit(0) from None
        raise

    flag.parse = parse_exiting_zero
    flag._jax_llar_exits_zero = True


def _finite_floats() -> None:
  """Registers a validator on every float flag defined so far: a finite
  number or None (absl's bounds compare with nan as false, so nan and inf
  pass them); idempotent."""
  for name in list(flags.FLAGS):
    flag = flags.FLAGS[name]
    if (name != flag.name or not isinstance(flag.parser, flags.FloatParser)
        or getattr(flag, "_jax_llar_finite", False)):
      continue
    flags.register_validator(name, lambda v: v is None or math.isfinite(v),
                             "must be a finite number")
    flag._jax_llar_finite = True


def prepare() -> None:
  """Before parsing: help flags that exit with 0 (`_help_exits_zero`) and
  finite float flags (`_finite_floats`)."""
  _help_exits_zero()
  _finite_floats()


def program_name(main: Callable) -> str:
  """``jax_llar.tools.<tool>`` of the module that defines `main` (also when
  run as ``python -m``, where that module is ``__main__``); a family's
  command line (``jax_llar.tools.<family>.cli``) is named by its family, as
  ``python -m jax_llar.tools.<family>`` runs it."""
  module = sys.modules.get(getattr(main, "__module__", ""), None)
  spec = getattr(module, "__spec__", None)
  name = getattr(spec, "name", None) or getattr(main, "__module__", "jax_llar.tools")
  return name.removesuffix(".cli").removesuffix(".__main__")


def run(main: Callable[..., int | None], *, positional: bool = False) -> None:
  """``absl.app.run`` of `main`; exits with `main`'s return value as the
  status.

  ``--help`` and absl's other help flags print the help and exit with status
  0 (absl's own exit with 1); a flag that does not parse, or a positional
  argument where none is taken, prints the error and exits with status 1;
  a `Refused` raised by `main` prints its line and exits with status 1.

  Args:
    main: the tool's main function, called once the flags are parsed: with
      no arguments, or with `positional`, with the positional arguments
      (argv without the program name); its return value (an int or None
      for 0) is the exit status.
    positional: whether `main` takes positional arguments.

  Raises:
    SystemExit: always (``app.run`` exits), with the status above.
  """
  prog = program_name(main)

  def wrapped(argv: list[str]) -> int | None:
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)
    if len(argv) > 1 and not positional:
      print(f"{prog}: unexpected arguments: {' '.join(argv[1:])} (the tool takes "
            "flags only; --help lists them)")
      return 1
    try:
      return main(argv[1:]) if positional else main()
    except Refused as e:
      print(f"{prog}: {e}", flush=True)
      return 1

  prepare()
  app.run(wrapped)


# --- validators and checks shared by the tools ------------------------------------


# The bounds of a seed flag: flags.DEFINE_integer("seed", 0, "Seed ... " +
# SEED_RANGE, **SEED_BOUNDS) (defined in the tool's own module, so that its
# --help lists it).
SEED_BOUNDS = {"lower_bound": 0, "upper_bound": SEED_MAX}
SEED_RANGE = f"(0 to {SEED_MAX})"


def valid_tag(tag: str) -> bool:
  """Whether `tag` may be part of a result file's name (`TAG_RE`)."""
  return bool(TAG_RE.fullmatch(tag)) and tag not in (".", "..")


def register_tag_validator(name: str = "tag") -> None:
  flags.register_validator(name, lambda v: v is None or valid_tag(v),
                           f"--{name} must be {TAG_RULE}")


def register_int_list_validator(name: str, lo: int, hi: int, what: str,
                                allow_empty: bool = False) -> None:
  """A list flag of integers lo..hi (none empty; the list non-empty unless
  `allow_empty`)."""
  def ok(values: Sequence[str] | None) -> bool:
    if values is None:
      return True
    if not values:
      return allow_empty
    return all(re.fullmatch(r"[0-9]{1,20}", v) and lo <= int(v) <= hi for v in values)
  flags.register_validator(
      name, ok, f"--{name} must be {'' if allow_empty else 'one or more '}{what}, "
                f"integers {lo}-{hi}, separated by commas")


def register_choices_validator(name: str, choices: Sequence[str], allow_empty: bool = False,
                               what: str | None = None) -> None:
  """A list flag whose every item is one of `choices`."""
  known = tuple(choices)
  flags.register_validator(
      name, lambda v: v is None or ((allow_empty or bool(v)) and all(x in known for x in v)),
      f"--{name} must name {'' if allow_empty else 'one or more of '}"
      f"{what or ', '.join(known)}")


def writable_folder(path: str, flag: str = "out", keep: bool = True) -> str:
  """Creates folder `path` (and its parents) and a temporary file in it, to
  show that results can be written there; returns the absolute path. With
  `keep` False the folders it created are removed again (a tool that makes
  the folder only when it writes).

  Raises:
    Refused: naming `flag` when the folder cannot be created or written.
  """
  if not path:
    raise Refused(f"--{flag} is empty: give a folder")
  full = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(full) and not os.path.isdir(full):
    raise Refused(f"--{flag}={path}: exists and is not a folder")
  created = []
  parent = full
  while not os.path.exists(parent):
    created.append(parent)
    parent = os.path.dirname(parent)
  try:
    os.makedirs(full, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".jax_llar_probe_", dir=full)
    os.close(fd)
    os.unlink(probe)
  except OSError as e:
    raise Refused(f"--{flag}={path}: cannot write there ({e.strerror or e})") from None
  finally:
    if not keep:
      for folder in created:  # the deepest first
        try:
          os.rmdir(folder)
        except OSError:
          break
  return full


def writable_file(path: str, flag: str) -> str:
  """Checks that the result file `path` can be written atomically: not a
  folder, not a device or other special file (which an atomic write would
  replace), in a folder that can be created and written (`writable_folder`);
  returns the absolute path.

  Raises:
    Refused: naming `flag` when it cannot.
  """
  if not path:
    raise Refused(f"--{flag} is empty: give a file name")
  full = os.path.abspath(os.path.expanduser(path))
  if path.endswith(os.sep) or os.path.isdir(full):
    raise Refused(f"--{flag}={path}: is a folder, not a file name")
  if os.path.lexists(full) and not os.path.isfile(full):
    raise Refused(f"--{flag}={path}: exists and is not a regular file")
  try:
    writable_folder(os.path.dirname(full), flag)
  except Refused as e:
    raise Refused(f"--{flag}={path}: {str(e).split(': ', 1)[-1]}") from None
  return full


def readable_json(path: str, flag: str, key: str | None = None) -> Any:
  """The JSON document in file `path` (with `key`: which must be in it).

  Raises:
    Refused: naming `flag` when the file is missing, unreadable, not JSON
      or lacks `key`.
  """
  if not path:
    raise Refused(f"--{flag} is empty: give a file")
  if not os.path.exists(path):
    raise Refused(f"--{flag}={path}: no such file")
  if not os.path.isfile(path):
    raise Refused(f"--{flag}={path}: not a regular file")
  try:
    with open(path) as f:
      doc = json.load(f)
  except (OSError, UnicodeDecodeError, ValueError) as e:
    raise Refused(f"--{flag}={path}: not a readable JSON file "
                  f"({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
  if key is not None and not (isinstance(doc, dict) and key in doc):
    raise Refused(f"--{flag}={path}: not a result file (no {key!r})")
  return doc
