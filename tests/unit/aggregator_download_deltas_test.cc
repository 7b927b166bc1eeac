// DownloadDeltas: one XOR_SPARSE_ZLIB encoding per task, started when a version is published (or by
// the first download against a held version), made on the encoder and waited for only by the peers
// whose links make that pay (the others go raw until it is ready), replaced by the next
// version's, for a bounded number of tasks; no more encodings once every peer's link is too
// fast for one to pay.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/aggregator/download_deltas.h"
#include "tests/fakes/manual_executor.h"

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

// What a download was sent.
struct Sent {
  std::shared_ptr<const tensor::EncodedModel> payload;
  common::v1::ModelMeta meta;
};

bool Raw(const Sent& d) {
  return !d.meta.has_xor_base_version() &&
         d.payload->encodings[0].encoding != common::v1::ENCODING_XOR_SPARSE_ZLIB;
}

bool Against(const Sent& d, uint64_t base_version) {
  return d.meta.has_xor_base_version() && d.meta.xor_base_version() == base_version &&
         d.payload->encodings[0].encoding == common::v1::ENCODING_XOR_SPARSE_ZLIB;
}

class DownloadDeltasTest : public ::testing::Test {
 protected:
  fakes::ManualExecutor encoder_;
  int encodings_ = 0;  // made, as the metrics see them
  DownloadDeltas deltas_{encoder_, /*max_tasks=*/2, [this](double) { ++encodings_; }};
  const ModelSnapshot v0_ = Version(0), v1_ = Version(1), v2_ = Version(2);

  // A download by `peer`: what it was sent lands in the vector, at once or later.
  std::shared_ptr<std::vector<Sent>> Ask(DownloadDeltas& deltas, const std::string& task,
                                         const ModelSnapshot& model,
                                         const absl::StatusOr<ModelSnapshot>& base,
                                         const std::string& peer = "p1") {
    auto sent = std::make_shared<std::vector<Sent>>();
    deltas.Serve(task, peer, model, base,
                 [sent](std::shared_ptr<const tensor::EncodedModel> payload,
                        const common::v1::ModelMeta& meta) {
                   sent->push_back({payload, meta});
                 });
    return sent;
  }
  // A download answered at once.
  Sent Serve(const std::string& task, const ModelSnapshot& model,
             const absl::StatusOr<ModelSnapshot>& base, DownloadDeltas* deltas = nullptr) {
    std::shared_ptr<std::vector<Sent>> sent = Ask(deltas ? *deltas : deltas_, task, model, base);
    EXPECT_EQ(sent->size(), 1u) << "answered at once";
    return sent->empty() ? Sent{} : sent->front();
  }
};

TEST_F(DownloadDeltasTest, ADownloadGoesRawWhileItsEncodingIsMadeThenEncoded) {
  // The first download against a held version starts the encoding and does not wait for it.
  const Sent first = Serve("t", v1_, v0_);
  EXPECT_TRUE(Raw(first));
  EXPECT_EQ(first.meta.version(), 1u);
  EXPECT_EQ(first.payload->payload_bytes(), v1_.model->layout.total_bytes());
  EXPECT_TRUE(Raw(Serve("t", v1_, v0_))) << "still being made";
  EXPECT_EQ(encoder_.pending(), 1u) << "one encoding, however many peers ask";

  EXPECT_EQ(encoder_.RunAll(), 1);
  EXPECT_EQ(encodings_, 1);
  const Sent ready = Serve("t", v1_, v0_);
  ASSERT_TRUE(Against(ready, 0));
  EXPECT_EQ(ready.meta.version(), 1u);
  EXPECT_LT(ready.payload->payload_bytes(), v1_.model->layout.total_bytes());
  EXPECT_EQ(Serve("t", v1_, v0_).payload, ready.payload) << "the next peer's, the same";
  EXPECT_EQ(encoder_.pending(), 0u);
  EXPECT_EQ(encodings_, 1);
}

TEST_F(DownloadDeltasTest, APublishedVersionIsEncodedBeforeItsFirstDownload) {
  // A task no peer downloads against a held version costs nothing at publish.
  deltas_.Prepare("t", v1_, v0_);
  EXPECT_EQ(encoder_.pending(), 0u);

  EXPECT_TRUE(Raw(Serve("t", v1_, v0_)));
  encoder_.RunAll();
  deltas_.Prepare("t", v2_, v1_);  // the next round's version: encoded at once
  EXPECT_EQ(encoder_.pending(), 1u);
  deltas_.Prepare("t", v2_, v1_);  // published twice (a repeated PutModel): one encoding
  EXPECT_EQ(encoder_.RunAll(), 1);
  EXPECT_TRUE(Against(Serve("t", v2_, v1_), 1)) << "the round's first download";
  EXPECT_EQ(encodings_, 2);
}

TEST_F(DownloadDeltasTest, ASupersededEncodingIsAbandonedAndLetsGoOfItsModels) {
  EXPECT_TRUE(Raw(Serve("t", v1_, v0_)));  // version 1's encoding queued, not run
  EXPECT_EQ(v0_.model.use_count(), 2) << "the queued encoding holds its base";
  deltas_.Prepare("t", v2_, v1_);  // version 2 is published before it ran
  EXPECT_EQ(encoder_.RunAll(), 2);
  EXPECT_EQ(encodings_, 1) << "only version 2's was made";
  EXPECT_EQ(v0_.model.use_count(), 1) << "the abandoned encoding let go of version 0";

  // A late peer asking for version 1 gets it raw and does not displace version 2's encoding.
  EXPECT_TRUE(Raw(Serve("t", v1_, v0_)));
  EXPECT_EQ(encoder_.pending(), 0u);
  EXPECT_TRUE(Against(Serve("t", v2_, v1_), 1));
  deltas_.Prepare("t", v1_, v0_);  // an older version's publish starts nothing either
  EXPECT_EQ(encoder_.pending(), 0u);
}

TEST_F(DownloadDeltasTest, StoppedOrReleasedEncodingsAreNeverMadeNorServed) {
  EXPECT_TRUE(Raw(Serve("t", v1_, v0_)));
  deltas_.Release("t");  // the task is done here
  deltas_.Prepare("t", v2_, v1_);
  EXPECT_EQ(encoder_.RunAll(), 1);
  EXPECT_EQ(encodings_, 0);

  {
    fakes::ManualExecutor encoder;
    int made = 0;
    {
      DownloadDeltas deltas(encoder, 2, [&made](double) { ++made; });
      EXPECT_TRUE(Raw(Serve("t", v1_, v0_, &deltas)));
      deltas.Stop();
      EXPECT_TRUE(Raw(Serve("u", v1_, v0_, &deltas)));  // after Stop, nothing is started
    }
    // Destroyed before its encoder ran the work it queued: the work touches only what it holds.
    EXPECT_EQ(encoder.RunAll(), 1);
    EXPECT_EQ(made, 0);
  }
  EXPECT_EQ(v0_.model.use_count(), 1);
}

TEST_F(DownloadDeltasTest, OneEncodingPerTaskForAtMostTwoTasks) {
  const auto ready = [this](const std::string& task, const ModelSnapshot& model,
                            const ModelSnapshot& base) {
    Serve(task, model, base);
    encoder_.RunAll();
    return Serve(task, model, base);
  };
  const Sent t = ready("t", v2_, v1_);
  const Sent u = ready("u", v1_, v0_);
  ASSERT_TRUE(Against(t, 1));
  ASSERT_TRUE(Against(u, 0));
  ASSERT_TRUE(Against(Serve("t", v2_, v1_), 1));  // "u" is now the least recently used
  ASSERT_TRUE(Against(ready("w", v1_, v0_), 0));  // and goes for "w"
  EXPECT_EQ(Serve("t", v2_, v1_).payload, t.payload) << "kept";
  EXPECT_TRUE(Raw(Serve("u", v1_, v0_))) << "pushed out: made again";
  encoder_.RunAll();
  EXPECT_TRUE(Against(Serve("u", v1_, v0_), 0));
  EXPECT_NE(Serve("u", v1_, v0_).payload, u.payload);
}

TEST_F(DownloadDeltasTest, RawWhenThereIsNothingToEncodeAgainst) {
  EXPECT_TRUE(Raw(Serve("t", v1_, absl::NotFoundError("no base")))) << "no base";
  EXPECT_TRUE(Raw(Serve("t", v1_, v1_))) << "the peer holds this version";
  EXPECT_EQ(encoder_.pending(), 0u);
  const ModelSnapshot other{0, std::make_shared<tensor::FlatModel>()};
  EXPECT_TRUE(Raw(Serve("t", v1_, other)));
  encoder_.RunAll();
  EXPECT_TRUE(Raw(Serve("t", v1_, other))) << "layouts differ: never encoded";
  EXPECT_EQ(encodings_, 0);
}

// An encoder that refuses everything (full).
class FullExecutor final : public Executor {
 public:
  bool TrySubmit(std::function<void()>) override { return false; }
};

TEST_F(DownloadDeltasTest, AFullEncoderLeavesTheVersionRaw) {
  FullExecutor encoder;
  DownloadDeltas deltas(encoder);
  deltas.Downloaded("t", "p1", 1, absl::Seconds(100));  // a peer that would wait
  EXPECT_TRUE(Raw(Serve("t", v1_, v0_, &deltas)));
  EXPECT_TRUE(Raw(Serve("t", v1_, v0_, &deltas)));
}

TEST_F(DownloadDeltasTest, ASlowPeerWaitsForTheEncodingWhereThatPaysAFastOneDoesNot) {
  // The peers' last downloads: 16 KiB in 10 s (the encoding, 16 KiB at 20 MB/s before one is
  // timed, saves a quarter of 10 s), and in 10 us (it saves 2.5 us: not worth waiting for).
  const uint64_t bytes = v1_.model->layout.total_bytes();
  deltas_.Downloaded("t", "slow", bytes, absl::Seconds(10));
  deltas_.Downloaded("t", "fast", bytes, absl::Microseconds(10));
  auto slow = Ask(deltas_, "t", v1_, v0_, "slow");
  auto fast = Ask(deltas_, "t", v1_, v0_, "fast");
  auto unknown = Ask(deltas_, "t", v1_, v0_, "new");
  EXPECT_TRUE(slow->empty()) << "waits";
  ASSERT_EQ(fast->size(), 1u);
  EXPECT_TRUE(Raw(fast->front()));
  ASSERT_EQ(unknown->size(), 1u) << "a peer not measured yet does not wait";
  EXPECT_TRUE(Raw(unknown->front()));
  EXPECT_EQ(encoder_.RunAll(), 1);
  ASSERT_EQ(slow->size(), 1u) << "answered by the encoder once the encoding was made";
  EXPECT_TRUE(Against(slow->front(), 0));

  // Waiting for an encoding that is abandoned: raw, once the encoder has stopped it.
  deltas_.Prepare("t", v2_, v1_);
  deltas_.Downloaded("t", "slow", bytes, absl::Seconds(10));
  const ModelSnapshot v3 = Version(3);
  auto abandoned = Ask(deltas_, "t", v2_, v1_, "slow");
  EXPECT_TRUE(abandoned->empty()) << "waits";
  deltas_.Prepare("t", v3, v2_);  // version 3 is published before version 2's encoding ran
  EXPECT_EQ(encoder_.RunAll(), 2);
  ASSERT_EQ(abandoned->size(), 1u);
  EXPECT_TRUE(Raw(abandoned->front()));
  EXPECT_EQ(abandoned->front().meta.version(), 2u);
  EXPECT_TRUE(Against(Serve("t", v3, v2_), 2));
}

TEST_F(DownloadDeltasTest, APeersOwnMeasureReplacesTheSendersAndNonsenseIsIgnored) {
  // Measured fast here (socket buffers took it at once), but the peer got it in 10 s: it waits.
  const uint64_t bytes = v1_.model->layout.total_bytes();
  deltas_.Downloaded("t", "p", bytes, absl::Microseconds(10));
  deltas_.Reported("t", "p", static_cast<double>(bytes) / 10);
  auto waited = Ask(deltas_, "t", v1_, v0_, "p");
  EXPECT_TRUE(waited->empty()) << "waits";
  EXPECT_EQ(encoder_.RunAll(), 1);
  ASSERT_EQ(waited->size(), 1u);
  EXPECT_TRUE(Against(waited->front(), 0));

  // A report of 0 (none yet), negative, infinite or not a number changes nothing: "fast" stays
  // fast and "new" unmeasured, and both get version 2 raw at once.
  deltas_.Prepare("t", v2_, v1_);
  deltas_.Downloaded("t", "fast", bytes, absl::Microseconds(10));
  for (double nonsense : {0.0, -1.0, std::numeric_limits<double>::infinity(),
                          std::numeric_limits<double>::quiet_NaN()}) {
    deltas_.Reported("t", "fast", nonsense);
    deltas_.Reported("t", "new", nonsense);
  }
  for (const char* peer : {"fast", "new"}) {
    auto answered = Ask(deltas_, "t", v2_, v1_, peer);
    ASSERT_EQ(answered->size(), 1u) << peer;
    EXPECT_TRUE(Raw(answered->front())) << peer;
  }
}

TEST_F(DownloadDeltasTest, OverFastLinksOnlyATasksFirstEncodingIsMade) {
  // Both peers of the task measured at 1 TB/s: its first encoding is made and timed (what an
  // encoding costs and saves), and then no peer would wait for one: the next versions go raw
  // and the encoder does nothing, at publish or on a download.
  constexpr uint64_t kTerabyte = 1'000'000'000'000;
  deltas_.Downloaded("t", "p1", kTerabyte, absl::Seconds(1));
  deltas_.Downloaded("t", "p2", kTerabyte, absl::Seconds(1));
  EXPECT_TRUE(Raw(Serve("t", v1_, v0_)));
  EXPECT_EQ(encoder_.RunAll(), 1) << "the task's first encoding";
  deltas_.Prepare("t", v2_, v1_);
  EXPECT_EQ(encoder_.pending(), 0u) << "no peer would wait for it";
  EXPECT_TRUE(Raw(Serve("t", v2_, v1_)));
  EXPECT_EQ(encoder_.pending(), 0u) << "nor does a download start it";

  // A peer on a 1 kB/s link joins the task: the next version is encoded again.
  deltas_.Reported("t", "p3", 1000);
  const ModelSnapshot v3 = Version(3);
  deltas_.Prepare("t", v3, v2_);
  EXPECT_EQ(encoder_.RunAll(), 1);
  EXPECT_TRUE(Against(Serve("t", v3, v2_), 2));
  EXPECT_EQ(encodings_, 2);
}

TEST_F(DownloadDeltasTest, ASlowPeerThatLeftNoLongerKeepsVersionsEncoded) {
  constexpr uint64_t kTerabyte = 1'000'000'000'000;
  deltas_.Downloaded("t", "fast", kTerabyte, absl::Seconds(1));
  deltas_.Reported("t", "slow", 1000);
  EXPECT_TRUE(Raw(Serve("t", v1_, v0_)));
  EXPECT_EQ(encoder_.RunAll(), 1);
  deltas_.Prepare("t", v2_, v1_);
  EXPECT_EQ(encoder_.RunAll(), 1) << "the slow peer would wait for it";

  deltas_.KeepPeers("t", {"fast"});  // the slow one left the task
  const ModelSnapshot v3 = Version(3);
  deltas_.Prepare("t", v3, v2_);
  EXPECT_EQ(encoder_.pending(), 0u) << "only a fast peer is left";
  deltas_.KeepPeers("other", {});  // a task without rates: nothing to forget
}

}  // namespace
}  // namespace shoal::aggregator
