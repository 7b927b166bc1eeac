// DownloadDeltas: one XOR_ZLIB encoding per task, made once and kept for the round's other
// peers, replaced by the next version's, for a bounded number of tasks.
#include <cmath>
#include <memory>

#include "gtest/gtest.h"
#include "services/aggregator/download_deltas.h"

namespace shoal::aggregator {
namespace {

ModelSnapshot Version(uint64_t version) {
  auto m = std::make_shared<tensor::FlatModel>();
  m->layout = *tensor::ModelLayout::Create({{"w", {4096}}});
  m->values.resize(4096);
  for (size_t i = 0; i < m->values.size(); ++i) {
    m->values[i] = std::sin(0.01f * i) + 1e-4f * version * std::cos(0.1f * i);
  }
  return ModelSnapshot{version, std::move(m)};
}

TEST(DownloadDeltasTest, OneEncodingPerTaskIsKeptUntilTheNextVersion) {
  DownloadDeltas deltas(/*max_tasks=*/2);
  const ModelSnapshot v0 = Version(0), v1 = Version(1), v2 = Version(2);
  auto first = deltas.Get("t", v1, v0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->encodings[0].encoding, common::v1::ENCODING_XOR_ZLIB);
  EXPECT_LT((*first)->payload_bytes(), v1.model->layout.total_bytes());
  EXPECT_EQ(*deltas.Get("t", v1, v0), *first) << "the second peer gets the same encoding";
  auto next = deltas.Get("t", v2, v1);
  ASSERT_TRUE(next.ok());
  EXPECT_NE(*next, *first);
  EXPECT_EQ(*deltas.Get("t", v2, v1), *next);

  // A third task pushes out the one asked for least recently ("u"), not "t".
  auto u = deltas.Get("u", v1, v0);
  ASSERT_TRUE(u.ok());
  ASSERT_TRUE(deltas.Get("t", v2, v1).ok());
  ASSERT_TRUE(deltas.Get("w", v1, v0).ok());
  EXPECT_EQ(*deltas.Get("t", v2, v1), *next);
  EXPECT_NE(*deltas.Get("u", v1, v0), *u) << "made again";

  ModelSnapshot other{3, std::make_shared<tensor::FlatModel>()};
  EXPECT_EQ(deltas.Get("t", other, v2).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shoal::aggregator
