// Store-atomicity test: does a 128-byte line that 8 lanes of a warp store
// with one 16-byte vector store instruction reach a reader as one unit?
//
// The LL128 protocol (include/llar/ll128.cuh) assumes it: a reader whose
// flag lane sees the line's flag word (the last 8 bytes, stored by the 8th
// lane) uses the other 120 bytes from the same load. No documentation
// promises it, so this tool looks for counterexamples under adversarial
// timing, with exactly the protocol's instructions (StoreLL128Part,
// LoadLL128Part) and lane mapping:
//   * `lines` lines of 128 bytes (128-byte aligned) in the reader's device
//     memory, in groups of 4 (the lines one warp store covers);
//   * one writer warp per group position and one reader warp per group,
//     spread over many multiprocessors; in round i the writer warp
//     (g - i * stride) mod groups writes group g, so each line is written by
//     a different warp (and block) in consecutive rounds;
//   * every 8-byte word of line L in round i is (i << 32) | (L << 4) | w
//     (w = 0..15; word 15 is the flag word, in lane 7's second 8 bytes);
//   * the reader polls its group with whole-line loads; once a flag lane
//     sees round i it checks every word of that line FROM THE SAME LOAD: a
//     word of an earlier round (or still zero) makes the load torn; it keeps
//     polling until the whole line carries round i (bounded), then acks the
//     group in the writer's memory; the writer writes round i + 1 only after
//     that ack, so a line is never overwritten while it is read (as in the
//     protocol, where a slot is rewritten only two epochs later);
//   * random delays (%globaltimer-seeded hash, __nanosleep) before about
//     half of the writers' stores and readers' polls; the other half run
//     back to back, so polls land while the store does.
// Split mode (a check that the detector can fail): the writer stores each
// line in two instructions, lanes 4-7 (with the flag) first, then after
// split_delay_ns lanes 0-3; a correct detector reports torn lines then.
//
// On one device (writer_device == reader_device) every access is local, so
// this tests the L2 path, not NVLink. With two devices and peer access the
// writer stores over the peer path (NVLink on the 2 x H200 machine; the
// Python tool records the link from nvidia-smi) and the reader acks back.
//
// Every wait is bounded (timeout_ns); the host also stops the kernels at
// max_seconds through a word in each device's memory that they read every
// 64 rounds and in every long wait, and the result says how many rounds
// were checked.
#ifndef LLAR_TOOLS_STORE_ATOMICITY_H_
#define LLAR_TOOLS_STORE_ATOMICITY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace llar {

struct StoreAtomicitySpec {
  int writer_device = 0;
  int reader_device = 0;
  uint32_t iterations = 1000;     // rounds per line, 1 .. 2^32 - 2
  uint32_t lines = 2048;          // a multiple of 4, 4 .. 65536
  uint32_t warps_per_block = 4;   // of both kernels, 1 .. 32
  uint32_t max_delay_ns = 1000;   // bound of the random delays, 0 .. 1000000
  bool split = false;             // store each line in two instructions (must tear)
  uint32_t split_delay_ns = 2000; // between the two halves in split mode
  uint64_t seed = 1;
  uint64_t timeout_ns = 5'000'000'000ull;  // bound on every device wait
  double max_seconds = 120;       // the host stops the kernels then
};

struct StoreAtomicityResult {
  // What was checked.
  uint64_t line_rounds = 0;       // (line, round) pairs the readers verified
  uint64_t rounds_completed = 0;  // line_rounds / lines (whole rounds, rounded down)
  uint64_t polls = 0;             // the readers' warp loads (4 lines each)
  // What was found.
  uint64_t torn_lines = 0;        // (line, round) pairs with at least one torn load
  uint64_t torn_loads = 0;        // loads whose flag was current but some word was not
  uint64_t bad_words = 0;         // words no round wrote there (a test bug), per load
  // The first torn load seen: its line, round and the 16 words it read.
  bool has_first_torn = false;
  uint32_t first_torn_line = 0;
  uint32_t first_torn_round = 0;
  std::vector<uint64_t> first_torn_words;
  // How it ended.
  bool stopped_by_host = false;   // max_seconds reached before all rounds
  bool timed_out = false;         // a device wait ran out (see timeout_*)
  std::string timeout_side;       // "writer" or "reader"
  uint32_t timeout_group = 0, timeout_round = 0;
  bool deadline_exceeded = false; // kernels still ran after the host's last wait
  std::string cuda_error;
  double seconds = 0;             // from launch to the end of both kernels
  // Where it ran.
  bool same_device = true;
  int p2p_native_atomics = -1;    // cudaDevP2PAttrNativeAtomicSupported (peer only)
  int p2p_performance_rank = -1;  // cudaDevP2PAttrPerformanceRank (peer only)
  std::string writer_name, reader_name, writer_pci_bus_id, reader_pci_bus_id;
  uint32_t writer_blocks = 0, reader_blocks = 0, threads_per_block = 0;
  int writer_sms = 0, reader_sms = 0;
};

// Throws std::invalid_argument for a spec outside the limits above (or
// kernels that cannot all be resident on a shared device) and
// std::runtime_error for a CUDA failure while setting up (before the
// launch) or missing peer access between the two devices; failures after the
// launch are reported in the result.
StoreAtomicityResult RunStoreAtomicity(const StoreAtomicitySpec& spec);

}  // namespace llar

#endif  // LLAR_TOOLS_STORE_ATOMICITY_H_
