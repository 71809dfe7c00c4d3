"""What every command-line tool of jax_llar does around its main function.

absl turns logging up to INFO once flags are parsed unless ``--verbosity``
is given; the tools keep it at WARNING then, so that only what a user acts
on (jax_llar's fallback reasons, JAX's warnings) is printed.
"""

from __future__ import annotations

from typing import Callable

from absl import app, flags, logging


def run(main: Callable[[], int | None]) -> None:
  """``absl.app.run`` of `main` (no positional arguments accepted); exits
  with `main`'s return value as the status."""

  def wrapped(argv: list[str]) -> int | None:
    if len(argv) > 1:
      raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)
    return main()

  app.run(wrapped)
