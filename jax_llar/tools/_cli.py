"""What every command-line tool of jax_llar does around its main function.

absl turns logging up to INFO once flags are parsed unless ``--verbosity``
is given; the tools keep it at WARNING then, so that only what a user acts
on (jax_llar's fallback reasons, JAX's warnings) is printed.

absl's help flags (``--help``, ``-?``, ``--helpshort``, ``--helpfull``,
``--helpxml``) print the help and then exit with status 1, as if the command
had failed (absl.app.HelpFlag); the tools exit with status 0 instead: the
help asked for was given. A flag that does not parse still exits with 1.
"""

from __future__ import annotations

from typing import Callable

from absl import app, flags, logging

# absl's flags that print help and exit before main.
HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml")


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


def run(main: Callable[[], int | None]) -> None:
  """``absl.app.run`` of `main` (no positional arguments accepted); exits
  with `main`'s return value as the status.

  ``--help`` and absl's other help flags print the help and exit with status
  0 (absl's own exit with 1); a flag that does not parse, or a positional
  argument, prints the error and exits with status 1.

  Args:
    main: the tool's main function, called with no arguments once the flags
      are parsed; its return value (an int or None for 0) is the exit status.

  Raises:
    SystemExit: always (``app.run`` exits), with the status above.
  """

  def wrapped(argv: list[str]) -> int | None:
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)
    return main()

  _help_exits_zero()
  app.run(wrapped)
