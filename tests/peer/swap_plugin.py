"""pytest plugin for the peer suite: installs jax_llar's swap, records what ran.

Loaded by ``run_peer_suite.py`` with ``-p swap_plugin`` in every run. The mode
comes from ``JAX_LLAR_PEER_MODE``:

- ``swapped``: at configuration time, before any test module imports JAX's
  test code, imports jax_llar and calls ``jax_llar.install()``. Without that
  function the run stops with a usage error, so a swapped run never runs
  stock by accident.
- ``stock``: nothing is installed and jax_llar is not imported.

At the end of the session the facts of the run (mode, JAX's backend and
device count, whether jax_llar was imported, what ``install()`` returned) are
written as JSON to ``JAX_LLAR_PEER_FACTS``.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

_facts: dict = {}


def pytest_configure():
  mode = os.environ.get("JAX_LLAR_PEER_MODE", "stock")
  if mode not in ("stock", "swapped"):
    raise pytest.UsageError(f"JAX_LLAR_PEER_MODE={mode!r}: stock or swapped")
  _facts.update(mode=mode, swap_installed=False)
  if mode == "stock":
    return
  import jax_llar  # pylint: disable=g-import-not-at-top
  _facts.update(jax_llar_version=getattr(jax_llar, "__version__", None),
                jax_llar_file=getattr(jax_llar, "__file__", None))
  if not callable(getattr(jax_llar, "install", None)):
    raise pytest.UsageError(
        f"swapped mode: jax_llar {_facts['jax_llar_version']} "
        f"({_facts['jax_llar_file']}) has no install(); refusing to run stock")
  _facts["install_returned"] = repr(jax_llar.install())
  _facts["swap_installed"] = True


def pytest_sessionfinish():
  path = os.environ.get("JAX_LLAR_PEER_FACTS")
  if not path:
    return
  facts = dict(_facts, jax_llar_imported="jax_llar" in sys.modules)
  jax = sys.modules.get("jax")
  if jax is not None:
    try:
      client = jax.devices()[0].client
      version = str(getattr(client, "platform_version", ""))
      platform = jax.default_backend()
      if platform == "gpu":  # the file names say which kind of GPU
        platform = "rocm" if "rocm" in version.lower() else "cuda"
      facts.update(jax_version=jax.__version__, platform=platform,
                   platform_version=version, device_count=jax.device_count())
    except Exception as e:  # pylint: disable=broad-except
      facts["jax_error"] = f"{type(e).__name__}: {e}"
  llar = sys.modules.get("jax_llar")
  if llar is not None and callable(getattr(llar, "installed", None)):
    facts["installed_at_end"] = bool(llar.installed())
  if llar is not None and callable(getattr(llar, "dispatch_log", None)):
    decisions = llar.dispatch_log()
    facts["dispatch_decisions"] = len(decisions)
    facts["dispatch_impls"] = sorted({str(getattr(d, "impl", "?"))
                                      for d in decisions})
  with open(path, "w", encoding="utf-8") as f:
    json.dump(facts, f, indent=1, sort_keys=True)
