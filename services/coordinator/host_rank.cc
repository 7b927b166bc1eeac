#include "services/coordinator/host_rank.h"

namespace shoal::coordinator {

double Compute(const common::v1::Capacity& c) { return c.cpu_cores() * c.matmul_gflops(); }

bool WellConnected(const common::v1::Capacity& c, double best_upload) {
  return c.upload_bytes_per_second() >= kWellConnected * best_upload;
}

bool ClearlyBetter(const common::v1::Capacity& candidate, const common::v1::Capacity& serving,
                   double factor) {
  const double up = candidate.upload_bytes_per_second();
  const double serving_up = serving.upload_bytes_per_second();
  const bool both_measured = up > 0 && serving_up > 0;
  if (both_measured && up >= factor * serving_up) return true;
  if (both_measured && up < kWellConnected * serving_up) return false;
  return Compute(serving) > 0 && Compute(candidate) >= factor * Compute(serving);
}

}  // namespace shoal::coordinator
