// The device state of the all-reduce written on NCCL's LL all-to-all session
// (nccl_lla2a_one_shot; NCCL 2.28 device API, nccl_device/ll_a2a.h), shared
// by the registry, which builds it, and the kernel, which reads it.
//
// Contract
//   The registry creates, per rank and when a lowering first picks the
//   algorithm (EnsureRegion), a device communicator of its own with one
//   resource requirement: ncclLLA2ACreateRequirement(kMaxBlocks,
//   ncclLLA2ACalcSlots(world * kLinesPerBlock, kPayloadBytesPerLine)), i.e.
//   kMaxBlocks sessions (one per thread block), each with world x
//   kLinesPerBlock slots of one 8-byte element per epoch parity (args.h:
//   NcclLLA2ABufferBytes is the buffer that asks for). It copies the
//   device communicator and the session handle NCCL filled in into one
//   NcclLLA2AComm in device memory and points the region's
//   PeerTable::nccl_lla2a at it; the kernel constructs its sessions from it.
//   Both are written once, before the region is published, and never again.
//
// The struct holds NCCL's types by value, so the kernel and the registry
// must be compiled against the headers of the NCCL the process loads
// (jax_llar._ext checks the runtime version against the compiled one).
#ifndef LLAR_NCCL_LLA2A_H_
#define LLAR_NCCL_LLA2A_H_

#include <nccl.h>
#include <nccl_device.h>

namespace llar {

struct NcclLLA2AComm {
  ncclDevComm comm;         // the device communicator created with the requirement
  ncclLLA2AHandle handle;   // its LL all-to-all buffer and slots per parity
};

}  // namespace llar

#endif  // LLAR_NCCL_LLA2A_H_
