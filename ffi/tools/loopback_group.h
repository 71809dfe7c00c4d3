// Loopback group: `world` simulated ranks of one process on ONE GPU behind
// XLA FFI custom calls, so that a JAX program runs the production kernels of
// every rank inside XLA's stream and command buffer, as the real path does.
// (The loopback harness, loopback.h, runs the same kernels outside XLA.)
//
// Set-up (CreateLoopbackGroup), as CreateCommSet and EnsureRegion
// (registry/) give a real group's ranks: per rank, the state words (every
// set's epoch counters and the claim word, zeroed), a host-mapped zeroed
// ErrorRecord and a non-blocking stream; per rank and requested algorithm,
// the algorithm's region (RegionBytes for `world`, its fill byte) and a
// PeerTable whose scratch[p] is simulated rank p's region, with the bound
// `timeout_ns`; per rank and algorithm, the argument block a DeviceContext's
// AlgorithmCall holds (epochs = state + EpochSetOffset, peers, rank, world).
// Every algorithm's kernels are loaded first, as EnsureRegion does.
//
// The targets (execute only, kCmdBufferCompatible, registered for CUDA by
// jax_llar.tools._native):
//   jax_llar_loopback_all_reduce   x (world, ...) -> y (world, ...): row r is
//       rank r's input and output; attrs group_id, algorithm (kAlgorithms
//       id, a region of the group), signature (the call's, 0..65535).
//   jax_llar_loopback_add_rms_norm x, residual (world, ..., d), weight (d,)
//       -> normed, new_residual (world, ..., d): the fused kernel per rank
//       on the one-shot LL's region and counters; attrs group_id, eps,
//       signature.
// Each call forks the group's rank streams from XLA's stream (an event
// recorded on it, waited for by every rank stream), then launches rank r's
// kernel on rank r's stream, rank 0 first, then joins them back (an event
// per rank, waited for by XLA's stream): breadth first, so that no kernel
// waits in a hardware queue behind a join. Under stream capture (XLA's
// command buffers) the fork and join become graph dependencies and the W
// kernels parallel nodes; the rank streams stay in that capture until it
// ends, so a call from another capture (another thread) is refused. Nothing
// changes on the host per call; the epochs live in device memory, so a
// replayed graph pairs calls as a fresh launch does. Calls of one group are
// serialised by a mutex; use a group from one thread; it lives on one device.
//
// Concurrency of the W kernels is what CUDA gives streams with hardware
// queues of their own (CUDA_DEVICE_MAX_CONNECTIONS, read when the context
// is made; the one-GPU suite sets 32) and a graph's parallel branches; CUDA
// promises neither. Kernels that do not run together end in the bounded
// wait's report and trap, never hang.
//
// Co-residency: a block of one rank waits for the same block of every other
// rank, so all W grids must be resident at once. The Python side
// (jax_llar.tools.loopback.group) checks each call's plan
// (PlanLoopback / PlanFusedLoopback) when it is traced and refuses a size
// whose grids do not fit, with the reason; the handlers themselves only
// check shapes, dtypes and limits. A call that runs anyway and waits in
// vain ends in the bounded wait's trap (wait.cuh), never a hang.
//
// What it proves: the handler-shaped path inside XLA (command buffer
// capture, graph replay, donation, executables sharing a group, operand
// layouts, loops, export, the persistent cache, profiler names) with the
// production kernels and protocol. Not NVLink (every store is local), not
// speed, not two processes.
#ifndef LLAR_TOOLS_LOOPBACK_GROUP_H_
#define LLAR_TOOLS_LOOPBACK_GROUP_H_

#include <cstdint>
#include <vector>

#include "llar/args.h"

namespace llar {

// Creates a group of `world` (2..kMaxRanks) simulated ranks on CUDA device
// `ordinal` holding the regions of `algorithms` (kAlgorithms ids; not those
// on NCCL's LL all-to-all session, which need a device communicator), each
// rank's kernels waiting at most `timeout_ns` (above zero, at most ten minutes). Returns
// its id (>= 1, never reused). Throws std::invalid_argument for a bad
// argument, std::runtime_error for a CUDA failure (after freeing what it
// made).
int64_t CreateLoopbackGroup(int32_t ordinal, int world, const std::vector<int64_t>& algorithms,
                            uint64_t timeout_ns);

// Withdraws group `id`: the handlers refuse it from then on ("no loopback
// group"), so a program traced or run eagerly afterwards fails clearly. Its
// memory stays for the life of the process, as the registry keeps a set's:
// a command buffer that XLA captured earlier holds its addresses and may
// replay. Then waits (bounded: twice the kernel timeout plus kHostMarginNs)
// for the group's streams. Throws std::invalid_argument for an unknown id,
// std::runtime_error when the streams failed or did not finish in time
// (withdrawn either way).
void DestroyLoopbackGroup(int64_t id);

// What a group is: device, number of ranks, regions held (ids ascending).
struct LoopbackGroupInfo {
  int32_t ordinal = -1;
  int world = 0;
  std::vector<int64_t> algorithms;
  uint64_t timeout_ns = 0;
};
// Throws std::invalid_argument for an unknown id.
LoopbackGroupInfo LoopbackGroupInfoOf(int64_t id);

// Each rank's error record (host memory, readable after a trap) and each
// rank's kStateWords state words (a device copy after a bounded wait for the
// rank streams, not for XLA's stream: block on a program's results first;
// throws std::runtime_error when the copy fails, e.g. after a trap).
std::vector<ErrorRecord> LoopbackGroupRecords(int64_t id);
std::vector<std::vector<uint64_t>> LoopbackGroupState(int64_t id);

struct LoopbackHandlers {
  void* all_reduce;    // XLA_FFI_Handler* of jax_llar_loopback_all_reduce
  void* add_rms_norm;  // of jax_llar_loopback_add_rms_norm
};
LoopbackHandlers GetLoopbackHandlers();

}  // namespace llar

#endif  // LLAR_TOOLS_LOOPBACK_GROUP_H_
