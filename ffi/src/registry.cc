#include "registry.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <cstdio>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "errors.h"
#include "kernels/kernels.h"
#include "llar/nccl_lla2a.h"
#include "lsa_pointers.h"

namespace llar {
namespace {

// One algorithm's scratch region on one device.
struct Region {
  void* scratch = nullptr;
  uint64_t bytes = 0;
  ncclWindow_t window = nullptr;
  PeerTable* peers = nullptr;    // device copy of the region's peer table
  AllReduceArgs args{};          // what DeviceContext::args points at
  // An algorithm on NCCL's LL all-to-all session (AlgorithmEntry::lla2a_slots)
  // has no scratch or window; instead: its device communicator and session
  // handle (filled in by ncclDevCommCreate) and their device copy.
  NcclLLA2AComm lla2a{};
  NcclLLA2AComm* lla2a_device = nullptr;
  bool lla2a_comm_created = false;  // lla2a.comm holds a device communicator
};

// Resources of one device of one communicator set. A published set lives as
// long as the process (a handful per program); a set whose creation fails is
// released (ReleaseDevices), and so is one destroyed before any region
// (DestroyCommSet).
struct DeviceResources {
  ncclComm_t comm = nullptr;
  ncclDevComm dev_comm{};
  uint64_t* state = nullptr;   // kStateWords: the claim word and the epoch counters (args.h)
  ErrorRecord* error = nullptr;  // host-mapped
  uint64_t timeout_ns = 0;
  std::unique_ptr<Region> regions[kAlgorithmCount];
  DeviceContext context;
};

struct CommSet {
  std::vector<GroupSpec> groups;
  std::vector<std::unique_ptr<DeviceResources>> devices;  // the groups' local devices in order
  // The bound, in ms, of each collective set-up step of a group that spans
  // processes (CollectiveStep); unused for groups held whole by this process.
  uint64_t setup_timeout_ms = 0;
  // Why the set was given up (FailSet) or that it was destroyed
  // (DestroyCommSet); empty while it works. A failed set has no region
  // (those it published are withdrawn, not freed) and makes no NCCL call
  // again.
  std::string failed;
  // DestroyCommSet released it: no devices, no groups; its id stays taken.
  bool destroyed = false;
  // Regions of a failed registration in a set that kept its communicators
  // (FailSet): NCCL's thread may still be inside the step, using their
  // memory and writing its outputs into them (the window handle, the device
  // communicator), and the other processes may have mapped their scratch,
  // so neither they nor their memory are ever freed.
  // Each with the index of its device in `devices` (ScratchBytesOf counts them).
  std::vector<std::pair<size_t, std::unique_ptr<Region>>> abandoned;
  // FailNextRegistrationForTesting: the next registration fails once it is
  // complete (BuildRegions).
  bool fail_next_registration = false;
};

std::mutex g_mutex;                                   // guards creation, g_sets, g_preloads
// Index = comm id; 0 unused. Never destroyed, deliberately (a leak at exit):
// a kept communicator's NCCL thread may still be inside an asynchronous
// registration that writes through the pointers it was given (&Region::window
// of an abandoned region, CommSet::abandoned) while static destructors run,
// so nothing this registry owns may be freed at exit. The rule: the registry
// outlives the process; its memory goes back to the system with it.
std::vector<std::unique_ptr<CommSet>>& g_sets =
    *new std::vector<std::unique_ptr<CommSet>>(1);
std::vector<cudaError_t (*)()> g_preloads;            // AddPreload, best-effort
std::array<std::array<std::atomic<const DeviceContext*>, kMaxOrdinals>,
           kMaxCommSets>
    g_table{};
// Per set, read without the lock by the FFI instantiate stage (KeyOf,
// HasRegion): an instantiate must never wait for a creation, which may be
// waiting for that very program's kernels (a region created while programs
// of the set run).
std::array<std::atomic<int64_t>, kMaxCommSets> g_keys{};           // 0: no such set
std::array<std::atomic<uint32_t>, kMaxCommSets> g_region_masks{};  // bit a: region of a

static_assert(kAlgorithmCount <= 32, "g_region_masks holds one bit per algorithm");

// True when the group's other ranks are in other processes (it has an NCCL
// unique id): its communicators are non-blocking and every collective step
// of its set-up is bounded (CollectiveStep).
bool Spans(const GroupSpec& g) { return !g.unique_id.empty(); }

// NCCL_COMM_BLOCKING=1 overrides ncclConfig_t::blocking = 0 (NCCL 2.28's
// parseCommConfig), which would make the set-up calls of a spanning group
// wait without a bound. NCCL reads it from the environment or from its
// configuration files (NcclSettingOf). Returns the setting when it forces
// blocking communicators, else one not found.
NcclSetting NcclForcedBlocking() {
  NcclSetting s = NcclSettingOf("NCCL_COMM_BLOCKING", NcclConfFiles());
  if (s.found && NcclIntValue(s.value, /*fallback=*/0) == 1) return s;
  return {};
}

// `text` for a message: bytes outside printable ASCII as \xNN, so that a
// value read from a file (a configuration file's bytes need not be UTF-8)
// always reaches Python as a RuntimeError's text.
std::string Printable(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

void ValidateGroups(const std::vector<GroupSpec>& groups, uint64_t setup_timeout_ms) {
  if (groups.empty()) Fail("jax_llar: no replica groups given");
  if (std::any_of(groups.begin(), groups.end(), Spans)) {
    if (setup_timeout_ms == 0) {
      Fail("jax_llar: a replica group that spans processes needs a set-up bound "
           "(setup_timeout_ms > 0)");
    }
    if (const NcclSetting blocking = NcclForcedBlocking(); blocking.found) {
      // In the environment, the value may be the user's or one that NCCL
      // copied there from one of its configuration files (its first
      // initialisation does setenv(name, value, 0) for each file's lines).
      const bool env = blocking.source == "the environment";
      Fail("jax_llar: NCCL_COMM_BLOCKING=" + Printable(blocking.value) + " (set " +
           (env ? std::string("in the environment: by the user, or copied there by NCCL "
                              "from one of its configuration files") :
                  "in " + Printable(blocking.source) + ", one of NCCL's configuration files") +
           ") makes NCCL's set-up calls blocking, so a process that never joins could not be "
           "waited for with a bound; " +
           (env ? std::string("unset it, or remove it from NCCL's configuration file "
                              "($NCCL_CONF_FILE, ~/.nccl.conf, /etc/nccl.conf) and set "
                              "NCCL_COMM_BLOCKING=0 in the environment, which takes "
                              "precedence,") :
                  std::string("remove it from that file (or set NCCL_COMM_BLOCKING=0 in the "
                              "environment, which takes precedence)")) +
           " to use jax_llar for replica groups that span processes");
    }
  }
  const int n_dev = CudaDeviceCount();
  std::set<int> seen;
  for (const auto& g : groups) {
    if (g.world < 2 || g.world > kMaxRanks) {
      std::ostringstream m;
      m << "jax_llar: a replica group has " << g.world
        << " ranks; the fast path serves 2.." << kMaxRanks;
      Fail(m.str());
    }
    if (g.ranks.empty() || g.ranks.size() != g.ordinals.size()) {
      Fail("jax_llar: a replica group needs as many ranks as CUDA ordinals, at least one");
    }
    for (size_t i = 0; i < g.ranks.size(); ++i) {
      if (g.ranks[i] < 0 || g.ranks[i] >= g.world || (i > 0 && g.ranks[i] <= g.ranks[i - 1])) {
        Fail("jax_llar: a replica group's ranks must ascend within 0.." +
             std::to_string(g.world - 1));
      }
    }
    if (g.unique_id.empty() ? static_cast<int>(g.ranks.size()) != g.world
                            : g.unique_id.size() != sizeof(ncclUniqueId)) {
      Fail(g.unique_id.empty()
               ? "jax_llar: a replica group without an NCCL unique id must hold every rank"
               : "jax_llar: an NCCL unique id has " + std::to_string(sizeof(ncclUniqueId)) +
                     " bytes, not " + std::to_string(g.unique_id.size()));
    }
    for (int d : g.ordinals) {
      if (d < 0 || d >= n_dev || d >= kMaxOrdinals) {
        Fail("jax_llar: CUDA ordinal " + std::to_string(d) +
             " is not a visible device");
      }
      if (!seen.insert(d).second) {
        Fail("jax_llar: CUDA ordinal " + std::to_string(d) +
             " appears in two replica groups");
      }
    }
    // Peers in other processes are checked by NCCL (one LSA team, CreateGroup).
    for (int a : g.ordinals) {
      for (int b : g.ordinals) {
        if (a != b && !CanAccessPeer(a, b)) {
          Fail("jax_llar: devices " + std::to_string(a) + " and " +
               std::to_string(b) + " are not peer (load/store) accessible");
        }
      }
    }
  }
}

// This process's members of a group, for messages: "rank 0 of 2 (CUDA device
// 0)", "ranks 0, 1 of 4 (CUDA devices 2, 3)".
std::string MembersText(const std::vector<int>& ranks, const std::vector<int>& ordinals,
                        int world) {
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
    return out;
  };
  const bool one = ranks.size() == 1;
  return std::string(one ? "rank " : "ranks ") + list(ranks) + " of " + std::to_string(world) +
         (one ? " (CUDA device " : " (CUDA devices ") + list(ordinals) + ")";
}

// How a group's collective set-up steps end. For a group that spans
// processes (`nonblocking`) each step runs on non-blocking communicators and
// waits at most `timeout_ms` for NCCL's thread (AwaitComms); for a group
// held whole by this process the calls themselves finish the step (blocking
// communicators, no peer can be missing).
struct StepBound {
  bool nonblocking = false;
  uint64_t timeout_ms = 0;
  std::string who;  // MembersText of this process's members
};

// A collective step of a spanning group failed (an error, or the bound
// passed): NCCL's thread may still be inside the step, writing the step's
// outputs and waiting for the other processes, until ncclCommAbort stops it.
class CollectiveStepFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The longest bound AwaitComms applies, so that its deadline cannot overflow
// the clock.
inline constexpr uint64_t kMaxSetupTimeoutMs = 1'000'000'000;
// AwaitComms' pause between polls: the first, doubled after each poll up to
// the longest. Short enough that a step that completes is seen at once, long
// enough that the wait costs no CPU worth counting.
inline constexpr std::chrono::microseconds kFirstPollPause{100};
inline constexpr std::chrono::microseconds kLongestPollPause{10'000};

// Waits until NCCL's thread has finished the pending work of every
// communicator of `comms` (non-blocking communicators, after a call that
// answered ncclInProgress): polls ncclCommGetAsyncError on each until all
// answer ncclSuccess, sleeping between polls (kFirstPollPause, doubling up
// to kLongestPollPause; the bindings release the GIL around the set-up
// calls). Returns when all finished; throws std::runtime_error, naming
// `step` and `who`, when one reports an error or when `timeout_ms` passes
// first. Every communicator that answered ncclSuccess has been released by
// NCCL's thread; the others may still be in use by it.
void AwaitComms(const std::vector<ncclComm_t>& comms, uint64_t timeout_ms, const char* step,
                const std::string& who) {
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(std::min(timeout_ms, kMaxSetupTimeoutMs));
  std::chrono::microseconds pause = kFirstPollPause;
  std::vector<bool> done(comms.size(), false);
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < comms.size(); ++i) {
      if (done[i]) continue;
      ncclResult_t state = ncclInProgress;
      CheckNccl(ncclCommGetAsyncError(comms[i], &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) {
        done[i] = true;
      } else if (state == ncclInProgress) {
        all = false;
      } else {
        Fail(std::string("jax_llar: ") + step + " failed for " + who + ": " +
             ncclGetErrorString(state) + " (" + ncclGetLastError(nullptr) + ")");
      }
    }
    if (all) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      Fail(std::string("jax_llar: ") + step + " did not complete within " +
           std::to_string(timeout_ms) + " ms for " + who +
           ": a process of the group may have died or not reached this step");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, kLongestPollPause);
  }
}

// The communicators of devices all[first .. first + n).
std::vector<ncclComm_t> CommsOf(const std::vector<std::unique_ptr<DeviceResources>>& all,
                                size_t first, int n) {
  std::vector<ncclComm_t> comms;
  for (int i = 0; i < n; ++i) comms.push_back(all[first + i]->comm);
  return comms;
}

// One collective set-up step of a group (devices all[first .. first + n)):
// `calls` (one NCCL call per member, each checked with CheckStep) grouped,
// then, for a spanning group, the bounded wait for NCCL's thread
// (AwaitComms). For a spanning group every failure of the step is a
// CollectiveStepFailed, whose handler must abort the group's communicators
// before it frees anything the step uses. Nothing the calls write may be read
// before the step returns.
template <typename F>
void CollectiveStep(const StepBound& bound,
                    const std::vector<std::unique_ptr<DeviceResources>>& all, size_t first,
                    int n, const char* step, F&& calls) {
  try {
    GroupedCalls(step, calls, bound.nonblocking);
    if (bound.nonblocking) AwaitComms(CommsOf(all, first, n), bound.timeout_ms, step, bound.who);
  } catch (const std::exception& e) {
    if (!bound.nonblocking) throw;
    throw CollectiveStepFailed(e.what());
  }
}

// Checks one call of a CollectiveStep: ncclInProgress is the normal answer
// of a non-blocking communicator.
void CheckStep(const StepBound& bound, ncclResult_t r, const char* what) {
  if (bound.nonblocking) {
    CheckNcclStarted(r, what);
  } else {
    CheckNccl(r, what);
  }
}

// Releases what CreateGroup made for the devices of a set that was never
// published (a failure part-way) or that DestroyCommSet withdrew before any
// region existed: aborts each communicator (a local call:
// it stops NCCL's thread for it and frees NCCL's resources, device
// communicators included, without waiting for another process), then frees
// the state words and the error record. Best effort: errors are ignored and
// cleared.
void ReleaseDevices(std::vector<std::unique_ptr<DeviceResources>>& devices) {
  for (auto& d : devices) {
    if (d->comm != nullptr) (void)ncclCommAbort(d->comm);
    d->comm = nullptr;
  }
  for (auto& d : devices) {
    if (d->state != nullptr && cudaSetDevice(d->context.ordinal) == cudaSuccess) {
      (void)cudaFree(d->state);
    }
    if (d->error != nullptr) (void)cudaFreeHost(d->error);
  }
  (void)cudaGetLastError();
  devices.clear();
}

// Builds one group's communicators, device communicators and state for this
// process's members, appended to `out` (one per member, rank order) before
// anything of them is created, so that on a failure the caller's
// ReleaseDevices reaches all that exists. No scratch: EnsureRegion adds it
// per algorithm. A spanning group's collective steps are bounded by
// `setup_timeout_ms` each (CollectiveStep).
void CreateGroup(const GroupSpec& spec, uint64_t timeout_ns, uint64_t setup_timeout_ms,
                 std::vector<std::unique_ptr<DeviceResources>>& out) {
  const std::vector<int>& group = spec.ordinals;
  const int n = static_cast<int>(group.size());  // this process's members
  const int world = spec.world;
  const StepBound bound{Spans(spec), setup_timeout_ms, MembersText(spec.ranks, group, world)};
  const size_t first = out.size();
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<DeviceResources>());
    DeviceContext& c = out.back()->context;
    c.ordinal = group[i];
    c.rank = spec.ranks[i];
    c.world = world;
  }

  if (!bound.nonblocking) {
    std::vector<ncclComm_t> comms(n);
    CheckNccl(ncclCommInitAll(comms.data(), n, group.data()), "ncclCommInitAll");
    for (int i = 0; i < n; ++i) out[first + i]->comm = comms[i];
  } else {
    ncclUniqueId id;
    std::memcpy(&id, spec.unique_id.data(), sizeof(id));
    // Collective over the group's processes; grouped for several local ranks.
    // Non-blocking: NCCL creates the communicators in its own thread, and the
    // wait for the other processes is bounded. NCCL returns each handle at
    // once, so ReleaseDevices can abort a creation still in progress.
    CollectiveStep(bound, out, first, n, "ncclCommInitRank", [&] {
      for (int i = 0; i < n; ++i) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        CheckCuda(cudaSetDevice(group[i]), "cudaSetDevice");
        CheckStep(bound,
                  ncclCommInitRankConfig(&out[first + i]->comm, world, id, spec.ranks[i],
                                         &config),
                  "ncclCommInitRank");
      }
    });
  }

  for (int i = 0; i < n; ++i) {
    DeviceResources& d = *out[first + i];
    CheckCuda(cudaSetDevice(group[i]), "cudaSetDevice");
    CheckCuda(cudaMalloc(&d.state, sizeof(uint64_t) * kStateWords), "cudaMalloc(epochs)");
    CheckCuda(cudaMemset(d.state, 0, sizeof(uint64_t) * kStateWords),
              "cudaMemset(epochs)");
    CheckCuda(cudaHostAlloc(reinterpret_cast<void**>(&d.error), sizeof(ErrorRecord),
                            cudaHostAllocMapped | cudaHostAllocPortable),
              "cudaHostAlloc(error record)");
    std::memset(d.error, 0, sizeof(ErrorRecord));
    d.timeout_ns = timeout_ns;
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  // Device communicators are collective over the group; one thread drives
  // every rank, so the calls must be grouped.
  ncclDevCommRequirements reqs;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
  reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
  std::memset(&reqs, 0, sizeof(reqs));  // 2.28/2.29 have no initializer macro
#endif
  CollectiveStep(bound, out, first, n, "ncclDevCommCreate", [&] {
    for (int i = 0; i < n; ++i) {
      CheckStep(bound, ncclDevCommCreate(out[first + i]->comm, &reqs, &out[first + i]->dev_comm),
                "ncclDevCommCreate");
    }
  });

  for (int i = 0; i < n; ++i) {
    DeviceResources& d = *out[first + i];
    const int rank = spec.ranks[i];
    if (d.dev_comm.rank != rank || d.dev_comm.nRanks != world ||
        d.dev_comm.lsaSize != world || d.dev_comm.lsaRank != rank) {
      std::ostringstream m;
      m << "jax_llar: NCCL does not place all " << world
        << " ranks in one load/store-accessible (LSA) team (rank " << rank
        << ": lsaRank " << d.dev_comm.lsaRank << ", lsaSize "
        << d.dev_comm.lsaSize << ")";
      Fail(m.str());
    }
    // Every kernel now, while nothing of the set runs: a lazy module load
    // later could wait for running kernels that wait for their peers.
    CheckCuda(cudaSetDevice(group[i]), "cudaSetDevice");
    for (int64_t a = 1; a < kAlgorithmCount; ++a) {
      CheckCuda(kAlgorithms[a].preload(),
                (std::string("loading the ") + kAlgorithms[a].name + " kernels").c_str());
    }
    CheckCuda(PreloadOneShotLLAddRmsNorm(), "loading the fused add + RMSNorm kernels");
  }
}

// A non-blocking stream of the current device, destroyed with the object:
// set-up work that must not wait for (or be waited for by) XLA's streams.
struct SetupStream {
  cudaStream_t stream = nullptr;
  SetupStream() {
    CheckCuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              "cudaStreamCreateWithFlags");
  }
  ~SetupStream() {
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
  }
  SetupStream(const SetupStream&) = delete;
  SetupStream& operator=(const SetupStream&) = delete;
};

// The scratch part of an LL all-to-all algorithm's region
// (AlgorithmEntry::lla2a_slots) on the devices devs[first .. first + n): per
// rank a device communicator of its own whose only resource is the sessions'
// buffer, ncclLLA2ACreateRequirement(kMaxBlocks, slots) (collective over the
// group: a CollectiveStep, as in CreateGroup; NCCL fills the handle's buffer
// offset when the step completes), and its NcclLLA2AComm copied to device
// memory. The same constraints as CreateRegion (streams of its own:
// ncclDevCommCreate synchronises only a stream it creates).
void CreateLLA2AComms(std::vector<std::unique_ptr<DeviceResources>>& all, size_t first, int n,
                      int world, int64_t algorithm, const StepBound& bound,
                      std::vector<std::unique_ptr<Region>>& regions) {
  const AlgorithmEntry& entry = kAlgorithms[algorithm];
  const int slots = entry.lla2a_slots(world);
  const uint64_t bytes = RegionBytes(static_cast<Algorithm>(algorithm), world);
  std::vector<ncclDevResourceRequirements> buffers(n);
  std::vector<ncclDevCommRequirements> reqs(n);
  for (int i = 0; i < n; ++i) {
    CheckNccl(ncclLLA2ACreateRequirement(kMaxBlocks, slots, &regions[i]->lla2a.handle,
                                         &buffers[i]),
              "ncclLLA2ACreateRequirement");
    if (buffers[i].bufferSize != bytes) {
      Fail(std::string("jax_llar: NCCL's LL all-to-all buffer for ") + entry.name + " is " +
           std::to_string(buffers[i].bufferSize) + " bytes per rank, not the " +
           std::to_string(bytes) + " that args.h (NcclLLA2ABufferBytes) expects of NCCL " +
           std::to_string(NCCL_VERSION_CODE));
    }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)
    reqs[i] = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
    std::memset(&reqs[i], 0, sizeof(reqs[i]));  // 2.28/2.29 have no initializer macro
#endif
    reqs[i].resourceRequirementsList = &buffers[i];
    reqs[i].lsaMultimem = false;  // never NVLink multicast
  }
  CollectiveStep(bound, all, first, n, "ncclDevCommCreate (LL all-to-all)", [&] {
    for (int i = 0; i < n; ++i) {
      CheckStep(bound,
                ncclDevCommCreate(all[first + i]->comm, &reqs[i], &regions[i]->lla2a.comm),
                "ncclDevCommCreate (LL all-to-all)");
    }
  });
  for (auto& r : regions) r->lla2a_comm_created = true;  // ReleaseUnpublished destroys them
  for (int i = 0; i < n; ++i) {
    Region& r = *regions[i];
    const int rank = all[first + i]->context.rank;
    if (r.lla2a.comm.rank != rank || r.lla2a.comm.lsaSize != world ||
        r.lla2a.comm.lsaRank != rank || r.lla2a.handle.nSlots != static_cast<uint32_t>(slots)) {
      std::ostringstream m;
      m << "jax_llar: the LL all-to-all device communicator of rank " << rank << " of " << world
        << " has rank " << r.lla2a.comm.rank << ", lsaRank " << r.lla2a.comm.lsaRank
        << ", lsaSize " << r.lla2a.comm.lsaSize << " and " << r.lla2a.handle.nSlots
        << " slots (expected " << slots << ")";
      Fail(m.str());
    }
    CheckCuda(cudaSetDevice(all[first + i]->context.ordinal), "cudaSetDevice");
    SetupStream setup;
    CheckCuda(cudaMalloc(&r.lla2a_device, sizeof(NcclLLA2AComm)), "cudaMalloc(LL all-to-all)");
    CheckCuda(cudaMemcpyAsync(r.lla2a_device, &r.lla2a, sizeof(NcclLLA2AComm),
                              cudaMemcpyHostToDevice, setup.stream),
              "cudaMemcpyAsync(LL all-to-all)");
    CheckCuda(cudaStreamSynchronize(setup.stream), "cudaStreamSynchronize");
  }
}

// Allocates, registers and publishes `algorithm`'s region on the devices
// devs[first .. first + n) of one group (EnsureRegion). The caller holds
// g_mutex and a DeviceGuard. Programs of the set may be running: every CUDA
// call here is on a stream of its own (or synchronous only with the host),
// never a device-wide synchronisation, and the kernels were loaded when the
// set was created. An LL all-to-all algorithm's region holds NCCL's buffer
// (CreateLLA2AComms) instead of a symmetric window of ours.
//
// A failure frees the region's allocations, and a later call tries again;
// except that when the registration failed in some process of a spanning
// group, or a step after it failed here (CollectiveStepFailed: the other
// processes may still be inside the step, or may have completed it; NCCL's
// thread may still use the region), the whole set is given up (FailSet, by
// EnsureRegion's rule), and the set's failure is what every later
// EnsureRegion raises. The region that failed is then freed only when the
// communicators were aborted; otherwise it is kept (CommSet::abandoned).
void BuildRegions(std::vector<std::unique_ptr<DeviceResources>>& all, size_t first, int n,
                  int world, int64_t algorithm, int group, const RegionAgreement* agree,
                  const StepBound& bound, bool& fail_once,
                  std::vector<std::unique_ptr<Region>>& regions);
void ReleaseUnpublished(std::vector<std::unique_ptr<DeviceResources>>& all, size_t first,
                        std::vector<std::unique_ptr<Region>>& regions, bool comms_alive);
void AllocateRegions(std::vector<std::unique_ptr<DeviceResources>>& all, size_t first, int n,
                     uint64_t bytes, const AlgorithmEntry& entry, bool lla2a,
                     std::vector<std::unique_ptr<Region>>& regions);
void FinishRegions(std::vector<std::unique_ptr<DeviceResources>>& all, size_t first, int n,
                   int world, int64_t algorithm, uint64_t bytes, bool lla2a,
                   const StepBound& bound, std::vector<std::unique_ptr<Region>>& regions);
bool FailSet(CommSet& set, int64_t comm_id, const std::string& why);

void CreateRegion(CommSet& set, int64_t comm_id, size_t group, size_t first, int64_t algorithm,
                  const RegionAgreement* agree) {
  std::vector<std::unique_ptr<DeviceResources>>& all = set.devices;
  const GroupSpec& spec = set.groups[group];
  const int n = static_cast<int>(spec.ordinals.size());
  const int world = spec.world;
  const StepBound bound{Spans(spec), set.setup_timeout_ms,
                        MembersText(spec.ranks, spec.ordinals, world)};
  std::vector<std::unique_ptr<Region>> regions;
  try {
    BuildRegions(all, first, n, world, algorithm, static_cast<int>(group), agree, bound,
                 set.fail_next_registration, regions);
  } catch (const CollectiveStepFailed& e) {
    if (FailSet(set, comm_id, e.what())) {
      ReleaseUnpublished(all, first, regions, /*comms_alive=*/false);
    } else {
      for (size_t i = 0; i < regions.size(); ++i) {
        set.abandoned.emplace_back(first + i, std::move(regions[i]));
      }
    }
    Fail(set.failed);
  } catch (...) {
    ReleaseUnpublished(all, first, regions, /*comms_alive=*/true);
    throw;
  }
  // Every device of the group is complete: publish.
  for (int i = 0; i < n; ++i) {
    DeviceResources& d = *all[first + i];
    d.regions[algorithm] = std::move(regions[i]);
    d.context.args[algorithm].store(&d.regions[algorithm]->args, std::memory_order_release);
  }
}

// Calls `agree` for `stage`; a throw counts as a refusal (RegionAgreement
// must not throw).
bool Agree(const RegionAgreement& agree, int group, const char* stage,
           const std::string& local_error) {
  try {
    return agree(group, stage, local_error);
  } catch (...) {
    return false;
  }
}

// CreateRegion's work up to publication: fills `regions` (one per local
// device of the group, `n` of the group's `world` ranks, each pushed before
// its first allocation, so that a failure leaves every allocation reachable
// for ReleaseUnpublished). Returns when every process of the group (this
// one alone without `agree`) completed the region; throws
// CollectiveStepFailed when the set must be given up (EnsureRegion's rule),
// std::runtime_error for a failure that leaves the set as it was. Clears
// `fail_once` (the test hook) when it fails the registration.
void BuildRegions(std::vector<std::unique_ptr<DeviceResources>>& all, size_t first, int n,
                  int world, int64_t algorithm, int group, const RegionAgreement* agree,
                  const StepBound& bound, bool& fail_once,
                  std::vector<std::unique_ptr<Region>>& regions) {
  const AlgorithmEntry& entry = kAlgorithms[algorithm];
  const uint64_t bytes = RegionBytes(static_cast<Algorithm>(algorithm), world);
  const bool lla2a = entry.lla2a_slots != nullptr;  // NCCL's buffer, no scratch of ours
  std::string local_error;
  try {
    AllocateRegions(all, first, n, bytes, entry, lla2a, regions);
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  // Every process of the group learns whether every process allocated
  // before any enters the collective calls below.
  if (agree != nullptr && !Agree(*agree, group, kStageAllocated, local_error) &&
      local_error.empty()) {
    Fail(std::string("jax_llar: another process of the group could not allocate its ") +
         entry.name + " region (its error is in that process's log)");
  }
  if (!local_error.empty()) Fail(local_error);

  // The registration, then (stage "registered") the outcome in every
  // process, before anything is published: a registration can complete in
  // one process (its barrier passed) while another's bound ran out just
  // before it saw its own complete.
  std::string error;
  bool collective = false;  // the step itself failed: the set must be given up
  try {
    FinishRegions(all, first, n, world, algorithm, bytes, lla2a, bound, regions);
    if (std::exchange(fail_once, false)) {
      throw CollectiveStepFailed(std::string("jax_llar: ") +
                                 (lla2a ? "ncclDevCommCreate (LL all-to-all)"
                                        : "ncclCommWindowRegister") +
                                 " made to fail after it completed for " + bound.who +
                                 " (test hook: FailNextRegistrationForTesting)");
    }
  } catch (const CollectiveStepFailed& e) {
    error = e.what();
    collective = true;
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (agree == nullptr) {  // this process holds every rank of the group
    if (collective) throw CollectiveStepFailed(error);
    if (!error.empty()) Fail(error);
    return;
  }
  // A spanning group: every process publishes, or every process gives up
  // the set (the others' registrations completed, or may still complete,
  // with this process's memory).
  if (Agree(*agree, group, kStageRegistered, error) && error.empty()) return;
  throw CollectiveStepFailed(
      error.empty() ? std::string("jax_llar: another process of the group could not "
                                  "complete the registration of its ") +
                          entry.name + " region (its error is in that process's log)"
                    : error);
}

// BuildRegions' local allocations (scratch, peer table) on each local device.
void AllocateRegions(std::vector<std::unique_ptr<DeviceResources>>& all, size_t first, int n,
                     uint64_t bytes, const AlgorithmEntry& entry, bool lla2a,
                     std::vector<std::unique_ptr<Region>>& regions) {
  for (int i = 0; i < n; ++i) {
    DeviceResources& d = *all[first + i];
    regions.push_back(std::make_unique<Region>());
    Region* r = regions.back().get();
    r->bytes = bytes;
    CheckCuda(cudaSetDevice(d.context.ordinal), "cudaSetDevice");
    SetupStream setup;
    if (!lla2a) {
      CheckNccl(ncclMemAlloc(&r->scratch, bytes), "ncclMemAlloc");
      CheckCuda(cudaMemsetAsync(r->scratch, entry.fill, bytes, setup.stream),
                "cudaMemsetAsync(scratch)");
    }
    CheckCuda(cudaMalloc(&r->peers, sizeof(PeerTable)), "cudaMalloc(peer table)");
    CheckCuda(cudaStreamSynchronize(setup.stream), "cudaStreamSynchronize");
  }
}

// BuildRegions after the agreement: the collective registration (a window,
// or NCCL's LL all-to-all buffer) and each local device's peer table.
void FinishRegions(std::vector<std::unique_ptr<DeviceResources>>& all, size_t first, int n,
                   int world, int64_t algorithm, uint64_t bytes, bool lla2a,
                   const StepBound& bound, std::vector<std::unique_ptr<Region>>& regions) {
  if (lla2a) {
    CreateLLA2AComms(all, first, n, world, algorithm, bound, regions);
  } else {
    // Window registration is collective over the group: a CollectiveStep.
    CollectiveStep(bound, all, first, n, "ncclCommWindowRegister", [&] {
      for (int i = 0; i < n; ++i) {
        CheckStep(bound,
                  ncclCommWindowRegister(all[first + i]->comm, regions[i]->scratch, bytes,
                                         &regions[i]->window, NCCL_WIN_COLL_SYMMETRIC),
                  "ncclCommWindowRegister");
      }
    });
  }
  for (int i = 0; i < n; ++i) {
    DeviceResources& d = *all[first + i];
    Region& r = *regions[i];
    CheckCuda(cudaSetDevice(d.context.ordinal), "cudaSetDevice");
    SetupStream setup;
    PeerTable table{};
    if (lla2a) {
      table.nccl_lla2a = r.lla2a_device;
    } else {
      void* peers[kMaxRanks] = {};
      CheckCuda(ReadLsaPointers(r.window, world, peers, setup.stream),
                "reading LSA peer pointers");
      for (int p = 0; p < world; ++p) table.scratch[p] = static_cast<char*>(peers[p]);
    }
    table.error_claim = reinterpret_cast<int32_t*>(d.state + kClaimWord);
    CheckCuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&table.error), d.error, 0),
              "cudaHostGetDevicePointer");
    table.timeout_ns = d.timeout_ns;
    CheckCuda(cudaMemcpyAsync(r.peers, &table, sizeof(table), cudaMemcpyHostToDevice,
                              setup.stream),
              "cudaMemcpyAsync(peer table)");
    CheckCuda(cudaStreamSynchronize(setup.stream), "cudaStreamSynchronize");
    r.args.epochs = d.state + EpochSetOffset(static_cast<Algorithm>(algorithm));
    r.args.peers = r.peers;
    r.args.rank = static_cast<uint8_t>(d.context.rank);
    r.args.world = static_cast<uint8_t>(world);
  }
}

// Frees what BuildRegions allocated for regions that were never published (a
// failure part-way), so that a later EnsureRegion, which tries again, does
// not leak a region per attempt. Best effort: errors are ignored and cleared.
// Window deregistration and device-communicator destruction are grouped like
// their creation; without `comms_alive` (the communicators were aborted,
// which released NCCL's part) only the memory of ours is freed.
void ReleaseUnpublished(std::vector<std::unique_ptr<DeviceResources>>& all, size_t first,
                        std::vector<std::unique_ptr<Region>>& regions, bool comms_alive) {
  bool windows = false, lla2a = false;
  for (const auto& r : regions) {
    windows = windows || (comms_alive && r->window != nullptr);
    lla2a = lla2a || (comms_alive && r->lla2a_comm_created);
  }
  if (windows) {
    (void)ncclGroupStart();
    for (size_t i = 0; i < regions.size(); ++i) {
      if (regions[i]->window != nullptr) {
        (void)ncclCommWindowDeregister(all[first + i]->comm, regions[i]->window);
      }
    }
    (void)ncclGroupEnd();
  }
  if (lla2a) {
    (void)ncclGroupStart();
    for (size_t i = 0; i < regions.size(); ++i) {
      if (regions[i]->lla2a_comm_created) {
        (void)ncclDevCommDestroy(all[first + i]->comm, &regions[i]->lla2a.comm);
      }
    }
    (void)ncclGroupEnd();
  }
  for (size_t i = 0; i < regions.size(); ++i) {
    Region& r = *regions[i];
    if (cudaSetDevice(all[first + i]->context.ordinal) != cudaSuccess) continue;
    if (r.scratch != nullptr) (void)ncclMemFree(r.scratch);
    if (r.peers != nullptr) (void)cudaFree(r.peers);
    if (r.lla2a_device != nullptr) (void)cudaFree(r.lla2a_device);
  }
  (void)cudaGetLastError();
  regions.clear();
}

// Gives up `set` (id `comm_id`) after a region's registration failed in
// some process of one of its groups (CreateRegion), by EnsureRegion's rule
// (registry.h): records `why`, withdraws every region (HasRegion answers
// false, so lowerings ask EnsureRegion, which raises it; the execute handler
// finds no argument block), and then:
// - when the set has published a region (a program may have been compiled
//   with it): keeps every communicator, and so NCCL's mappings of the peers'
//   memory, and every region's memory. ncclCommAbort would free the
//   communicator (NCCL 2.28: commReclaim, commFree, ncclDevrFinalize), which
//   unmaps and releases the whole load/store-accessible address range that
//   the published regions' peer tables point into (ncclGetLsaPointer), while
//   kernels of programs captured earlier may still run, or be replayed from
//   a CUDA graph without the handler: they would store to unmapped addresses
//   (an illegal address, no error record) or into memory mapped there later.
//   Kept, they end as any call whose peer is gone does: in the bounded-wait
//   error, with a report. No NCCL call is made on the set again.
// - when it has none: no program was ever launched with it (the instantiate
//   stage refuses an algorithm without its region), so every communicator is
//   aborted: that stops NCCL's threads (so the failed region can be freed)
//   and closes this process's connections, so the other processes' steps end
//   in an error instead of waiting out their bound.
// Returns whether it aborted the communicators. The caller holds g_mutex.
bool FailSet(CommSet& set, int64_t comm_id, const std::string& why) {
  bool published = false;
  for (const auto& d : set.devices) {
    for (const auto& r : d->regions) published = published || r != nullptr;
  }
  set.failed = why + "; this process gave up communicator set " + std::to_string(comm_id) +
               (published ? " (its regions withdrawn; its communicators and memory kept for "
                            "the programs already compiled with it)"
                          : " (its regions withdrawn, its communicators aborted)");
  g_region_masks[comm_id].store(0, std::memory_order_release);
  for (auto& d : set.devices) {
    for (auto& args : d->context.args) args.store(nullptr, std::memory_order_release);
  }
  if (published) return false;
  for (auto& d : set.devices) {
    if (d->comm != nullptr) (void)ncclCommAbort(d->comm);
    d->comm = nullptr;
  }
  (void)cudaGetLastError();
  return true;
}

// Runs `preloads` on every device of `set`, ignoring their results
// (AddPreload). The caller holds g_mutex and a DeviceGuard.
void RunPreloadsBestEffort(const CommSet& set,
                           const std::vector<cudaError_t (*)()>& preloads) {
  for (const auto& d : set.devices) {
    if (cudaSetDevice(d->context.ordinal) != cudaSuccess) {
      (void)cudaGetLastError();  // leave no error behind for a later check
      continue;
    }
    for (auto preload : preloads) (void)preload();
  }
}

}  // namespace

int CreateCommSet(const std::vector<std::vector<int>>& groups,
                  uint64_t timeout_ns) {
  std::vector<GroupSpec> specs;
  for (const auto& g : groups) {
    GroupSpec spec;
    spec.world = static_cast<int>(g.size());
    spec.ordinals = g;
    for (int r = 0; r < spec.world; ++r) spec.ranks.push_back(r);
    specs.push_back(std::move(spec));
  }
  return CreateCommSetOfRanks(specs, timeout_ns, /*setup_timeout_ms=*/0);  // no spanning group
}

std::string NcclUniqueId() {
  ncclUniqueId id;
  CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

int CreateCommSetOfRanks(const std::vector<GroupSpec>& groups, uint64_t timeout_ns,
                         uint64_t setup_timeout_ms) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_sets.size() >= static_cast<size_t>(kMaxCommSets)) {
    Fail("jax_llar: too many communicator sets (" + std::to_string(kMaxCommSets) + ")");
  }
  ValidateGroups(groups, setup_timeout_ms);
  DeviceGuard guard;
  auto set = std::make_unique<CommSet>();
  set->groups = groups;
  set->setup_timeout_ms = setup_timeout_ms;
  try {
    for (const auto& g : groups) CreateGroup(g, timeout_ns, setup_timeout_ms, set->devices);
  } catch (const CollectiveStepFailed& e) {
    ReleaseDevices(set->devices);
    Fail(std::string(e.what()) + "; this process aborted its communicators of the set");
  } catch (...) {
    ReleaseDevices(set->devices);
    throw;
  }
  const int id = static_cast<int>(g_sets.size());
  for (const auto& d : set->devices) {
    g_table[id][d->context.ordinal].store(&d->context, std::memory_order_release);
  }
  g_keys[id].store(KeyOfGroups(groups), std::memory_order_release);
  g_sets.push_back(std::move(set));
  // The tools' kernels, only after the set is published and never failing
  // its creation.
  RunPreloadsBestEffort(*g_sets.back(), g_preloads);
  return id;
}

void DestroyCommSet(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (comm_id <= 0 || comm_id >= static_cast<int64_t>(g_sets.size())) {
    Fail("jax_llar: no communicator set " + std::to_string(comm_id));
  }
  CommSet& set = *g_sets[comm_id];
  if (set.destroyed) return;
  for (const auto& d : set.devices) {
    for (int64_t a = 1; a < kAlgorithmCount; ++a) {
      if (d->regions[a]) {
        Fail("jax_llar: communicator set " + std::to_string(comm_id) + " holds the " +
             kAlgorithms[a].name +
             " scratch region, so a program may have been compiled with it; it is kept "
             "for the life of the process (only a set without regions can be destroyed)");
      }
    }
  }
  // Withdrawn before anything is freed: instantiate (KeyOf) and execute
  // (Lookup) find no set, EnsureRegion throws `failed`.
  g_keys[comm_id].store(0, std::memory_order_release);
  g_region_masks[comm_id].store(0, std::memory_order_release);
  for (const auto& d : set.devices) {
    g_table[comm_id][d->context.ordinal].store(nullptr, std::memory_order_release);
  }
  set.failed = "jax_llar: communicator set " + std::to_string(comm_id) + " was destroyed";
  set.destroyed = true;
  DeviceGuard guard;
  ReleaseDevices(set.devices);  // ncclCommAbort, then the state words and error records
  set.groups.clear();
}

const DeviceContext* Lookup(int64_t comm_id, int32_t ordinal) {
  if (comm_id <= 0 || comm_id >= kMaxCommSets || ordinal < 0 ||
      ordinal >= kMaxOrdinals) {
    return nullptr;
  }
  return g_table[comm_id][ordinal].load(std::memory_order_acquire);
}

void EnsureRegion(int64_t comm_id, int64_t algorithm, const RegionAgreement* agree) {
  if (FindAlgorithm(algorithm) == nullptr) {
    Fail("jax_llar: unknown algorithm " + std::to_string(algorithm));
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (comm_id <= 0 || comm_id >= static_cast<int64_t>(g_sets.size())) {
    Fail("jax_llar: no communicator set " + std::to_string(comm_id));
  }
  CommSet& set = *g_sets[comm_id];
  if (!set.failed.empty()) Fail(set.failed);
  DeviceGuard guard;
  size_t first = 0;
  for (size_t gi = 0; gi < set.groups.size(); ++gi) {
    // Groups are created whole, so the first device tells for the group.
    if (!set.devices[first]->regions[algorithm]) {
      CreateRegion(set, comm_id, gi, first, algorithm, agree);
    }
    first += set.groups[gi].ordinals.size();
  }
  g_region_masks[comm_id].fetch_or(uint32_t(1) << algorithm, std::memory_order_release);
}

bool HasRegion(int64_t comm_id, int64_t algorithm) {
  if (FindAlgorithm(algorithm) == nullptr || comm_id <= 0 || comm_id >= kMaxCommSets) {
    return false;
  }
  return (g_region_masks[comm_id].load(std::memory_order_acquire) >> algorithm) & 1u;
}

uint64_t ScratchBytesOf(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (comm_id <= 0 || comm_id >= static_cast<int64_t>(g_sets.size())) return 0;
  const CommSet& set = *g_sets[comm_id];
  std::vector<uint64_t> bytes(set.devices.size(), 0);
  for (size_t i = 0; i < set.devices.size(); ++i) {
    for (const auto& r : set.devices[i]->regions) bytes[i] += r ? r->bytes : 0;
  }
  // The regions kept in a given-up set hold their memory too (FailSet).
  for (const auto& [device, r] : set.abandoned) {
    if (r != nullptr && device < bytes.size()) bytes[device] += r->bytes;
  }
  uint64_t most = 0;
  for (const uint64_t b : bytes) most = std::max(most, b);
  return most;
}

std::vector<int64_t> RegionsOf(int64_t comm_id) {
  std::vector<int64_t> out;
  for (int64_t a = 1; a < kAlgorithmCount; ++a) {
    if (HasRegion(comm_id, a)) out.push_back(a);
  }
  return out;
}

int64_t KeyOfGroups(const std::vector<GroupSpec>& groups) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    h ^= v;
    h *= 1099511628211ull;
  };
  for (const auto& g : groups) {
    mix(0x10000ull + static_cast<uint64_t>(g.world));
    for (size_t i = 0; i < g.ordinals.size(); ++i) {
      mix(0x20000ull + static_cast<uint64_t>(g.ranks[i]));
      mix(static_cast<uint64_t>(g.ordinals[i]) + 1);
    }
    mix(0xffffull);  // group separator
  }
  return static_cast<int64_t>(h & 0x7fffffffffffffffull);
}

int64_t KeyOf(int64_t comm_id) {
  if (comm_id <= 0 || comm_id >= kMaxCommSets) return 0;
  return g_keys[comm_id].load(std::memory_order_acquire);
}

std::vector<ErrorReport> ErrorReports() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<ErrorReport> out;
  for (size_t id = 1; id < g_sets.size(); ++id) {
    for (const auto& d : g_sets[id]->devices) {
      ErrorRecord r;
      std::memcpy(&r, const_cast<const ErrorRecord*>(d->error), sizeof(r));
      if (r.code != 0) out.push_back({static_cast<int64_t>(id), d->context.ordinal, r});
    }
  }
  return out;
}

std::vector<std::vector<Member>> MembersOf(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (comm_id <= 0 || comm_id >= static_cast<int64_t>(g_sets.size())) return {};
  const CommSet& set = *g_sets[comm_id];
  for (const auto& g : set.groups) {
    if (static_cast<int>(g.ordinals.size()) != g.world) {
      Fail("jax_llar: communicator set " + std::to_string(comm_id) +
           " spans processes; the tools (kernel bench, call trace, test hooks) serve only "
           "sets whose ranks are all in this process");
    }
  }
  std::vector<std::vector<Member>> out;
  size_t next = 0;  // set.devices holds the groups' devices in order
  for (const auto& g : set.groups) {
    std::vector<Member> members;
    for (size_t i = 0; i < g.ordinals.size(); ++i, ++next) {
      const DeviceResources& d = *set.devices[next];
      std::vector<MemberRegion> regions(kAlgorithmCount);
      for (int64_t a = 1; a < kAlgorithmCount; ++a) {
        if (d.regions[a]) regions[a] = {d.regions[a]->scratch, d.regions[a]->bytes};
      }
      members.push_back({d.context.ordinal, d.context.rank, d.context.world, d.comm, d.state,
                         std::move(regions), &d.context});
    }
    out.push_back(std::move(members));
  }
  return out;
}

void SetLauncherOverride(int64_t comm_id, int32_t ordinal, int64_t algorithm,
                         Launcher launcher) {
  if (FindAlgorithm(algorithm) == nullptr) {
    Fail("jax_llar: unknown algorithm " + std::to_string(algorithm));
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (comm_id > 0 && comm_id < static_cast<int64_t>(g_sets.size())) {
    for (const auto& d : g_sets[comm_id]->devices) {
      if (d->context.ordinal == ordinal) {
        // The only field of a published context that changes; the execute
        // handler reads its algorithm's entry with one relaxed load.
        d->context.launcher_override[algorithm].store(launcher, std::memory_order_relaxed);
        return;
      }
    }
  }
  Fail("jax_llar: communicator set " + std::to_string(comm_id) +
       " has no member on CUDA device " + std::to_string(ordinal));
}

void AddPreload(cudaError_t (*preload)()) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (std::find(g_preloads.begin(), g_preloads.end(), preload) != g_preloads.end()) return;
  g_preloads.push_back(preload);
  if (g_sets.size() <= 1) return;  // no set: no CUDA call (not even DeviceGuard's)
  DeviceGuard guard;
  for (size_t id = 1; id < g_sets.size(); ++id) RunPreloadsBestEffort(*g_sets[id], {preload});
}

void FailNextRegistrationForTesting(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (comm_id <= 0 || comm_id >= static_cast<int64_t>(g_sets.size())) {
    Fail("jax_llar: no communicator set " + std::to_string(comm_id));
  }
  g_sets[comm_id]->fail_next_registration = true;
}

NcclSetting NcclSettingOf(const std::string& name, const std::vector<std::string>& files) {
  if (const char* v = std::getenv(name.c_str())) return {true, v, "the environment"};
  // NCCL 2.28's setEnvFile: getline, skip a line whose first byte is '#',
  // drop the final '\n', split at the first '=' (a line without one is
  // skipped), both sides read as C strings, at most 1023 bytes each, then
  // setenv(name, value, 0): the first line that sets a name wins.
  constexpr size_t kMaxPart = 1023;
  for (const std::string& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line[0] == '#') continue;
      line.resize(std::min(line.size(), line.find('\0')));
      const size_t eq = line.find('=');
      if (eq == std::string::npos) continue;
      if (line.compare(0, std::min(eq, kMaxPart), name) != 0) continue;
      if (name.empty()) continue;  // setenv refuses an empty name
      return {true, line.substr(eq + 1, kMaxPart), path};
    }
  }
  return {};
}

std::vector<std::string> NcclConfFiles() {
  // NCCL 2.28's initEnvFunc: paths through a 1024-byte buffer. (NCCL 2.30
  // takes the home directory from $HOME instead.)
  constexpr size_t kMaxPath = 1023;
  std::vector<std::string> files;
  const char* user = std::getenv("NCCL_CONF_FILE");
  if (user != nullptr && user[0] != '\0') {
    files.push_back(std::string(user).substr(0, kMaxPath));
  } else {
    struct passwd entry;
    struct passwd* found = nullptr;
    std::vector<char> buffer(16384);
    if (getpwuid_r(getuid(), &entry, buffer.data(), buffer.size(), &found) == 0 &&
        found != nullptr) {
      const std::string home = found->pw_dir != nullptr ? found->pw_dir : "";
      files.push_back((home + "/.nccl.conf").substr(0, kMaxPath));
    }
  }
  files.push_back("/etc/nccl.conf");
  return files;
}

int64_t NcclIntValue(const std::string& value, int64_t fallback) {
  if (value.empty()) return fallback;
  errno = 0;
  const long long v = std::strtoll(value.c_str(), nullptr, 0);
  return errno != 0 ? fallback : static_cast<int64_t>(v);
}

int NcclRuntimeVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return -1;
  return v;
}

int NcclCompiledVersion() { return NCCL_VERSION_CODE; }

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

bool CanAccessPeer(int a, int b) {
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess) return false;
  return can != 0;
}

}  // namespace llar
