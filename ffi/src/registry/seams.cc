#include "registry/seams.h"

#include <cstdint>
#include <mutex>
#include <set>
#include <string>

#include "errors.h"
#include "kernels/kernels.h"
#include "registry/collective_step.h"
#include "registry/internal.h"

namespace llar {
namespace registry {
namespace {

// Sets whose next registration fails (FailNextRegistrationForTesting).
// Guarded by g_mutex; empty in production.
std::set<int64_t>& g_fail_next_registration = *new std::set<int64_t>();

}  // namespace

void RegistrationSeam(int64_t comm_id, const char* step, const std::string& who) {
  if (g_fail_next_registration.erase(comm_id) == 0) return;
  throw CollectiveStepFailed(std::string("jax_llar: ") + step +
                             " made to fail after it completed for " + who +
                             " (test hook: FailNextRegistrationForTesting)");
}

}  // namespace registry

using namespace registry;  // the API below works on the registry's state

void SetLauncherOverride(int64_t comm_id, int32_t ordinal, int64_t algorithm,
                         Launcher launcher) {
  const AlgorithmEntry* entry = FindAlgorithm(algorithm);
  if (entry == nullptr) Fail("jax_llar: unknown algorithm " + std::to_string(algorithm));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (comm_id > 0 && comm_id < static_cast<int64_t>(g_sets.size())) {
    CommSet& set = *g_sets[comm_id];
    for (const auto& d : set.devices) {
      if (d->context.ordinal != ordinal) continue;
      d->launchers[algorithm] = launcher != nullptr ? launcher : entry->launch;
      // A published call is replaced; a withdrawn one (a given-up set) stays
      // withdrawn, and a region created later is published with it.
      if (d->regions[algorithm] && set.failed.empty()) Publish(*d, algorithm);
      return;
    }
  }
  Fail("jax_llar: communicator set " + std::to_string(comm_id) +
       " has no member on CUDA device " + std::to_string(ordinal));
}

void FailNextRegistrationForTesting(int64_t comm_id) {
  std::lock_guard<std::mutex> lock(g_mutex);
  SetOf(comm_id);  // throws for an unknown set
  g_fail_next_registration.insert(comm_id);
}

}  // namespace llar
