"""Call signatures: a mispaired fast-path call fails instead of summing another call's data.

The barrier-free kernels pair the k-th call of an algorithm on each GPU with
the k-th call of that algorithm on every peer (ffi/include/llar/epoch.cuh).
When the GPUs do not run the same sequence of calls, the k-th calls are
different calls: two Python threads whose programs interleave differently
per GPU (XLA gives no cross-device order for a custom call), or a
rank-dependent extra call (a ``lax.cond`` on ``axis_index``) followed by
more calls. Without more information a kernel would then add one call's
data to another's: a wrong sum, without an error.

So every fast-path call carries a 16-bit signature, computed here at lowering
and passed to the kernel as the static FFI attribute ``signature``. The
algorithms of ``jax_llar.algorithms.SIGNED`` put it into the flag words of
every line they send (ffi/include/llar/ll.cuh, ll128.cuh), and a wait that
finds a line of its own epoch with another signature reports it at once and
fails the call (``jax_llar.error_reports()``: code 2, "foreign signature",
with both signatures, which `calls` maps back to the op names that carry
them). A mispaired call therefore ends in that error or in the bounded wait's
timeout, never in a wrong sum.

The signature is a hash (`signature_of`) of
  * the module's name (``jit_<function>``),
  * the call's index among the fast-path calls lowered into that module, in
    lowering order,
  * the op name (``jax_llar.<algorithm>.<dtype>.<bytes>B.<ranks>ranks``:
    algorithm, dtype, bytes per rank and number of ranks),
  * the call site: the user's source line of the psum (file name without its
    directory, line, function), when the lowering knows it;
mapped to 1..65535 (0 means "signatures off"). Within one module the calls'
signatures are distinct: a hash that collides with an earlier call's of the
same module is taken again with a salt (`assign`), which depends only on the
module's own lowering order.

Same on every rank: every device of a group runs the same HLO instruction,
lowered once, so in one process every rank's call carries the same
signature. With several processes (not served by the fast path yet), each
process must lower the same program in the same way (the same source,
jax_llar and JAX versions, and settings), which SPMD programs do.

Limits:
  * Calls with the same signature cannot be told apart: the same call site
    of the same program run twice at once (one jitted function dispatched by
    two threads), or two modules of the same name whose calls hash alike
    (16 bits: a collision between two given calls of different modules has
    probability 2^-16; `assign` logs each one it sees in this process).
  * ``one_shot_sentinel`` (no flag words) and ``nccl_lla2a_one_shot`` (NCCL's
    own flags) carry no signature (``jax_llar.algorithms.SIGNED``); the
    tuning tables do not choose them unless asked to.
  * ``JAX_LLAR_SIGNATURES=0`` (``settings.signatures = False``) gives every
    call signature 0: no mispairing is detected then.

Example::

    >>> sig = signature_of("jit_step", 0, "jax_llar.one_shot_ll.bf16.1024B.2ranks",
    ...                    "model.py:42 (step)")
    >>> 1 <= sig <= MAX_SIGNATURE
    True

Source: the request of issue 12 (jax_llar); the flag-word layout follows the
LL protocol of NCCL and arXiv 2607.16100, section 3.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
import weakref
from typing import Any

from jax_llar import log
from jax_llar.config import settings

# Width of a signature (args.h: kSignatureBits; the extension exports it as
# SIGNATURE_BITS, checked when it loads).
SIGNATURE_BITS = 16
MAX_SIGNATURE = (1 << SIGNATURE_BITS) - 1

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class Call:
  """One fast-path call lowered in this process, and its signature.

  Attributes:
    signature: 1..MAX_SIGNATURE.
    op_name: the call's op name (``jax_llar.lowering.op_name``).
    module: the lowered module's name.
    index: the call's index among the module's fast-path calls.
    site: ``file:line (function)`` of the user's psum, or "".
  """
  signature: int
  op_name: str
  module: str
  index: int
  site: str

  def to_dict(self) -> dict[str, Any]:
    """The call as a JSON-ready dict (the fields above), as jax_llar.status()
    and the error reports show it."""
    return dataclasses.asdict(self)


def signature_of(module: str, index: int, op_name: str, site: str = "",
                 salt: int = 0) -> int:
  """The signature of a call: a hash of its module name, index, op name,
  site (and `salt`), in 1..MAX_SIGNATURE.

  Deterministic across processes and Python runs (a BLAKE2 digest, not
  Python's ``hash``). `site` should not hold a directory: processes may run
  the same file from different paths.

  Raises:
    ValueError: index or salt negative.
  """
  if index < 0 or salt < 0:
    raise ValueError(f"index and salt must be >= 0, got {index}, {salt}")
  text = "\x1f".join((module, str(index), op_name, site, str(salt)))
  digest = hashlib.blake2s(text.encode("utf-8"), digest_size=4).digest()
  return 1 + int.from_bytes(digest, "little") % MAX_SIGNATURE


# --- what this process lowered ------------------------------------------------

_lock = threading.Lock()
_calls: dict[int, list[Call]] = {}   # signature -> the distinct calls carrying it
_CALLS_PER_SIGNATURE = 64            # bound on one signature's list


class _ModuleState:
  __slots__ = ("next_index", "used")

  def __init__(self):
    self.next_index = 0
    self.used: set[int] = set()


_modules: "weakref.WeakKeyDictionary[Any, _ModuleState]" = weakref.WeakKeyDictionary()


def _module_name(module) -> str:
  try:
    return str(module.operation.attributes["sym_name"]).strip('"')
  except (KeyError, AttributeError):
    return ""


def call_site(traceback) -> tuple[str, str]:
  """(for the hash, for people): ``name.py:line (function)`` and
  ``/path/name.py:line (function)`` of the innermost frame of `traceback`
  outside JAX and outside jax_llar, or ("", "") when there is none."""
  if traceback is None:
    return "", ""
  try:
    from jax._src import source_info_util  # pylint: disable=g-import-not-at-top
    for frame in source_info_util.user_frames(traceback):
      path = os.path.abspath(frame.file_name)
      if os.path.dirname(path) == _PACKAGE_DIR:
        continue
      tail = f":{frame.start_line} ({frame.function_name})"
      return os.path.basename(path) + tail, frame.file_name + tail
  except Exception:  # noqa: BLE001 - the site only refines the hash
    pass
  return "", ""


def assign(module_context, op_name: str, traceback) -> int:
  """The signature of the next fast-path call lowered into `module_context`'s
  module (0 when ``settings.signatures`` is off), recorded for `calls`.

  Within one module no two calls get the same signature: a hash equal to an
  earlier call's of the module is taken again with salt 1, 2, ...
  A signature equal to one of another module's calls lowered earlier in
  this process is kept (it must be the same in every process) and logged
  once: a mispairing of those two calls would not be detected.

  Args:
    module_context: the lowering's ``mlir.ModuleContext``.
    op_name: the call's op name.
    traceback: the equation's traceback (``ctx.traceback``), or None.
  """
  if not settings.signatures:
    return 0
  module = module_context.module
  name = _module_name(module)
  hashed_site, shown_site = call_site(traceback)
  with _lock:
    state = _modules.get(module)
    if state is None:
      state = _modules[module] = _ModuleState()
    index = state.next_index
    state.next_index += 1
    salt = 0
    sig = signature_of(name, index, op_name, hashed_site)
    while sig in state.used:
      salt += 1
      sig = signature_of(name, index, op_name, hashed_site, salt)
    state.used.add(sig)
    call = Call(sig, op_name, name, index, shown_site)
    known = _calls.setdefault(sig, [])
    clash = [c for c in known if (c.module, c.index, c.op_name, c.site) !=
             (call.module, call.index, call.op_name, call.site)]
    if call not in known and len(known) < _CALLS_PER_SIGNATURE:
      known.append(call)
  if clash:
    other = clash[0]
    log.log_once(f"signature-clash:{sig}:{other.module}:{other.index}:{name}:{index}", (
        f"jax_llar: call signature {sig} of {op_name} (module {name}, call "
        f"{index}) equals that of {other.op_name} (module {other.module}, call "
        f"{other.index}): a mispairing of these two calls would not be detected"),
        logging.INFO)
  return sig


def calls(signature: int) -> list[Call]:
  """The fast-path calls lowered in this process that carry `signature`
  (empty for 0 or an unknown one), oldest first."""
  with _lock:
    return list(_calls.get(int(signature), ()))


def lowered() -> dict[int, list[Call]]:
  """Every signature lowered in this process -> its calls."""
  with _lock:
    return {k: list(v) for k, v in _calls.items()}


def clear() -> None:
  """Forgets the calls recorded so far (tests)."""
  with _lock:
    _calls.clear()
