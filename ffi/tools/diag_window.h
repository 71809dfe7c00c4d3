// The send-and-loopback variant's symmetric window (one_shot_ll_diag.h):
// kDiagBytes per rank, apart from the production scratch, allocated the
// first time the variant runs on a communicator set.
#ifndef LLAR_TOOLS_DIAG_WINDOW_H_
#define LLAR_TOOLS_DIAG_WINDOW_H_

#include <cstdint>
#include <vector>

#include "llar/args.h"

namespace llar {

// For group 0 of `comm_id`, in rank order: the device PeerTable that the
// send-and-loopback variant takes as args.peers. It is the rank's production
// table with every peer's entry replaced by that peer's diagnostic window
// (the rank's own entry, where the variant loops its lines back and polls,
// stays its protocol scratch). The first call for a set allocates the
// windows (ncclMemAlloc + ncclCommWindowRegister, grouped over the ranks),
// reads their peer addresses (ReadLsaPointers) and builds the tables; they
// live as long as the process. Synchronises the group's devices; call it
// while no program runs on them. Throws std::runtime_error on failure.
std::vector<const PeerTable*> SendLoopbackTables(int64_t comm_id);

}  // namespace llar

#endif  // LLAR_TOOLS_DIAG_WINDOW_H_
