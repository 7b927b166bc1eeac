// DownloadDeltas: one XOR_ZLIB encoding per task, made once and kept for the round's other
// peers, replaced by the next version's, for a bounded number of tasks; what a download sends.
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

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

// Runs what it is given at once, or refuses everything (a full executor).
class InlineExecutor final : public Executor {
 public:
  explicit InlineExecutor(bool accepts) : accepts_(accepts) {}
  bool TrySubmit(std::function<void()> fn) override {
    if (!accepts_) return false;
    fn();
    return true;
  }

 private:
  const bool accepts_;
};

struct Sent {
  std::shared_ptr<const tensor::EncodedModel> payload;
  common::v1::ModelMeta meta;
};

std::vector<Sent> Serve(DownloadDeltas& deltas, const ModelSnapshot& model,
                        const absl::StatusOr<ModelSnapshot>& base, bool executor_accepts) {
  std::vector<Sent> sent;
  InlineExecutor executor(executor_accepts);
  deltas.Serve("t", model, base, executor,
               [&sent](std::shared_ptr<const tensor::EncodedModel> payload,
                       const common::v1::ModelMeta& meta) {
                 sent.push_back({payload, meta});
               });
  return sent;
}

TEST(DownloadDeltasTest, ADownloadIsEncodedAgainstTheHeldVersionOnlyWhenItCanBe) {
  DownloadDeltas deltas;
  const ModelSnapshot v0 = Version(0), v1 = Version(1);

  std::vector<Sent> against = Serve(deltas, v1, v0, /*executor_accepts=*/true);
  ASSERT_EQ(against.size(), 1u);
  EXPECT_EQ(against[0].meta.version(), 1u);
  EXPECT_EQ(against[0].meta.xor_base_version(), 0u);
  EXPECT_EQ(against[0].payload->encodings[0].encoding, common::v1::ENCODING_XOR_ZLIB);

  const auto raw = [](const std::vector<Sent>& s) {
    return s.size() == 1 && !s[0].meta.has_xor_base_version() &&
           s[0].payload->encodings[0].encoding != common::v1::ENCODING_XOR_ZLIB;
  };
  EXPECT_TRUE(raw(Serve(deltas, v1, absl::NotFoundError("no base"), true))) << "no base";
  EXPECT_TRUE(raw(Serve(deltas, v1, v1, true))) << "the peer holds this version";
  EXPECT_TRUE(raw(Serve(deltas, v1, v0, /*executor_accepts=*/false))) << "executor full";
  ModelSnapshot other{7, std::make_shared<tensor::FlatModel>()};
  EXPECT_TRUE(raw(Serve(deltas, v1, other, true))) << "layouts differ";
}

}  // namespace
}  // namespace shoal::aggregator
