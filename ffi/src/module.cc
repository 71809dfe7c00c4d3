// Python module `jax_llar._llar`: hands out FFI capsules and exposes the
// communicator registry. No policy lives here; jax_llar/ decides.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <vector>

#include "handlers.h"
#include "kernel_bench.h"
#include "sol.h"
#include "llar/args.h"
#include "registry.h"

namespace nb = nanobind;

namespace {

nb::capsule Capsule(void* fn) { return nb::capsule(fn); }

}  // namespace

NB_MODULE(_llar, m) {
  m.doc() = "jax_llar CUDA extension: XLA FFI handlers and NCCL communicators.";

  m.def("registrations", []() {
    const llar::HandlerTable h = llar::GetHandlers();
    nb::dict all_reduce;
    all_reduce["instantiate"] = Capsule(h.all_reduce_instantiate);
    all_reduce["execute"] = Capsule(h.all_reduce_execute);
    nb::dict out;
    out["jax_llar_all_reduce"] = all_reduce;
    out["jax_llar_copy"] = Capsule(h.copy_execute);
    out["jax_llar_copy_wide"] = Capsule(h.wide_copy_execute);
    return out;
  }, "Target name -> capsule (or dict of stage -> capsule).");

  m.def(
      "create_comm_set",
      [](const std::vector<std::vector<int>>& groups, uint64_t timeout_ns) {
        nb::gil_scoped_release release;
        return llar::CreateCommSet(groups, timeout_ns);
      },
      nb::arg("groups"), nb::arg("timeout_ns"),
      "Creates NCCL communicators + symmetric scratch for replica groups of "
      "local CUDA ordinals; returns the communicator-set id. Raises "
      "RuntimeError on failure.");

  m.def("comm_key", &llar::KeyOf, nb::arg("comm_id"),
        "Fingerprint of a communicator set's groups (the FFI attribute comm_key).");
  m.def("scratch_bytes", &llar::ScratchBytesOf, nb::arg("comm_id"),
        "Bytes of symmetric scratch per device of a communicator set.");

  m.def("error_reports", []() {
    nb::list out;
    for (const auto& r : llar::ErrorReports()) {
      nb::dict d;
      d["comm_id"] = r.comm_id;
      d["device"] = r.ordinal;
      d["code"] = r.record.code;
      d["rank"] = r.record.rank;
      d["peer"] = r.record.peer;
      d["block"] = r.record.block;
      d["line"] = r.record.line;
      d["epoch"] = r.record.epoch;
      d["flag_expected"] = r.record.flag_expected;
      d["flag_seen"] = nb::make_tuple(r.record.flag_seen, r.record.flag_seen2);
      d["waited_ns"] = r.record.waited_ns;
      out.append(d);
    }
    return out;
  }, "Timeout reports written by bounded waits (host-mapped, survive a trap).");

  m.def("set_epoch_for_testing", &llar::SetEpochForTesting, nb::arg("comm_id"),
        nb::arg("epoch"));
  m.def("set_drop_peer_writes_for_testing", &llar::SetDropPeerWritesForTesting,
        nb::arg("comm_id"), nb::arg("device"), nb::arg("drop"));

  m.def("enable_call_trace", &llar::EnableCallTrace, nb::arg("comm_id"),
        "Start recording device timestamps of every call (args.h: kTraceSlots); "
        "a diagnostic: call it while no other thread runs programs.");
  m.def("disable_call_trace", &llar::DisableCallTrace, nb::arg("comm_id"),
        "Stop recording device timestamps (the last buffer stays readable).");
  m.def(
      "read_call_trace",
      [](int64_t comm_id, int32_t device) {
        auto r = llar::ReadCallTrace(comm_id, device);
        return nb::make_tuple(r.first, r.second);
      },
      nb::arg("comm_id"), nb::arg("device"),
      "(calls so far, 2 * TRACE_SLOTS words of start/end ns); words empty when off.");
  m.attr("TRACE_SLOTS") = llar::kTraceSlots;

  m.def(
      "kernel_bench",
      [](int64_t comm_id, const std::string& impl, int dtype,
         const std::vector<nb::bytes>& inputs, int iters, int reps) {
        std::vector<std::vector<uint8_t>> in;
        for (const auto& b : inputs) {
          const auto* p = static_cast<const uint8_t*>(b.data());
          in.emplace_back(p, p + b.size());
        }
        llar::KernelBenchResult r;
        {
          nb::gil_scoped_release release;
          r = llar::RunKernelBench(comm_id, impl, static_cast<llar::DType>(dtype), in,
                                   iters, reps);
        }
        nb::list outs;
        for (const auto& o : r.outputs) {
          outs.append(nb::bytes(reinterpret_cast<const char*>(o.data()), o.size()));
        }
        return nb::make_tuple(r.us_per_call, outs);
      },
      nb::arg("comm_id"), nb::arg("impl"), nb::arg("dtype"), nb::arg("inputs"),
      nb::arg("iters"), nb::arg("reps"),
      "Kernel-level benchmark: (per-rep per-rank us per call, per-rank outputs).");

  m.def(
      "sol",
      [](const std::vector<int>& ordinals, int iters) {
        llar::SolResult r;
        {
          nb::gil_scoped_release release;
          r = llar::RunSol(ordinals, iters);
        }
        nb::dict d;
        d["fence_ns"] = r.fence_ns;
        d["fence_system_ns"] = r.fence_system_ns;
        d["l2_chase_ns"] = r.l2_chase_ns;
        d["remote_4b_ns"] = r.remote_4b_ns;
        d["remote_ll_ns"] = r.remote_ll_ns;
        d["fanout_ll_ns"] = r.fanout_ll_ns;
        d["empty_kernel_graph_us"] = r.empty_kernel_graph_us;
        return d;
      },
      nb::arg("ordinals"), nb::arg("iters"),
      "Speed-of-light microbenchmarks on the given CUDA ordinals (ns / us).");

  m.def("nccl_runtime_version", &llar::NcclRuntimeVersion);
  m.def("nccl_compiled_version", &llar::NcclCompiledVersion);
  m.def("cuda_device_count", &llar::CudaDeviceCount);
  m.def("can_access_peer", &llar::CanAccessPeer);

  m.attr("MAX_RANKS") = llar::kMaxRanks;
  m.attr("ONE_SHOT_MAX_BYTES") = llar::kOneShotMaxBytes;
  m.attr("ALGORITHM_ONE_SHOT_LL") = static_cast<int>(llar::Algorithm::kOneShotLL);
}
