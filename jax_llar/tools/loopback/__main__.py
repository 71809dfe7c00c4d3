"""``python -m jax_llar.tools.loopback``: the loopback command line (cli)."""

from absl import flags

from jax_llar.tools import _cli
from jax_llar.tools.loopback import cli

# absl's --help prints the main module's docstring and key flags: the cli's.
__doc__ = cli.__doc__  # pylint: disable=redefined-builtin
flags.adopt_module_key_flags(cli)
_cli.run(cli.main)
