#pragma once

// Peer-level differential privacy (DP-FedAvg, McMahan et al. 2018, "Learning Differentially
// Private Recurrent Language Models"): the two operations on an update, clipping it to an L2
// norm and adding Gaussian noise to it (or to a sum of clipped updates).

#include <cstdint>
#include <random>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace shoal::privacy {

// Scales `values` (a whole update: every tensor together) in place so that its L2 norm is at most
// `clip_norm` (> 0): values x min(1, clip_norm / norm). Returns the norm before clipping. The
// norm is summed in double; a non-finite value makes the norm non-finite and leaves `values`
// as they were (the caller refuses such an update anyway).
double ClipToNorm(absl::Span<float> values, double clip_norm);

// The L2 norm of `values`, summed in double.
double L2Norm(absl::Span<const float> values);

// A 64-bit Mersenne Twister seeded with 256 bits from OpenSSL's CSPRNG (RAND_bytes): what DP's
// randomness (noise, DP-SGD's batch sampling) draws from, never a task's reproducibility seed.
// Errors: INTERNAL "RAND_bytes failed: no system entropy for <what>".
absl::StatusOr<std::mt19937_64> EngineFromSystemEntropy(absl::string_view what);

// A source of Gaussian noise for DP: std::normal_distribution over a 64-bit Mersenne Twister.
// FromSystemEntropy() seeds it with 256 bits from OpenSSL's CSPRNG (RAND_bytes), never from a
// task's reproducibility seed (noise an adversary can replay protects nothing). A fixed seed is
// for statistics checks only. Owned by one caller; not thread-safe.
class GaussianNoise {
 public:
  static absl::StatusOr<GaussianNoise> FromSystemEntropy();
  static GaussianNoise FromSeed(uint64_t seed);

  // values[i] += N(0, stddev²) for every i; stddev >= 0 (0 adds nothing).
  void Add(absl::Span<float> values, double stddev);

 private:
  explicit GaussianNoise(std::mt19937_64 engine) : engine_(engine) {}
  std::mt19937_64 engine_;
};

// The standard deviation each of `peers` (n >= 1) peers adds to its clipped update with
// distributed noise, so that the sum of n updates carries noise_multiplier x clip_norm:
// σ·C / √n.
double DistributedNoiseStddev(double noise_multiplier, double clip_norm, uint32_t peers);

}  // namespace shoal::privacy
