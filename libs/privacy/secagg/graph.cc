#include "libs/privacy/secagg/graph.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/status_macros.h"
#include "libs/privacy/crypto.h"

namespace shoal::privacy::secagg {
namespace {

// Draws uniform integers from the ChaCha20 keystream of a key derived from the public seed.
class SeededDraws {
 public:
  static absl::StatusOr<SeededDraws> Create(absl::string_view seed) {
    SHOAL_ASSIGN_OR_RETURN(std::string key,
                           HkdfSha256(seed, "", "shoal.secagg.v1 graph order", kChaCha20KeySize));
    SHOAL_ASSIGN_OR_RETURN(ChaCha20Stream stream,
                           ChaCha20Stream::Create(key, std::string(kChaCha20NonceSize, '\0')));
    return SeededDraws(std::move(stream));
  }

  // Uniform in [0, bound), bound >= 1: rejection sampling, so no value is favoured.
  absl::StatusOr<uint32_t> Below(uint32_t bound) {
    const uint64_t range = uint64_t{1} << 32;
    const uint64_t limit = range - range % bound;
    while (true) {
      uint8_t b[4];
      SHOAL_RETURN_IF_ERROR(stream_.Next(absl::MakeSpan(b, 4)));
      const uint64_t r = static_cast<uint64_t>(b[0]) | static_cast<uint64_t>(b[1]) << 8 |
                         static_cast<uint64_t>(b[2]) << 16 | static_cast<uint64_t>(b[3]) << 24;
      if (r < limit) return static_cast<uint32_t>(r % bound);
    }
  }

 private:
  explicit SeededDraws(ChaCha20Stream stream) : stream_(std::move(stream)) {}
  ChaCha20Stream stream_;
};

}  // namespace

absl::StatusOr<NeighbourhoodGraph> NeighbourhoodGraph::Create(std::vector<std::string> participants,
                                                              int degree, absl::string_view seed) {
  std::sort(participants.begin(), participants.end());
  const size_t n = participants.size();
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("neighbourhood graph: ", n, " participants, at least 2 are needed"));
  }
  if (std::adjacent_find(participants.begin(), participants.end()) != participants.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "neighbourhood graph: participant \"",
        *std::adjacent_find(participants.begin(), participants.end()), "\" is listed twice"));
  }
  if (degree < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("neighbourhood graph: degree must be at least 1, got ", degree));
  }
  std::vector<std::set<size_t>> adjacent(n);  // by position in `order`
  std::vector<size_t> order(n);               // order[i]: index into `participants`
  for (size_t i = 0; i < n; ++i) order[i] = i;
  if (static_cast<size_t>(degree) >= n - 1) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        if (i != j) adjacent[i].insert(j);
      }
    }
  } else {
    if (seed.size() != kSharedSeedSize) {
      return absl::InvalidArgumentError(absl::StrCat("neighbourhood graph: the seed must be ",
                                                     kSharedSeedSize, " bytes, got ", seed.size()));
    }
    SHOAL_ASSIGN_OR_RETURN(SeededDraws draws, SeededDraws::Create(seed));
    for (size_t i = n - 1; i > 0; --i) {  // Fisher-Yates
      SHOAL_ASSIGN_OR_RETURN(uint32_t j, draws.Below(static_cast<uint32_t>(i + 1)));
      std::swap(order[i], order[j]);
    }
    auto join = [&](size_t a, size_t b) {
      adjacent[a].insert(b);
      adjacent[b].insert(a);
    };
    for (size_t i = 0; i < n; ++i) {
      for (size_t d = 1; d <= static_cast<size_t>(degree) / 2; ++d) join(i, (i + d) % n);
      if (degree % 2 == 1) join(i, (i + n / 2) % n);
    }
  }
  NeighbourhoodGraph graph;
  graph.min_degree_ = static_cast<int>(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<std::string> names;
    for (size_t j : adjacent[i]) names.push_back(participants[order[j]]);
    std::sort(names.begin(), names.end());
    graph.min_degree_ = std::min(graph.min_degree_, static_cast<int>(names.size()));
    graph.max_degree_ = std::max(graph.max_degree_, static_cast<int>(names.size()));
    graph.neighbours_[participants[order[i]]] = std::move(names);
  }
  graph.participants_ = std::move(participants);
  return graph;
}

const std::vector<std::string>& NeighbourhoodGraph::Neighbours(absl::string_view id) const {
  static const std::vector<std::string>* const kNone = new std::vector<std::string>();
  auto it = neighbours_.find(id);
  return it == neighbours_.end() ? *kNone : it->second;
}

bool NeighbourhoodGraph::AreNeighbours(absl::string_view a, absl::string_view b) const {
  const std::vector<std::string>& of_a = Neighbours(a);
  return std::binary_search(of_a.begin(), of_a.end(), b);
}

}  // namespace shoal::privacy::secagg
