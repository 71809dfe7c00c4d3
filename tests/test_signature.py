"""Call signatures (jax_llar.signature, issue 12 item 1), on CPU.

The hash (`signature_of`): deterministic across processes, in 1..65535,
sensitive to each input. The lowering (as text, for CUDA on CPU devices with
decide() giving the fast path, as tests/test_lowering.py does): every FFI call
carries a nonzero ``signature`` attribute, distinct within the module, equal
when the same program is lowered again, 0 with signatures off, a lowering of
its own after the setting changes (jit's cache key), the fused call one of
its own; the registry maps each to its op name. The setting from the
environment. The decoding of error reports (``jax_llar.error_reports()``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_llar
from jax_llar import algorithms, config, dispatch, signature
from jax_llar.reports import decode_report
from jax_llar.algorithms import Algorithm
from jax_llar.config import settings as llar_settings

from cpu_helpers import BF16, mesh_of, random_input

ONE_SHOT_LL = Algorithm.ONE_SHOT_LL
OP = "jax_llar.one_shot_ll.bf16.1024B.2ranks"


# --- the hash -----------------------------------------------------------------------


def test_signature_of_is_in_range_nonzero_and_input_sensitive():
  base = ("jit_step", 0, OP, "model.py:42 (step)")
  sig = signature.signature_of(*base)
  assert 1 <= sig <= signature.MAX_SIGNATURE
  assert sig == signature.signature_of(*base)
  changed = [signature.signature_of("jit_other", 0, OP, base[3]),
             signature.signature_of(base[0], 1, OP, base[3]),
             signature.signature_of(base[0], 0, OP.replace("1024B", "2048B"), base[3]),
             signature.signature_of(base[0], 0, OP, "model.py:43 (step)"),
             signature.signature_of(*base, salt=1)]
  assert sig not in changed, changed
  # 20000 distinct calls: never 0, never above 16 bits, spread over the range.
  sigs = [signature.signature_of("m", i, OP) for i in range(20000)]
  assert min(sigs) >= 1 and max(sigs) <= 65535
  assert len(set(sigs)) > 16000  # a uniform 16-bit hash keeps ~17300 distinct
  with pytest.raises(ValueError):
    signature.signature_of("m", -1, OP)


def test_signature_of_is_the_same_in_another_process():
  """Not Python's hash(): another process with another hash seed agrees."""
  args = [("jit_a", 0, OP, ""), ("jit__lambda", 7, OP, "x.py:1 (f)")]
  want = [signature.signature_of(*a) for a in args]
  code = ("from jax_llar import signature; print([signature.signature_of(*a) for a in "
          f"{args!r}])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONHASHSEED="12345", JAX_PLATFORMS="cpu"),
                       timeout=300, check=True)
  assert out.stdout.strip() == str(want)


def test_signatures_setting_from_the_environment(monkeypatch):
  monkeypatch.delenv("JAX_LLAR_SIGNATURES", raising=False)
  assert config._from_env().signatures is True  # pylint: disable=protected-access
  for raw, want in (("0", False), ("off", False), ("1", True), ("", True)):
    monkeypatch.setenv("JAX_LLAR_SIGNATURES", raw)
    assert config._from_env().signatures is want, raw  # pylint: disable=protected-access
  monkeypatch.setenv("JAX_LLAR_SIGNATURES", "maybe")
  with pytest.raises(ValueError, match="JAX_LLAR_SIGNATURES"):
    config._from_env()  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="signatures must be a bool"):
    llar_settings.signatures = "yes"


# --- the lowering -------------------------------------------------------------------


def _fast(axis_ctx, aval, axes, *, platform, op="psum", **kw):
  """decide() that gives every psum the one-shot fast path (no GPU here)."""
  del axis_ctx, platform, kw
  nbytes = int(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize
  return jax_llar.Decision(
      reason="fast_path", detail="", axes=tuple(axes), dtype=str(aval.dtype),
      bytes_per_rank=nbytes, world_size=2, algorithm=ONE_SHOT_LL, candidate=ONE_SHOT_LL,
      comm_id=7, comm_key=4242, op=op)


def _program(v):
  """Three psums, one of them in a rank-dependent branch, and a fused op."""
  a = jax_llar.psum(v, "x")
  b = lax.cond(lax.axis_index("x") == 0, lambda u: jax_llar.psum(u, "x"),
               lambda u: u, a)
  c = jax_llar.psum(b * 2, "x")
  normed, _ = jax_llar.psum_add_rms_norm(c, c, np.ones((512,), np.float32), "x")
  return normed


def _lower(fn, x, mesh):
  f = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                            check_vma=False))
  return f, f.trace(x).lower(lowering_platforms=("cuda",)).as_text()


def _signatures(text: str) -> list[int]:
  return [int(s) for s in re.findall(r"signature = (\d+) : i64", text)]


@pytest.fixture
def fast_path(monkeypatch):
  monkeypatch.setattr(dispatch, "decide", _fast)
  signature.clear()
  yield
  signature.clear()


def test_every_call_carries_a_distinct_signature(fast_path):
  del fast_path
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(1), (2, 512), BF16)
  _, text = _lower(_program, x, mesh)
  sigs = _signatures(text)
  assert text.count("custom_call @jax_llar_all_reduce(") == 3, text
  assert text.count("custom_call @jax_llar_all_reduce_add_rms_norm") == 1
  assert len(sigs) == 4 and all(1 <= s <= 65535 for s in sigs), sigs
  assert len(set(sigs)) == 4, sigs  # distinct within the module
  # The registry names each: three psums and the fused call.
  names = [c.op_name for s in sigs for c in signature.calls(s)]
  assert sorted(names) == sorted(["jax_llar.one_shot_ll.bf16.1024B.2ranks"] * 3 +
                                 ["jax_llar.one_shot_ll_add_rms_norm.bf16.1024B.2ranks"])
  calls = [signature.calls(s)[0] for s in sigs]
  assert sorted(c.index for c in calls) == [0, 1, 2, 3]
  assert all(c.module.startswith("jit_") for c in calls)
  assert all("test_signature.py:" in c.site for c in calls), calls
  # The same program lowered again: the same signatures.
  _, again = _lower(_program, x, mesh)
  assert _signatures(again) == sigs


def test_signature_depends_on_the_call_not_only_on_the_shape(fast_path):
  """Two psums of the same shape, dtype and size in one program, and the
  same psum in two programs of different call sites, differ."""
  del fast_path
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(2), (2, 512), BF16)
  _, text = _lower(lambda v: jax_llar.psum(jax_llar.psum(v, "x"), "x"), x, mesh)
  a, b = _signatures(text)
  assert a != b
  _, other = _lower(lambda v: jax_llar.psum(v, "x") + 1, x, mesh)
  assert _signatures(other)[0] not in (a, b)


def test_identical_fused_calls_get_their_own_signatures(fast_path):
  """The fused op's lowering is not cached per module: two fused calls of
  the same shapes are two instructions with two signatures (a mispairing
  of the two is then detected too)."""
  del fast_path
  mesh = mesh_of((2,), ("x",))
  w = np.ones((512,), np.float32)

  def two(v):
    a, r = jax_llar.psum_add_rms_norm(v, v, w, "x")
    b, _ = jax_llar.psum_add_rms_norm(a, r, w, "x")
    return b

  _, text = _lower(two, random_input(np.random.default_rng(6), (2, 512), BF16), mesh)
  assert text.count("custom_call @jax_llar_all_reduce_add_rms_norm") == 2
  a, b = _signatures(text)
  assert a != b and a and b


def test_signatures_off_give_zero_and_relower(fast_path, monkeypatch):
  del fast_path
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(3), (2, 512), BF16)
  f, text = _lower(_program, x, mesh)
  assert all(_signatures(text))
  monkeypatch.setattr(llar_settings, "signatures", False)
  # The same jitted function: the setting is part of jit's cache keys.
  off = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
  assert _signatures(off) == [0, 0, 0, 0]
  monkeypatch.setattr(llar_settings, "signatures", True)
  assert _signatures(f.trace(x).lower(lowering_platforms=("cuda",)).as_text()) == \
      _signatures(text)


def test_status_reports_the_signatures(fast_path):
  del fast_path
  mesh = mesh_of((2,), ("x",))
  _lower(_program, random_input(np.random.default_rng(5), (2, 512), BF16), mesh)
  st = jax_llar.status()["signatures"]
  assert st["enabled"] is True and st["lowered"] == 4
  assert st["signed"] == sorted(a.short_name for a in algorithms.SIGNED)


def test_signed_algorithms_are_the_flag_protocols():
  assert algorithms.SIGNED == {Algorithm.ONE_SHOT_LL, Algorithm.TWO_SHOT_LL,
                               Algorithm.ONE_SHOT_LL128, Algorithm.TWO_SHOT_LL128}
  assert Algorithm.ONE_SHOT_SENTINEL not in algorithms.SIGNED
  assert Algorithm.NCCL_LLA2A_ONE_SHOT not in algorithms.SIGNED


# --- error reports -------------------------------------------------------------------


def _raw(**kw):
  r = {"comm_id": 3, "device": 1, "code": 2, "rank": 1, "peer": 0, "block": 0,
       "line": 5, "epoch": 70001, "flag_expected": 0, "flag_seen": (0, 0),
       "waited_ns": 0, "signature_expected": 0, "signature_seen": 0,
       "flag_epoch_bits": 16}
  r.update(kw)
  return r


def _ll_flag(epoch: int, sig: int) -> int:
  """ll.cuh's flag(E, S)."""
  return (sig << 16) | (epoch & 0xFFFF) | 1


def test_foreign_signature_report_is_decoded(fast_path):
  del fast_path
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(4), (2, 512), BF16)
  _, text = _lower(lambda v: jax_llar.psum(jax_llar.psum(v, "x"), "x"), x, mesh)
  mine, theirs = _signatures(text)
  epoch = 70001
  r = decode_report(_raw(
      flag_expected=_ll_flag(epoch, mine),
      flag_seen=(_ll_flag(epoch, theirs), _ll_flag(epoch, theirs)),
      signature_expected=mine, signature_seen=theirs))
  assert r["what"] == "foreign signature"
  assert r["epoch_bits_expected"] == r["epoch_bits_seen"] == (epoch & 0xFFFF) | 1
  assert r["calls_expected"] == r["calls_seen"] == [OP]
  assert f"signature {mine}" in r["message"] and f"signature {theirs}" in r["message"]
  assert "restart the process" in r["message"]
  assert "rank 0's line" in r["message"]


def test_ll128_and_timeout_reports_are_decoded():
  # LL128: 32 epoch bits in the flag word's low half, the signature high.
  epoch = (1 << 32) + 9
  r = decode_report(_raw(flag_expected=(epoch & 0xFFFFFFFF) | 1,
                                flag_seen=((epoch & 0xFFFFFFFF) | 1, 77),
                                signature_expected=76, signature_seen=77,
                                flag_epoch_bits=32))
  assert r["epoch_bits_expected"] == r["epoch_bits_seen"] == 9
  assert r["calls_expected"] == [] and r["calls_seen"] == []
  # A timeout of a protocol without signatures (the sentinel's folds).
  t = decode_report(_raw(code=1, flag_epoch_bits=0, flag_expected=0xFFFFFFFF,
                                flag_seen=(0xFFFFFFFF, 0xFFFFFFFF), waited_ns=2_000_000_000))
  assert t["what"] == "timeout" and t["epoch_bits_expected"] is None
  assert "timed out after 2000 ms" in t["message"] and "never arrived" in t["message"]
  assert decode_report(_raw(code=9))["what"] == "code 9"

