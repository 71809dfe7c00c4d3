// Python module `jax_llar.tools._llar_tools`: what production does not need.
// The copy targets' FFI capsules, the kernel bench, the speed-of-light
// probes, the call trace, the test hooks and the loopback harness. It links the core library of
// jax_llar._llar and works on that module's communicator sets, so import it
// only after jax_llar._ext.load() has returned the production module (which
// binds the process's libnccl.so.2 first). Importing it makes no CUDA call,
// nor does registrations() while no communicator set exists.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "copy.h"
#include "hooks.h"
#include "kernel_bench.h"
#include "llar/args.h"
#include "loopback.h"
#include "loopback_add_rms_norm.h"
#include "loopback_group.h"
#include "one_shot_ll_diag.h"
#include "preload.h"
#include "registry.h"
#include "registry/seams.h"
#include "sol.h"
#include "store_atomicity.h"

namespace nb = nanobind;

namespace {

// The loopback harness's inputs: (n_sets, world, n) of any element type, C order.
using LoopbackInputs =
    nb::ndarray<nb::ro, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

llar::LoopbackSpec MakeLoopbackSpec(int world, uint32_t n_bytes, int dtype, int calls,
                                    bool sync, int keep, int64_t algorithm, bool generic,
                                    uint32_t block_lines, double timeout_ms,
                                    uint64_t start_epoch, uint32_t misalign, int skip_rank,
                                    int skip_call, int32_t ordinal, bool signatures = true,
                                    uint32_t signature_seed = 0, int extra_call_rank = -1,
                                    int swap_signature_rank = -1, int fault_call = 0) {
  llar::LoopbackSpec s;
  s.ordinal = ordinal;
  s.world = world;
  s.dtype = static_cast<llar::DType>(dtype);
  s.n_bytes = n_bytes;
  s.algorithm = algorithm;
  s.generic = generic;
  s.block_lines = block_lines;
  if (!(timeout_ms > 0) || timeout_ms > 600000) {
    throw std::invalid_argument("jax_llar loopback: the timeout must be 1-600000 ms");
  }
  s.timeout_ns = static_cast<uint64_t>(timeout_ms * 1e6);
  s.calls = calls;
  s.sync_between_calls = sync;
  s.keep = keep;
  s.start_epoch = start_epoch;
  s.misalign = misalign;
  s.skip_rank = skip_rank;
  s.skip_call = skip_call;
  s.signed_calls = signatures;
  s.signature_seed = signature_seed;
  s.extra_call_rank = extra_call_rank;
  s.swap_signature_rank = swap_signature_rank;
  s.fault_call = fault_call;
  return s;
}

nb::dict PlanDict(const llar::LoopbackPlan& p) {
  nb::dict d;
  d["blocks"] = p.blocks;
  d["lines_per_block"] = p.lines_per_block;
  d["threads"] = p.threads;
  d["steps"] = p.steps;
  d["regs_per_thread"] = p.regs_per_thread;
  d["blocks_per_sm"] = p.blocks_per_sm;
  d["sms"] = p.sms;
  d["co_resident"] = p.co_resident;
  d["generic_kernel"] = p.generic_kernel;
  d["device_bytes"] = p.device_bytes;
  return d;
}

nb::dict RecordDict(const llar::ErrorRecord& r) {
  nb::dict d;
  d["code"] = r.code;
  d["rank"] = r.rank;
  d["peer"] = r.peer;
  d["block"] = r.block;
  d["line"] = r.line;
  d["flag_expected"] = r.flag_expected;
  d["flag_seen"] = r.flag_seen;
  d["flag_seen2"] = r.flag_seen2;
  d["epoch"] = r.epoch;
  d["waited_ns"] = r.waited_ns;
  d["signature_expected"] = r.signature_expected;
  d["signature_seen"] = r.signature_seen;
  d["flag_epoch_bits"] = r.flag_epoch_bits;
  return d;
}

}  // namespace

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
        const llar::LoopbackHandlers lb = llar::GetLoopbackHandlers();
        out["jax_llar_loopback_all_reduce"] = nb::capsule(lb.all_reduce);
        out["jax_llar_loopback_add_rms_norm"] = nb::capsule(lb.add_rms_norm);
        return out;
      },
      "Target name -> execute capsule of the copy and loopback-group targets "
      "(kCmdBufferCompatible).");

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
         const std::string& variant, bool generic, uint32_t block_lines, uint32_t signature) {
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
        spec.signature = signature;
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
      nb::arg("generic") = false, nb::arg("block_lines") = 0, nb::arg("signature") = 0,
      "Kernel-level benchmark on group 0 of a communicator set: "
      "(us per call [rep][rank], outputs per rank as bytes). kind: an algorithm's "
      "name, copy or nccl; dtype: a DTYPE_CODES value; variant (one_shot_ll): '', "
      "loopback, send_loopback, traced or unsigned (compiled without call "
      "signatures); generic: the run-time world-size kernel; block_lines: the grid "
      "rule's lines per block (0: production); signature: every call's signature "
      "(0-65535; 0: the check off at run time). "
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

  m.def(
      "store_atomicity",
      [](int writer_device, int reader_device, uint32_t iterations, uint32_t lines,
         uint32_t warps_per_block, uint32_t max_delay_ns, bool split, uint32_t split_delay_ns,
         uint64_t seed, double timeout_ms, double max_seconds) {
        llar::StoreAtomicitySpec s;
        s.writer_device = writer_device;
        s.reader_device = reader_device;
        s.iterations = iterations;
        s.lines = lines;
        s.warps_per_block = warps_per_block;
        s.max_delay_ns = max_delay_ns;
        s.split = split;
        s.split_delay_ns = split_delay_ns;
        s.seed = seed;
        if (!(timeout_ms > 0) || timeout_ms > 600000) {
          throw std::invalid_argument(
              "jax_llar store atomicity: the timeout must be 1-600000 ms");
        }
        s.timeout_ns = static_cast<uint64_t>(timeout_ms * 1e6);
        s.max_seconds = max_seconds;
        llar::StoreAtomicityResult r;
        {
          nb::gil_scoped_release release;
          r = llar::RunStoreAtomicity(s);
        }
        nb::dict d;
        d["line_rounds"] = r.line_rounds;
        d["rounds_completed"] = r.rounds_completed;
        d["polls"] = r.polls;
        d["torn_lines"] = r.torn_lines;
        d["torn_loads"] = r.torn_loads;
        d["bad_words"] = r.bad_words;
        if (r.has_first_torn) {
          nb::dict t;
          t["line"] = r.first_torn_line;
          t["round"] = r.first_torn_round;
          nb::list words;
          for (uint64_t w : r.first_torn_words) words.append(w);
          t["words"] = words;
          d["first_torn"] = t;
        } else {
          d["first_torn"] = nb::none();
        }
        d["stopped_by_host"] = r.stopped_by_host;
        d["timed_out"] = r.timed_out;
        d["timeout_side"] = r.timeout_side.empty() ? nb::none() : nb::cast(r.timeout_side);
        d["timeout_group"] = r.timeout_group;
        d["timeout_round"] = r.timeout_round;
        d["deadline_exceeded"] = r.deadline_exceeded;
        d["cuda_error"] = r.cuda_error.empty() ? nb::none() : nb::cast(r.cuda_error);
        d["seconds"] = r.seconds;
        d["same_device"] = r.same_device;
        d["p2p_native_atomics"] = r.p2p_native_atomics;
        d["p2p_performance_rank"] = r.p2p_performance_rank;
        d["writer_name"] = r.writer_name;
        d["reader_name"] = r.reader_name;
        d["writer_pci_bus_id"] = r.writer_pci_bus_id;
        d["reader_pci_bus_id"] = r.reader_pci_bus_id;
        d["writer_blocks"] = r.writer_blocks;
        d["reader_blocks"] = r.reader_blocks;
        d["threads_per_block"] = r.threads_per_block;
        d["writer_sms"] = r.writer_sms;
        d["reader_sms"] = r.reader_sms;
        return d;
      },
      nb::arg("writer_device"), nb::arg("reader_device"), nb::arg("iterations"),
      nb::arg("lines") = 2048, nb::arg("warps_per_block") = 4, nb::arg("max_delay_ns") = 1000,
      nb::arg("split") = false, nb::arg("split_delay_ns") = 2000, nb::arg("seed") = 1,
      nb::arg("timeout_ms") = 5000.0, nb::arg("max_seconds") = 120.0,
      "Store-atomicity test of 128-byte warp stores (store_atomicity.h): writer "
      "warps on writer_device store `lines` LL128-shaped lines (every 8-byte word "
      "encodes round, line and word) into reader_device's memory, `iterations` "
      "rounds each, readers poll with whole-line loads and count torn lines. "
      "split: store each line in two instructions (the detector must then find "
      "torn lines). Returns a dict: line_rounds, rounds_completed, polls (warp "
      "loads of 4 lines), torn_lines, torn_loads, bad_words, first_torn (None or "
      "{line, round, words}), stopped_by_host, timed_out, timeout_side, "
      "timeout_group, timeout_round, deadline_exceeded, cuda_error, seconds, "
      "same_device, p2p_native_atomics, p2p_performance_rank, writer_name, "
      "reader_name, writer_pci_bus_id, reader_pci_bus_id, writer_blocks, "
      "reader_blocks, threads_per_block, writer_sms, reader_sms. ValueError for a "
      "bad spec, RuntimeError for a CUDA failure while setting up or no peer access.");

  // Every hook that reaches the registry (its mutex, through hooks.cc's
  // MemberOn/AllMembers) releases the GIL first, as _llar's bindings do
  // (module.cc of _llar): a spanning ensure_region holds that mutex while its
  // `agree` waits for the GIL. Python inputs are copied before, results built
  // after.
  m.def(
      "enable_call_trace",
      [](int64_t comm_id) {
        nb::gil_scoped_release release;
        llar::EnableCallTrace(comm_id);
      },
      nb::arg("comm_id"),
      "Start recording device timestamps of every call (TRACE_SLOTS entries) "
      "in programs captured from now on; call it while no other thread runs "
      "programs.");
  m.def(
      "disable_call_trace",
      [](int64_t comm_id) {
        nb::gil_scoped_release release;
        llar::DisableCallTrace(comm_id);
      },
      nb::arg("comm_id"),
      "Stop recording device timestamps (the last buffer stays readable).");
  m.def(
      "read_call_trace",
      [](int64_t comm_id, int32_t device) {
        std::pair<uint64_t, std::vector<uint64_t>> r;
        {
          nb::gil_scoped_release release;
          r = llar::ReadCallTrace(comm_id, device);
        }
        return nb::make_tuple(r.first, r.second);
      },
      nb::arg("comm_id"), nb::arg("device"),
      "(calls so far, 2 * TRACE_SLOTS words of sent/end ns); words empty when "
      "the trace was never enabled.");
  m.attr("TRACE_SLOTS") = llar::kTraceSlots;

  m.def(
      "loopback_plan",
      [](int world, uint32_t n_bytes, int dtype, int calls, int keep, int n_sets,
         int64_t algorithm, bool generic, uint32_t block_lines, int32_t ordinal) {
        const llar::LoopbackSpec s =
            MakeLoopbackSpec(world, n_bytes, dtype, calls, true, keep, algorithm, generic,
                             block_lines, 1000.0, 0, 0, -1, 0, ordinal);
        llar::LoopbackPlan p;
        {
          nb::gil_scoped_release release;
          p = llar::PlanLoopback(s, n_sets);
        }
        return PlanDict(p);
      },
      nb::arg("world"), nb::arg("n_bytes"), nb::arg("dtype"), nb::arg("calls") = 1,
      nb::arg("keep") = 0, nb::arg("n_sets") = 1,
      nb::arg("algorithm") = static_cast<int64_t>(llar::Algorithm::kOneShotLL),
      nb::arg("generic") = false, nb::arg("block_lines") = 0, nb::arg("ordinal") = 0,
      "The loopback harness's plan for one case, without running it: the grid "
      "per rank (blocks, lines_per_block, threads), the kernel's regs_per_thread "
      "and blocks_per_sm, the device's sms, co_resident (all ranks' grids fit at "
      "once), generic_kernel and device_bytes. ValueError for a bad case.");

  m.def(
      "loopback",
      [](LoopbackInputs inputs, int dtype, int calls, bool sync, int keep,
         int64_t algorithm, bool generic, uint32_t block_lines, double timeout_ms,
         uint64_t start_epoch, uint32_t misalign, int skip_rank, int skip_call,
         int32_t ordinal, bool signatures, uint32_t signature_seed, int extra_call_rank,
         int swap_signature_rank, int fault_call) {
        const size_t n_sets = inputs.shape(0);
        const size_t world = inputs.shape(1);
        const size_t n_bytes = inputs.shape(2) * inputs.itemsize();
        if (n_sets < 1 || n_sets > 1024 || world > 64 || n_bytes > (size_t(1) << 31)) {
          throw std::invalid_argument(
              "jax_llar loopback: inputs must be shaped (n_sets, world, n) with "
              "1-1024 sets");
        }
        const llar::LoopbackSpec s = MakeLoopbackSpec(
            static_cast<int>(world), static_cast<uint32_t>(n_bytes), dtype, calls, sync, keep,
            algorithm, generic, block_lines, timeout_ms, start_epoch, misalign, skip_rank,
            skip_call, ordinal, signatures, signature_seed, extra_call_rank,
            swap_signature_rank, fault_call);
        const auto* data = static_cast<const uint8_t*>(inputs.data());
        llar::LoopbackResult r;
        {
          nb::gil_scoped_release release;
          r = llar::RunLoopback(s, data, static_cast<int>(n_sets));
        }
        auto* out = new std::vector<uint8_t>(std::move(r.outputs));
        out->reserve(1);  // a valid data pointer also when no output came back
        nb::capsule owner(out, [](void* p) noexcept {
          delete static_cast<std::vector<uint8_t>*>(p);
        });
        const size_t kept = out->empty() ? 0 : static_cast<size_t>(r.kept);
        const size_t shape[3] = {kept, world, n_bytes};
        nb::dict d;
        d["outputs"] = nb::ndarray<nb::numpy, uint8_t, nb::ndim<3>>(out->data(), 3, shape, owner)
                           .cast();
        d["first_kept_call"] = r.first_kept_call;
        d["calls_launched"] = r.calls_launched;
        nb::list records;
        for (const auto& rec : r.records) records.append(RecordDict(rec));
        d["records"] = records;
        d["cuda_error"] = r.cuda_error.empty() ? nb::none() : nb::cast(r.cuda_error);
        d["failed_call"] = r.failed_call;
        d["deadline_exceeded"] = r.deadline_exceeded;
        d["seconds"] = r.seconds;
        d["seconds_to_error"] = r.seconds_to_error;
        d["epochs_checked"] = r.epochs_checked;
        d["epoch_mismatch"] = r.epoch_mismatch.empty() ? nb::none() : nb::cast(r.epoch_mismatch);
        d["max_connections"] =
            r.max_connections.empty() ? nb::none() : nb::cast(r.max_connections);
        d["plan"] = PlanDict(r.plan);
        d["signatures"] = r.signatures;
        d["fault_signature"] = r.fault_signature;
        return d;
      },
      nb::arg("inputs"), nb::arg("dtype"), nb::arg("calls"), nb::arg("sync") = true,
      nb::arg("keep") = 0,
      nb::arg("algorithm") = static_cast<int64_t>(llar::Algorithm::kOneShotLL),
      nb::arg("generic") = false, nb::arg("block_lines") = 0, nb::arg("timeout_ms") = 2000.0,
      nb::arg("start_epoch") = 0, nb::arg("misalign") = 0, nb::arg("skip_rank") = -1,
      nb::arg("skip_call") = 0, nb::arg("ordinal") = 0, nb::arg("signatures") = true,
      nb::arg("signature_seed") = 0, nb::arg("extra_call_rank") = -1,
      nb::arg("swap_signature_rank") = -1, nb::arg("fault_call") = 0,
      "Loopback harness (loopback.h): `world` ranks simulated on one GPU. "
      "inputs: C-contiguous (n_sets, world, n) array of any element type (its "
      "bytes are the payload; pass bfloat16 as a uint16 view); call c uses set "
      "c % n_sets. dtype: a DTYPE_CODES value. Returns a dict: outputs (uint8, "
      "(kept, world, n_bytes): the last `keep` calls, 0 = all; empty after an "
      "error), first_kept_call, calls_launched, records (one error record per "
      "rank: code, rank, peer, block, line, flag_expected, flag_seen, "
      "flag_seen2, epoch, waited_ns), cuda_error (None or text), failed_call, "
      "deadline_exceeded, seconds, seconds_to_error, epochs_checked, "
      "epoch_mismatch (None or the first epoch counter that did not advance "
      "once per call), max_connections (CUDA_DEVICE_MAX_CONNECTIONS) and plan "
      "(loopback_plan). skip_rank >= 0 leaves that rank's kernel out of call "
      "skip_call and stops there: the others' bounded waits trap and the CUDA "
      "context of the process is lost, so run it in a child process. Call c "
      "carries the signature 1 + (signature_seed + c) % 65535 (signatures=False: "
      "0), returned as signatures; extra_call_rank >= 0 makes that rank run one "
      "extra call of another signature (fault_signature) before call fault_call, "
      "swap_signature_rank >= 0 gives that rank's call fault_call that signature; "
      "both stop after fault_call and must end in the foreign-signature report "
      "(code 2), in a child process too. "
      "ValueError for a bad case (also when the ranks' grids do not fit on the "
      "device at once), RuntimeError for a CUDA failure while setting up.");

  m.def(
      "set_epoch_for_testing",
      [](int64_t comm_id, uint64_t epoch, int32_t device) {
        nb::gil_scoped_release release;  // takes the registry's mutex
        llar::SetEpochForTesting(comm_id, epoch, device);
      },
      nb::arg("comm_id"), nb::arg("epoch"), nb::arg("device") = -1,
        "Test hook (F4): every epoch counter of the set := epoch; scratch re-zeroed. "
        "With `device` >= 0, on that CUDA device only (its peers then wait for "
        "epochs it never sends).");
  m.def(
      "fail_next_registration_for_testing",
      [](int64_t comm_id) {
        nb::gil_scoped_release release;  // takes the registry's mutex (module.cc of _llar)
        llar::FailNextRegistrationForTesting(comm_id);
      },
      nb::arg("comm_id"),
      "Test hook (registry/seams.h: FailNextRegistrationForTesting): the next region "
      "ensure_region creates for the set fails once its registration is complete, "
      "and the set is given up as after a failed registration. RuntimeError for "
      "an unknown set.");
  m.def(
      "set_fault_for_testing",
      [](int64_t comm_id, int32_t device, const std::string& fault) {
        llar::Fault f;
        if (fault == "none") {
          f = llar::Fault::kNone;
        } else if (fault == "drop_peer_writes") {
          f = llar::Fault::kDropPeerWrites;
        } else if (fault == "corrupt_flag") {
          f = llar::Fault::kCorruptFlag;
        } else if (fault == "delay_rank") {
          f = llar::Fault::kDelayRank;
        } else {
          throw nb::value_error(("unknown fault " + fault +
                                 "; known: none, drop_peer_writes, corrupt_flag, delay_rank")
                                    .c_str());
        }
        nb::gil_scoped_release release;  // takes the registry's mutex
        llar::SetFaultForTesting(comm_id, device, f);
      },
      nb::arg("comm_id"), nb::arg("device"), nb::arg("fault"),
      "Fault injection (issue 12, item 5; hooks.h): programs captured afterwards "
      "on `device` run the one-shot's `fault` variant: 'drop_peer_writes', "
      "'corrupt_flag' (line 0's flag has an epoch bit flipped), 'delay_rank' "
      "(the rank sends 100 ms late), or 'none'. ValueError for another name.");

  // The fused all-reduce + residual add + RMSNorm on simulated ranks
  // (loopback_add_rms_norm.h).
  m.def(
      "loopback_add_rms_norm",
      [](int world, int dtype, int weight_dtype, uint32_t rows, uint32_t d, float eps,
         const nb::bytes& x, const nb::bytes& residual, const nb::bytes& weight, int calls,
         bool interleave, double timeout_ms, uint64_t start_epoch, int32_t ordinal) {
        llar::FusedLoopbackSpec s;
        s.ordinal = ordinal;
        s.world = world;
        s.dtype = static_cast<llar::DType>(dtype);
        s.weight = static_cast<llar::DType>(weight_dtype);
        s.rows = rows;
        s.d = d;
        s.eps = eps;
        if (!(timeout_ms > 0) || timeout_ms > 600000) {
          throw std::invalid_argument("jax_llar fused loopback: the timeout must be 1-600000 ms");
        }
        s.timeout_ns = static_cast<uint64_t>(timeout_ms * 1e6);
        s.calls = calls;
        s.interleave = interleave;
        s.start_epoch = start_epoch;
        auto bytes_of = [](const nb::bytes& b) {
          const auto* p = static_cast<const uint8_t*>(b.data());
          return std::vector<uint8_t>(p, p + b.size());
        };
        const std::vector<uint8_t> xv = bytes_of(x), rv = bytes_of(residual),
                                   wv = bytes_of(weight);
        llar::FusedLoopbackResult r;
        {
          nb::gil_scoped_release release;
          r = llar::RunFusedLoopback(s, xv, rv, wv);
        }
        nb::dict plan;
        plan["blocks"] = r.plan.grid.blocks;
        plan["cluster_blocks"] = r.plan.grid.cluster_blocks;
        plan["lines_per_block"] = r.plan.grid.lines_per_block;
        plan["threads"] = r.plan.grid.threads;
        plan["regs_per_thread"] = r.plan.regs_per_thread;
        plan["max_active_clusters"] = r.plan.max_active_clusters;
        plan["clusters"] = r.plan.clusters;
        nb::dict out;
        out["plan"] = plan;
        out["normed"] = nb::bytes(reinterpret_cast<const char*>(r.normed.data()), r.normed.size());
        out["new_residual"] =
            nb::bytes(reinterpret_cast<const char*>(r.new_residual.data()), r.new_residual.size());
        nb::list records;
        for (const auto& rec : r.records) records.append(RecordDict(rec));
        out["records"] = records;
        out["cuda_error"] = r.cuda_error.empty() ? nb::none() : nb::cast(r.cuda_error);
        out["deadline_exceeded"] = r.deadline_exceeded;
        out["epochs_checked"] = r.epochs_checked;
        out["epoch_mismatch"] =
            r.epoch_mismatch.empty() ? nb::none() : nb::cast(r.epoch_mismatch);
        return out;
      },
      nb::arg("world"), nb::arg("dtype"), nb::arg("weight_dtype"), nb::arg("rows"),
      nb::arg("d"), nb::arg("eps"), nb::arg("x"), nb::arg("residual"), nb::arg("weight"),
      nb::arg("calls") = 1, nb::arg("interleave") = false, nb::arg("timeout_ms") = 2000.0,
      nb::arg("start_epoch") = 0, nb::arg("ordinal") = 0,
      "Loopback harness of the fused all-reduce + residual add + RMSNorm "
      "(loopback_add_rms_norm.h): `world` ranks simulated on one GPU. dtype, "
      "weight_dtype: DTYPE_CODES values; x: bytes of (world, rows, d); residual: "
      "(rows, d); weight: (d,). `calls` fused calls (with `interleave`, a one-shot "
      "all-reduce of x before each). Returns a dict: plan (blocks, cluster_blocks, "
      "lines_per_block, threads, regs_per_thread, max_active_clusters, clusters), "
      "normed and new_residual (bytes of (world, rows, d), the last call's; empty "
      "after an error), records (one error record per rank), cuda_error (None or "
      "text), deadline_exceeded, epochs_checked, epoch_mismatch. ValueError for a "
      "bad case (also one whose ranks' clusters do not fit on the device at once), "
      "RuntimeError for a CUDA failure while setting up.");

  m.def(
      "loopback_add_rms_norm_plan",
      [](int world, int dtype, int weight_dtype, uint32_t rows, uint32_t d, int32_t ordinal) {
        llar::FusedLoopbackSpec s;
        s.ordinal = ordinal;
        s.world = world;
        s.dtype = static_cast<llar::DType>(dtype);
        s.weight = static_cast<llar::DType>(weight_dtype);
        s.rows = rows;
        s.d = d;
        s.timeout_ns = 1'000'000'000ull;
        llar::FusedLoopbackPlan p;
        {
          nb::gil_scoped_release release;
          p = llar::PlanFusedLoopback(s);
        }
        nb::dict out;
        out["blocks"] = p.grid.blocks;
        out["cluster_blocks"] = p.grid.cluster_blocks;
        out["threads"] = p.grid.threads;
        out["max_active_clusters"] = p.max_active_clusters;
        out["clusters"] = p.clusters;
        out["co_resident"] = p.co_resident;
        return out;
      },
      nb::arg("world"), nb::arg("dtype"), nb::arg("weight_dtype"), nb::arg("rows"),
      nb::arg("d"), nb::arg("ordinal") = 0,
      "The fused loopback's plan for one case, without running it: grid (blocks, "
      "cluster_blocks, threads), max_active_clusters, clusters (world x rows), "
      "co_resident. ValueError for a case the grid rule does not serve.");

  // Loopback groups behind FFI custom calls (loopback_group.h).
  m.def(
      "create_loopback_group",
      [](int world, const std::vector<int64_t>& algorithms, double timeout_ms,
         int32_t ordinal) {
        if (!(timeout_ms > 0) || timeout_ms > 600000) {
          throw std::invalid_argument(
              "jax_llar loopback group: the timeout must be 1-600000 ms");
        }
        const uint64_t timeout_ns = static_cast<uint64_t>(timeout_ms * 1e6);
        nb::gil_scoped_release release;
        return llar::CreateLoopbackGroup(ordinal, world, algorithms, timeout_ns);
      },
      nb::arg("world"), nb::arg("algorithms"), nb::arg("timeout_ms") = 2000.0,
      nb::arg("ordinal") = 0,
      "Makes a loopback group of `world` simulated ranks on CUDA device `ordinal` "
      "holding the regions of `algorithms` (ids); returns its id. ValueError for a "
      "bad argument, RuntimeError for a CUDA failure.");
  m.def(
      "destroy_loopback_group",
      [](int64_t id) {
        nb::gil_scoped_release release;
        llar::DestroyLoopbackGroup(id);
      },
      nb::arg("id"),
      "Withdraws the group (its calls fail from then on; its memory stays, as "
      "captured command buffers hold its addresses), then waits (bounded) for its "
      "streams. ValueError for an unknown id; RuntimeError when its streams failed "
      "or did not finish.");
  m.def(
      "loopback_group_info",
      [](int64_t id) {
        const llar::LoopbackGroupInfo info = llar::LoopbackGroupInfoOf(id);
        nb::dict d;
        d["ordinal"] = info.ordinal;
        d["world"] = info.world;
        d["algorithms"] = info.algorithms;
        d["timeout_ns"] = info.timeout_ns;
        return d;
      },
      nb::arg("id"), "ordinal, world, algorithms, timeout_ns of a group. ValueError if unknown.");
  m.def(
      "loopback_group_records",
      [](int64_t id) {
        nb::list out;
        for (const auto& r : llar::LoopbackGroupRecords(id)) out.append(RecordDict(r));
        return out;
      },
      nb::arg("id"), "Each rank's error record (code 0: nothing reported).");
  m.def(
      "loopback_group_epochs",
      [](int64_t id, int64_t algorithm) {
        if (algorithm <= 0 || algorithm >= llar::kMaxAlgorithms) {
          throw std::invalid_argument("jax_llar loopback group: unknown algorithm id " +
                                      std::to_string(algorithm));
        }
        std::vector<std::vector<uint64_t>> state;
        {
          nb::gil_scoped_release release;
          state = llar::LoopbackGroupState(id);
        }
        const int start = llar::EpochSetOffset(static_cast<llar::Algorithm>(algorithm));
        std::vector<std::vector<uint64_t>> out;
        for (const auto& words : state) {
          out.emplace_back(words.begin() + start, words.begin() + start + llar::kEpochCounters);
        }
        return out;
      },
      nb::arg("id"), nb::arg("algorithm"),
      "Each rank's epoch counters of `algorithm`'s set (EPOCH_SHAPE = blocks x "
      "warps, flattened), after a bounded wait for the group's streams.");
  m.attr("EPOCH_SHAPE") = nb::make_tuple(llar::kMaxBlocks, llar::kMaxWarps);
}
