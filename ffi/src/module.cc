// Python module `jax_llar._llar`: hands out the all-reduce's FFI capsules and
// exposes the communicator registry (with the NCCL settings its checks
// read), nothing else (the kernel bench, the
// speed-of-light probes, the call trace and the test hooks are in
// jax_llar.tools._llar_tools, ffi/tools/). No policy lives here; jax_llar/
// decides. Importing it makes no CUDA call.
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "handlers.h"
#include "kernels/kernels.h"
#include "llar/args.h"
#include "registry.h"
#include "registry/nccl_settings.h"

namespace nb = nanobind;

NB_MODULE(_llar, m) {
  m.doc() = "jax_llar CUDA extension: XLA FFI handlers and NCCL communicators.";

  m.def("registrations", []() {
    const llar::AllReduceHandlers h = llar::GetAllReduceHandlers();
    nb::dict all_reduce;
    all_reduce["instantiate"] = nb::capsule(h.instantiate);
    all_reduce["execute"] = nb::capsule(h.execute);
    const llar::AllReduceHandlers f = llar::GetAddRmsNormHandlers();
    nb::dict add_rms_norm;
    add_rms_norm["instantiate"] = nb::capsule(f.instantiate);
    add_rms_norm["execute"] = nb::capsule(f.execute);
    nb::dict out;
    out["jax_llar_all_reduce"] = all_reduce;
    out["jax_llar_all_reduce_add_rms_norm"] = add_rms_norm;
    return out;
  }, "Target name -> dict of FFI stage -> capsule.");

  m.def(
      "create_comm_set",
      [](const std::vector<std::vector<int>>& groups, uint64_t timeout_ns) {
        nb::gil_scoped_release release;
        return llar::CreateCommSet(groups, timeout_ns);
      },
      nb::arg("groups"), nb::arg("timeout_ns"),
      "Creates NCCL communicators and device communicators for replica groups "
      "of local CUDA ordinals, without scratch; returns the communicator-set "
      "id. Raises RuntimeError on failure.");
  m.def(
      "create_comm_set_of_ranks",
      [](const std::vector<std::tuple<int, std::vector<int>, std::vector<int>, nb::bytes>>&
             groups,
         uint64_t timeout_ns, uint64_t setup_timeout_ms) {
        std::vector<llar::GroupSpec> specs;
        for (const auto& [world, ranks, ordinals, unique_id] : groups) {
          specs.push_back({world, ranks, ordinals,
                           std::string(static_cast<const char*>(unique_id.data()),
                                       unique_id.size())});
        }
        // Released while NCCL waits for the other processes (up to the bound).
        nb::gil_scoped_release release;
        return llar::CreateCommSetOfRanks(specs, timeout_ns, setup_timeout_ms);
      },
      nb::arg("groups"), nb::arg("timeout_ns"), nb::arg("setup_timeout_ms"),
      "Creates a communicator set whose groups may span processes: one tuple "
      "(world, ranks, ordinals, unique_id) per group, with this process's ranks "
      "(ascending) and their local CUDA ordinals, and the group's NCCL unique id "
      "(128 bytes; empty when this process holds every rank). Collective over "
      "each group's processes; each collective set-up step of a spanning group "
      "(here and in ensure_region) waits at most `setup_timeout_ms` "
      "milliseconds for the other processes (> 0 when a group spans "
      "processes). Returns the communicator-set id. Raises RuntimeError on "
      "failure (a step that did not complete in time included), after "
      "releasing what it created.");
  m.def(
      "destroy_comm_set",
      [](int64_t comm_id) {
        nb::gil_scoped_release release;
        llar::DestroyCommSet(comm_id);
      },
      nb::arg("comm_id"),
      "Releases a communicator set that no program can have used: one without "
      "any scratch region (registry.h: DestroyCommSet). Its id is withdrawn "
      "first and never reused; its communicators are aborted (ncclCommAbort: "
      "local, it waits for no other process), its state freed. A second call "
      "does nothing. Raises RuntimeError for an unknown id or a set that holds "
      "a region (nothing changes then).");
  m.def(
      "nccl_unique_id",
      []() {
        const std::string id = llar::NcclUniqueId();
        return nb::bytes(id.data(), id.size());
      },
      "A fresh NCCL unique id (ncclGetUniqueId), 128 bytes. Raises RuntimeError.");
  m.def(
      "ensure_region",
      [](int64_t comm_id, int64_t algorithm,
         std::optional<std::function<bool(int, const std::string&, const std::string&)>>
             agree) {
        nb::gil_scoped_release release;
        // The callable runs with the GIL taken again (nanobind's wrapper).
        llar::EnsureRegion(comm_id, algorithm, agree ? &*agree : nullptr);
      },
      nb::arg("comm_id"), nb::arg("algorithm"), nb::arg("agree") = nb::none(),
      "Allocates and registers the symmetric scratch region of `algorithm` (FFI "
      "id) on every device of the set, once. `agree(group: int, stage: str, "
      "local_error: str) -> bool`, for groups spanning processes: called with "
      "stage 'allocated' after the local allocations and before the collective "
      "registration, then with stage 'registered' after the registration and "
      "before the region is published; it must return True only when every "
      "process of the group succeeded at that stage (registry.h: "
      "RegionAgreement) and must not raise. Raises RuntimeError on failure; "
      "after a failed registration the whole set is given up (registry.h: "
      "EnsureRegion).");
  m.def("regions", &llar::RegionsOf, nb::arg("comm_id"),
        "FFI ids of the algorithms whose scratch regions the set holds.");
  m.def(
      "region_bytes",
      [](int64_t algorithm, int world) -> uint64_t {
        if (algorithm <= 0 || algorithm >= llar::kAlgorithmCount) return 0;
        return llar::RegionBytes(static_cast<llar::Algorithm>(algorithm), world);
      },
      nb::arg("algorithm"), nb::arg("world"),
      "Bytes of an algorithm's scratch region per rank for `world` ranks (args.h: "
      "RegionBytes); 0 for an unknown id. Pure; makes no CUDA call.");

  m.def("comm_key", &llar::KeyOf, nb::arg("comm_id"),
        "Fingerprint of a communicator set's groups (the FFI attribute comm_key).");
  // Every binding that takes the registry's mutex releases the GIL first:
  // ensure_region holds that mutex while it calls back into Python (its
  // `agree`), so a thread holding the GIL while it waits for the mutex would
  // deadlock with it.
  m.def(
      "scratch_bytes",
      [](int64_t comm_id) {
        nb::gil_scoped_release release;
        return llar::ScratchBytesOf(comm_id);
      },
      nb::arg("comm_id"),
      "Bytes of symmetric scratch per device of a communicator set (its regions).");

  m.def("error_reports", []() {
    std::vector<llar::ErrorReport> reports;
    {
      nb::gil_scoped_release release;
      reports = llar::ErrorReports();
    }
    nb::list out;
    for (const auto& r : reports) {
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
      d["signature_expected"] = r.record.signature_expected;
      d["signature_seen"] = r.record.signature_seen;
      d["flag_epoch_bits"] = r.record.flag_epoch_bits;
      out.append(d);
    }
    return out;
  }, "Reports written by bounded waits (host-mapped, survive a trap): code 1, a "
     "timeout; code 2, a line of another call's signature (args.h: ErrorRecord).");

  m.def(
      "nccl_setting",
      [](const std::string& name,
         std::optional<std::vector<std::string>> files) -> nb::object {
        const llar::NcclSetting s =
            llar::NcclSettingOf(name, files ? *files : llar::NcclConfFiles());
        if (!s.found) return nb::none();
        // A configuration file's bytes need not be UTF-8: undecodable bytes
        // come back as lone surrogates (Python's "surrogateescape"), never a
        // UnicodeDecodeError.
        auto text = [](const std::string& v) {
          PyObject* o = PyUnicode_DecodeUTF8(v.data(), static_cast<Py_ssize_t>(v.size()),
                                             "surrogateescape");
          if (o == nullptr) nb::raise_python_error();
          return nb::steal<nb::str>(o);
        };
        return nb::make_tuple(text(s.value), text(s.source));
      },
      nb::arg("name"), nb::arg("files") = nb::none(),
      "NCCL's setting `name` as NCCL 2.28 reads it: (value, source), source "
      "'the environment' or a configuration file's path (bytes that are not UTF-8 "
      "decoded with 'surrogateescape'); None when unset. "
      "`files`: the configuration files in order of precedence (default: "
      "nccl_conf_files()). registry/nccl_settings.h: NcclSettingOf. Makes no CUDA or NCCL call.");
  m.def("nccl_conf_files", &llar::NcclConfFiles,
        "NCCL 2.28's configuration files, highest precedence first: $NCCL_CONF_FILE "
        "when set (else ~/.nccl.conf), then /etc/nccl.conf.");
  m.def("nccl_int_value", &llar::NcclIntValue, nb::arg("value"), nb::arg("fallback"),
        "NCCL's integer reading of a setting's value (strtoll, base 0); `fallback` "
        "when empty or out of range.");

  m.def("nccl_runtime_version", &llar::NcclRuntimeVersion);
  m.def("nccl_compiled_version", &llar::NcclCompiledVersion);
  m.def("cuda_device_count", &llar::CudaDeviceCount);
  m.def("can_access_peer", &llar::CanAccessPeer);

  // The algorithms (kernels/kernels.h): name -> FFI id, name -> largest
  // payload per rank in bytes.
  nb::dict algorithms, max_bytes;
  nb::list signed_algorithms;
  for (int64_t id = 1; id < llar::kAlgorithmCount; ++id) {
    const llar::AlgorithmEntry& e = llar::kAlgorithms[id];
    algorithms[e.name] = id;
    max_bytes[e.name] = e.max_bytes;
    if (llar::CarriesSignature(static_cast<llar::Algorithm>(id))) signed_algorithms.append(e.name);
  }
  m.attr("ALGORITHMS") = algorithms;
  m.attr("MAX_BYTES") = max_bytes;
  // The algorithms whose lines carry the call's signature (args.h:
  // CarriesSignature), in id order; and the signature's width.
  m.attr("SIGNED") = signed_algorithms;
  m.attr("SIGNATURE_BITS") = llar::kSignatureBits;
  m.attr("MAX_RANKS") = llar::kMaxRanks;

  // The fused all-reduce + residual add + RMSNorm (jax_llar_all_reduce_add_rms_norm):
  // its largest payload per rank (x's bytes), the constants of its grid rule
  // and the rule itself (kernels/kernels.h, AddRmsNormGridFor), which the
  // Python lowering mirrors.
  m.attr("FUSED_MAX_BYTES") = llar::kOneShotMaxBytes;
  m.attr("FUSED_BLOCK_LINES") = llar::kAddRmsNormBlockLines;
  m.attr("FUSED_MAX_CLUSTER_BLOCKS") = llar::kAddRmsNormMaxClusterBlocks;
  m.def(
      "add_rms_norm_grid",
      [](uint32_t rows, uint32_t d, uint32_t itemsize) -> nb::object {
        llar::AddRmsNormGrid g;
        if (!llar::AddRmsNormGridFor(rows, d, itemsize, &g)) return nb::none();
        return nb::make_tuple(g.blocks, g.cluster_blocks, g.lines_per_block, g.threads);
      },
      nb::arg("rows"), nb::arg("d"), nb::arg("itemsize"),
      "The fused kernel's grid for `rows` rows of `d` elements of `itemsize` bytes: "
      "(blocks, cluster_blocks, lines_per_block, threads), or None when not served. "
      "Pure; makes no CUDA call.");
}
