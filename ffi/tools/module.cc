// Python module `jax_llar.tools._llar_tools`: what production does not need.
// The copy targets' FFI capsules, the kernel bench, the speed-of-light
// probes, the call trace and the test hooks. It links the core library of
// jax_llar._llar and works on that module's communicator sets, so import it
// only after jax_llar._ext.load() has returned the production module (which
// binds the process's libnccl.so.2 first). Importing it makes no CUDA call,
// nor does registrations() while no communicator set exists.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "copy.h"
#include "hooks.h"
#include "kernel_bench.h"
#include "llar/args.h"
#include "one_shot_ll_diag.h"
#include "preload.h"
#include "sol.h"

namespace nb = nanobind;

NB_MODULE(_llar_tools, m) {
  m.doc() = "jax_llar native tools: kernel bench, speed of light, call trace, "
            "test hooks, copy kernels.";

  m.def(
      "registrations",
      []() {
        // The copy kernels (and the diagnostic variants) get loaded,
        // best-effort, on every device of every communicator set, now and
        // later, so that XLA captures no lazy load (preload.h). Without
        // communicator sets this makes no CUDA call; it never raises.
        llar::EnsureToolKernelsPreloaded();
        const llar::CopyHandlers h = llar::GetCopyHandlers();
        nb::dict out;
        out["jax_llar_copy"] = nb::capsule(h.copy);
        out["jax_llar_copy_wide"] = nb::capsule(h.wide_copy);
        return out;
      },
      "Target name -> execute capsule of the copy targets (kCmdBufferCompatible).");

  nb::dict dtype_codes;
  dtype_codes["float32"] = static_cast<int>(llar::DType::kF32);
  dtype_codes["bfloat16"] = static_cast<int>(llar::DType::kBF16);
  dtype_codes["float16"] = static_cast<int>(llar::DType::kF16);
  dtype_codes["int32"] = static_cast<int>(llar::DType::kI32);
  m.attr("DTYPE_CODES") = dtype_codes;

  m.def(
      "kernel_bench",
      [](int64_t comm_id, const std::string& kind, int dtype,
         const std::vector<nb::bytes>& inputs, int iters, int reps,
         const std::string& variant, bool generic, uint32_t block_lines) {
        std::vector<std::vector<uint8_t>> in;
        for (const auto& b : inputs) {
          const auto* p = static_cast<const uint8_t*>(b.data());
          in.emplace_back(p, p + b.size());
        }
        llar::KernelBenchSpec spec;
        spec.kind = kind;
        spec.variant = variant;
        spec.generic = generic;
        spec.block_lines = block_lines;
        llar::KernelBenchResult r;
        {
          nb::gil_scoped_release release;
          r = llar::RunKernelBench(comm_id, spec, static_cast<llar::DType>(dtype), in,
                                   iters, reps);
        }
        nb::list outs;
        for (const auto& o : r.outputs) {
          outs.append(nb::bytes(reinterpret_cast<const char*>(o.data()), o.size()));
        }
        return nb::make_tuple(r.us_per_call, outs);
      },
      nb::arg("comm_id"), nb::arg("kind"), nb::arg("dtype"), nb::arg("inputs"),
      nb::arg("iters"), nb::arg("reps"), nb::arg("variant") = "",
      nb::arg("generic") = false, nb::arg("block_lines") = 0,
      "Kernel-level benchmark on group 0 of a communicator set: "
      "(us per call [rep][rank], outputs per rank as bytes). kind: one_shot_ll, "
      "copy or nccl; dtype: a DTYPE_CODES value; variant (one_shot_ll): '', "
      "loopback, send_loopback or traced; generic: the run-time world-size "
      "kernel; block_lines: the grid rule's lines per block (0: production). "
      "ValueError for bad arguments, RuntimeError for CUDA/NCCL failures.");

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

  m.def("enable_call_trace", &llar::EnableCallTrace, nb::arg("comm_id"),
        "Start recording device timestamps of every call (TRACE_SLOTS entries) "
        "in programs captured from now on; call it while no other thread runs "
        "programs.");
  m.def("disable_call_trace", &llar::DisableCallTrace, nb::arg("comm_id"),
        "Stop recording device timestamps (the last buffer stays readable).");
  m.def(
      "read_call_trace",
      [](int64_t comm_id, int32_t device) {
        auto r = llar::ReadCallTrace(comm_id, device);
        return nb::make_tuple(r.first, r.second);
      },
      nb::arg("comm_id"), nb::arg("device"),
      "(calls so far, 2 * TRACE_SLOTS words of sent/end ns); words empty when "
      "the trace was never enabled.");
  m.attr("TRACE_SLOTS") = llar::kTraceSlots;

  m.def("set_epoch_for_testing", &llar::SetEpochForTesting, nb::arg("comm_id"),
        nb::arg("epoch"),
        "Test hook (F4): every epoch counter of the set := epoch; scratch re-zeroed.");
  m.def("set_drop_peer_writes_for_testing", &llar::SetDropPeerWritesForTesting,
        nb::arg("comm_id"), nb::arg("device"), nb::arg("drop"),
        "Test hook (F13): programs captured afterwards on `device` never store "
        "to its peers (False restores the all-reduce).");
}
