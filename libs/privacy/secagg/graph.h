#pragma once

// The neighbourhood graph of SecAgg+ (Bell et al. 2020): who shares pairwise masks and Shamir
// shares with whom. Every participant derives the same graph from public data alone, so the
// aggregator cannot give two participants different views of it.
//
// With degree k >= n - 1 the graph is complete (SecAgg). Otherwise it is the Harary graph H(k, n):
// the participants are put on a ring in an order drawn from the public seed, and each is joined to
// the floor(k / 2) nearest on either side; for an odd k each is also joined to the one opposite
// (i + floor(n / 2)), which gives degree k when n is even and k + 1 when n is odd.

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shoal::privacy::secagg {

class NeighbourhoodGraph {
 public:
  // `participants`: distinct ids, in any order (the graph depends on the set, not the order).
  // `degree` >= 1; `seed` 32 bytes (read only when the graph is not complete). Errors:
  // INVALID_ARGUMENT naming the bad argument; INTERNAL if OpenSSL fails.
  static absl::StatusOr<NeighbourhoodGraph> Create(std::vector<std::string> participants,
                                                   int degree, absl::string_view seed);

  // The participants, sorted byte-wise.
  const std::vector<std::string>& participants() const { return participants_; }
  bool Contains(absl::string_view id) const { return neighbours_.contains(id); }
  // The neighbours of `id`, sorted byte-wise (never `id` itself); empty for a non-participant.
  const std::vector<std::string>& Neighbours(absl::string_view id) const;
  bool AreNeighbours(absl::string_view a, absl::string_view b) const;
  int min_degree() const { return min_degree_; }
  int max_degree() const { return max_degree_; }
  bool complete() const { return min_degree_ == static_cast<int>(participants_.size()) - 1; }

 private:
  NeighbourhoodGraph() = default;

  std::vector<std::string> participants_;
  absl::flat_hash_map<std::string, std::vector<std::string>> neighbours_;
  int min_degree_ = 0;
  int max_degree_ = 0;
};

}  // namespace shoal::privacy::secagg
