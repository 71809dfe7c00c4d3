#include "diag_window.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "errors.h"
#include "llar/args.h"
#include "lsa_pointers.h"
#include "one_shot_ll_diag.h"
#include "registry.h"

namespace llar {
namespace {

std::mutex g_mutex;  // guards g_tables and the creation of windows
std::map<int64_t, std::vector<const PeerTable*>> g_tables;


std::vector<const PeerTable*> Create(int64_t comm_id) {
  if (MembersOf(comm_id).empty()) {
    Fail("jax_llar: unknown communicator set " + std::to_string(comm_id));
  }
  // The diagnostic tables copy the one-shot's (error record, bound).
  constexpr int64_t kOneShot = static_cast<int64_t>(Algorithm::kOneShotLL);
  EnsureRegion(comm_id, kOneShot);
  const auto groups = MembersOf(comm_id);
  const std::vector<Member>& group = groups[0];
  const int n = static_cast<int>(group.size());
  DeviceGuard guard;
  std::vector<void*> buffers(n, nullptr);
  std::vector<ncclWindow_t> windows(n, nullptr);
  for (int r = 0; r < n; ++r) {
    CheckCuda(cudaSetDevice(group[r].ordinal), "cudaSetDevice");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    CheckNccl(ncclMemAlloc(&buffers[r], kDiagBytes), "ncclMemAlloc(diagnostic window)");
    CheckCuda(cudaMemset(buffers[r], 0, kDiagBytes), "cudaMemset(diagnostic window)");
    CheckCuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  // Collective over the group, one thread for every rank: grouped.
  GroupedCalls("ncclCommWindowRegister", [&] {
    for (int r = 0; r < n; ++r) {
      CheckNccl(ncclCommWindowRegister(group[r].comm, buffers[r], kDiagBytes, &windows[r],
                                       NCCL_WIN_COLL_SYMMETRIC),
                "ncclCommWindowRegister(diagnostic window)");
    }
  });
  std::vector<const PeerTable*> tables(n, nullptr);
  for (int r = 0; r < n; ++r) {
    CheckCuda(cudaSetDevice(group[r].ordinal), "cudaSetDevice");
    void* peers[kMaxRanks] = {};
    CheckCuda(ReadLsaPointers(windows[r], n, peers), "reading LSA peer pointers");
    PeerTable table;
    CheckCuda(cudaMemcpy(&table, ArgsOf(group[r].context, kOneShot)->peers, sizeof(table),
                         cudaMemcpyDeviceToHost),
              "cudaMemcpy(peer table)");
    for (int p = 0; p < n; ++p) {
      if (p != group[r].rank) table.scratch[p] = static_cast<char*>(peers[p]);
    }
    table.trace = nullptr;
    PeerTable* dev = nullptr;
    CheckCuda(cudaMalloc(&dev, sizeof(PeerTable)), "cudaMalloc(peer table)");
    CheckCuda(cudaMemcpy(dev, &table, sizeof(table), cudaMemcpyHostToDevice),
              "cudaMemcpy(peer table)");
    tables[r] = dev;
  }
  return tables;
}

}  // namespace

std::vector<const PeerTable*> SendLoopbackTables(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_tables.find(comm_id);
  if (it != g_tables.end()) return it->second;
  std::vector<const PeerTable*> tables = Create(comm_id);
  g_tables[comm_id] = tables;
  return tables;
}

}  // namespace llar
