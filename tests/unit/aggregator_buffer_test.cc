// AggregatorCore's federated-async buffer (OpenBuffer, round-0 pushes): staleness, replacement,
// aggregation at K with staleness weights, last_version, restores and the WatchTask events.

#include <atomic>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/aggregator/aggregator_core.h"
#include "tests/testing/joining_thread.h"
#include "tests/unit/aggregator_core_fixture.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class AggregatorBufferTest : public AggregatorCoreFixture {
 protected:
  OpenBufferParams Params(uint32_t buffer_size, uint64_t base = 0) {
    OpenBufferParams p;
    p.task = "t";
    p.base_version = base;
    p.async.set_buffer_size(buffer_size);
    return p;
  }

  void OpenBuffer(const OpenBufferParams& p) {
    absl::Status s = core_->OpenBuffer(p);
    ASSERT_TRUE(s.ok()) << s;
  }

  // A buffer push: round 0.
  PushMeta Async(const std::string& peer, uint64_t samples, uint64_t base, double loss = 0.5) {
    return PushMeta{"t", 0, peer, base, samples, loss};
  }

  uint64_t Latest() { return core_->GetModel("t", std::nullopt)->version; }
  std::vector<float> Values(uint64_t version) {
    return core_->GetModel("t", version)->model->values;
  }
  double Buffered() { return metrics_->buffered_updates.Value(); }
};

TEST_F(AggregatorBufferTest, FullBufferBecomesTheNextVersionWithStaleDeltasScaledDown) {
  PutBase();  // base[i] = i
  EventLog log;
  core_->Watch("t", log.Recorder());
  OpenBuffer(Params(2));  // mean, max_staleness 4, polynomial a = 1
  clock_.Advance(absl::Seconds(3));

  // Version 1: two fresh updates, plain sample-weighted mean.
  tensor::FlatModel da = Filled([](size_t i) { return 1.0f + i; });
  tensor::FlatModel db = Filled([](size_t) { return -2.0f; });
  ASSERT_TRUE(PushModel(Async("a", 1, 0, 1.0), da).ok());
  EXPECT_EQ(Latest(), 0u);  // one of two
  EXPECT_EQ(Buffered(), 1);
  ASSERT_TRUE(PushModel(Async("b", 3, 0, 2.0), db).ok());
  ASSERT_EQ(Latest(), 1u);
  EXPECT_EQ(Buffered(), 0);
  std::vector<float> v1 = Values(1);
  for (size_t i = 0; i < v1.size(); ++i) {
    EXPECT_FLOAT_EQ(v1[i], i + (1 * da.values[i] + 3 * db.values[i]) / 4) << i;
  }

  // Version 2: c trained from version 0 (staleness 1: its delta scaled by 2^-1), d from
  // version 1 (staleness 0, as pushed); their sample-weighted mean (2 and 1) applied to version 1.
  // A weight that only shared out the mean would not slow a version of stale updates down.
  tensor::FlatModel dc = Filled([](size_t i) { return 0.5f * i; });
  tensor::FlatModel dd = Filled([](size_t) { return 4.0f; });
  ASSERT_TRUE(PushModel(Async("c", 2, 0, 1.0), dc).ok());
  ASSERT_TRUE(PushModel(Async("d", 1, 1, 4.0), dd).ok());
  ASSERT_EQ(Latest(), 2u);
  const double fc = 0.5;
  std::vector<float> v2 = Values(2);
  for (size_t i = 0; i < v2.size(); ++i) {
    const double want = v1[i] + (2 * fc * dc.values[i] + 1 * dd.values[i]) / 3;
    EXPECT_NEAR(v2[i], want, 1e-4) << i;
  }

  std::vector<v1::VersionPublished> published = log.Published();
  ASSERT_EQ(published.size(), 2u);
  EXPECT_EQ(published[0].version(), 1u);
  EXPECT_THAT(published[0].contributors(), ElementsAre("a", "b"));
  EXPECT_EQ(published[0].num_samples(), 4u);
  EXPECT_DOUBLE_EQ(published[0].mean_train_loss(), (1 * 1.0 + 3 * 2.0) / 4);
  EXPECT_EQ(published[0].mean_staleness(), 0);
  EXPECT_EQ(published[0].published_unix_ms(), absl::ToUnixMillis(clock_.Now()));
  EXPECT_EQ(published[1].version(), 2u);
  EXPECT_THAT(published[1].contributors(), ElementsAre("c", "d"));
  EXPECT_EQ(published[1].num_samples(), 3u);
  EXPECT_DOUBLE_EQ(published[1].mean_train_loss(), (2 * 1.0 + 1 * 4.0) / 3);  // by samples
  EXPECT_DOUBLE_EQ(published[1].mean_staleness(), 0.5);
  EXPECT_EQ(published[1].digest_xxh3(), core_->GetModel("t", 2)->model->Digest());
  EXPECT_EQ(published[1].note(), "");

  EXPECT_EQ(metrics_->versions_published.Value(), 2);
  EXPECT_EQ(metrics_->updates_accepted.Value(), 4);
  EXPECT_EQ(metrics_->model_version.Value(), 2);
  auto staleness = metrics_->update_staleness.Collect().histogram;
  EXPECT_EQ(staleness.sample_count, 4u);
  EXPECT_EQ(staleness.sample_sum, 1.0);
}

TEST_F(AggregatorBufferTest, EveryAcceptedUpdateAndVersionIsAnnouncedOnWatch) {
  PutBase();
  OpenBuffer(Params(2));
  EventLog first;
  core_->Watch("t", first.Recorder());
  ASSERT_TRUE(PushModel(Async("b", 2, 0), Filled([](size_t) { return 1.0f; })).ok());
  // A watch that starts now sees b waiting in the buffer.
  EventLog second;
  core_->Watch("t", second.Recorder());
  ASSERT_TRUE(PushModel(Async("a", 2, 0), Filled([](size_t) { return 3.0f; })).ok());

  std::vector<v1::TaskEvent> events = first.events();
  ASSERT_EQ(events.size(), 4u);
  ASSERT_TRUE(events[0].has_started());
  EXPECT_TRUE(events[0].started().has_model());
  EXPECT_EQ(events[0].started().latest_version(), 0u);
  EXPECT_EQ(events[0].started().open_round(), 0u);
  EXPECT_THAT(events[0].started().accepted(), IsEmpty());
  ASSERT_TRUE(events[1].has_push_accepted());
  EXPECT_EQ(events[1].push_accepted().round(), 0u);
  EXPECT_EQ(events[1].push_accepted().peer_id(), "b");
  EXPECT_EQ(events[1].push_accepted().base_version(), 0u);
  EXPECT_EQ(events[1].push_accepted().num_samples(), 2u);
  EXPECT_EQ(events[2].push_accepted().peer_id(), "a");
  ASSERT_TRUE(events[3].has_version_published());
  EXPECT_EQ(events[3].version_published().version(), 1u);
  EXPECT_THAT(events[3].version_published().contributors(), ElementsAre("a", "b"));

  std::vector<v1::TaskEvent> later = second.events();
  ASSERT_EQ(later.size(), 3u);
  EXPECT_THAT(later[0].started().accepted(), ElementsAre("b"));
  EXPECT_EQ(later[2].version_published().version(), 1u);
}

TEST_F(AggregatorBufferTest, StaleUpdatesAreRefusedNamingTheStalenessAndTheBound) {
  PutBase();
  OpenBufferParams p = Params(1);
  p.async.set_max_staleness(1);
  OpenBuffer(p);
  tensor::FlatModel d = Filled([](size_t) { return 1.0f; });
  ASSERT_TRUE(PushModel(Async("a", 1, 0), d).ok());  // -> version 1
  ASSERT_TRUE(PushModel(Async("a", 1, 0), Filled([](size_t) { return 2.0f; })).ok());  // s = 1
  ASSERT_EQ(Latest(), 2u);
  absl::Status s = PushModel(Async("b", 1, 0), d);  // s = 2
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "update was trained from version 0, 2 versions behind version 2 of task 't', over "
            "its async.max_staleness 1: fetch the latest model");
  EXPECT_EQ(Rejected(RejectReason::kStale), 1);
  // From the future.
  s = PushModel(Async("b", 1, 3), d);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("trained from version 3, but task 't' is at version 2"));
  EXPECT_EQ(Rejected(RejectReason::kStaleBase), 1);
  EXPECT_EQ(Latest(), 2u);
}

TEST_F(AggregatorBufferTest, NewerPushOfAPeerReplacesItsOlderOneAndRetriesAreDuplicates) {
  PutBase();
  OpenBuffer(Params(2));
  tensor::FlatModel old_a = Filled([](size_t) { return 100.0f; });
  tensor::FlatModel new_a = Filled([](size_t i) { return 0.5f * i; });
  tensor::FlatModel b = Filled([](size_t) { return -1.0f; });
  bool duplicate = true;
  ASSERT_TRUE(PushModel(Async("a", 1, 0), old_a, &duplicate).ok());
  EXPECT_FALSE(duplicate);
  ASSERT_TRUE(PushModel(Async("a", 1, 0), old_a, &duplicate).ok());  // a retry
  EXPECT_TRUE(duplicate);
  ASSERT_TRUE(PushModel(Async("a", 1, 0), new_a, &duplicate).ok());  // trained again
  EXPECT_FALSE(duplicate);
  EXPECT_EQ(Buffered(), 1);
  EXPECT_EQ(Latest(), 0u);
  ASSERT_TRUE(PushModel(Async("b", 1, 0), b).ok());
  ASSERT_EQ(Latest(), 1u);
  std::vector<float> v1 = Values(1);
  for (size_t i = 0; i < v1.size(); ++i) {
    EXPECT_FLOAT_EQ(v1[i], i + (new_a.values[i] + b.values[i]) / 2) << i;  // no 100s
  }
  // b's push, retried after its answer was lost, is not aggregated again.
  ASSERT_TRUE(PushModel(Async("b", 1, 0), b, &duplicate).ok());
  EXPECT_TRUE(duplicate);
  EXPECT_EQ(Buffered(), 0);
  EXPECT_EQ(metrics_->updates_accepted.Value(), 3);
}

TEST_F(AggregatorBufferTest, AggregationRunsInFoldAndNewPeersWaitForRoom) {
  PutBase();
  OpenBuffer(Params(2));
  tensor::FlatModel d = Filled([](size_t) { return 1.0f; });
  ASSERT_TRUE(PushModel(Async("a", 1, 0), d).ok());
  auto filling = Streamed(Async("b", 1, 0), d);
  ASSERT_TRUE(filling.ok()) << filling.status();
  ASSERT_TRUE((*filling)->Accept().ok());  // acknowledged: the buffer is full
  EXPECT_EQ(Latest(), 0u);                 // but not aggregated by Accept
  // A new peer finds no room until the version is out; a peer in the buffer may still replace.
  absl::Status s = PushModel(Async("c", 1, 0), d);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "the buffer of task 't' is full (2 updates) until version 1 is "
            "aggregated; retry");
  EXPECT_EQ(Rejected(RejectReason::kBusy), 1);
  ASSERT_TRUE(PushModel(Async("a", 1, 0), Filled([](size_t) { return 3.0f; })).ok());
  (*filling)->Fold();
  ASSERT_EQ(Latest(), 1u);
  for (size_t i = 0; i < Values(1).size(); ++i) EXPECT_FLOAT_EQ(Values(1)[i], i + 2.0f) << i;
  filling->reset();
  EXPECT_TRUE(PushModel(Async("c", 1, 0), d).ok());
  EXPECT_EQ(metrics_->pushes_in_flight.Value(), 0);
}

TEST_F(AggregatorBufferTest, AcceptedUpdateThatFillsTheBufferIsAggregatedEvenWithoutFold) {
  PutBase();
  OpenBuffer(Params(1));
  auto push = Streamed(Async("a", 1, 0), Filled([](size_t) { return 1.0f; }));
  ASSERT_TRUE(push.ok());
  ASSERT_TRUE((*push)->Accept().ok());
  push->reset();  // e.g. the executor task ended early: the destructor aggregates
  EXPECT_EQ(Latest(), 1u);
}

TEST_F(AggregatorBufferTest, RobustStrategyInABufferIgnoresSamplesButScalesStaleDeltas) {
  PutBase();
  OpenBufferParams p = Params(3);
  p.aggregation = StrategySettings(common::v1::AGGREGATION_MEDIAN);
  OpenBuffer(p);
  ASSERT_TRUE(PushModel(Async("a", 1, 0), Filled([](size_t) { return 1.0f; })).ok());
  ASSERT_TRUE(PushModel(Async("b", 1000, 0), Filled([](size_t) { return -500.0f; })).ok());
  ASSERT_TRUE(PushModel(Async("c", 1, 0), Filled([](size_t) { return 2.0f; })).ok());
  ASSERT_EQ(Latest(), 1u);
  for (size_t i = 0; i < Values(1).size(); ++i) EXPECT_FLOAT_EQ(Values(1)[i], i + 1.0f) << i;

  // Version 2: d trained from version 0 (staleness 1): its 8 counts as 8 x 2^-1 = 4, the median
  // of 3, 4 and 7.
  ASSERT_TRUE(PushModel(Async("d", 1, 0), Filled([](size_t) { return 8.0f; })).ok());
  ASSERT_TRUE(PushModel(Async("e", 1, 1), Filled([](size_t) { return 3.0f; })).ok());
  ASSERT_TRUE(PushModel(Async("f", 1, 1), Filled([](size_t) { return 7.0f; })).ok());
  ASSERT_EQ(Latest(), 2u);
  for (size_t i = 0; i < Values(2).size(); ++i) {
    EXPECT_FLOAT_EQ(Values(2)[i], i + 1.0f + 4.0f) << i;
  }
}

TEST_F(AggregatorBufferTest, LastVersionClosesTheBuffer) {
  PutBase();
  OpenBufferParams p = Params(1);
  p.last_version = 2;
  OpenBuffer(p);
  tensor::FlatModel d = Filled([](size_t) { return 1.0f; });
  ASSERT_TRUE(PushModel(Async("a", 1, 0), d).ok());
  ASSERT_TRUE(PushModel(Async("a", 1, 1), d).ok());
  ASSERT_EQ(Latest(), 2u);
  absl::Status s = PushModel(Async("a", 1, 2), d);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "task 't' published its last version 2; its buffer is closed");
  EXPECT_EQ(Rejected(RejectReason::kRoundNotOpen), 1);
  EXPECT_TRUE(core_->OpenBuffer(p).ok());  // idempotent, still closed
  EXPECT_EQ(PushModel(Async("a", 1, 2), d).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Latest(), 2u);
}

TEST_F(AggregatorBufferTest, RestoreEmptiesTheBuffer) {
  PutBase();
  OpenBuffer(Params(2));
  ASSERT_TRUE(PushModel(Async("a", 1, 0), Filled([](size_t) { return 100.0f; })).ok());
  EXPECT_EQ(Buffered(), 1);
  ASSERT_TRUE(core_->PutModel("t", 5, Filled([](size_t) { return 10.0f; })).ok());
  EXPECT_EQ(Buffered(), 0);
  EventLog log;
  core_->Watch("t", log.Recorder());
  EXPECT_EQ(log.events()[0].started().latest_version(), 5u);
  EXPECT_THAT(log.events()[0].started().accepted(), IsEmpty());
  // The buffer stays open, on the restored version: the coordinator's re-open is a repeat.
  OpenBuffer(Params(2, 5));
  ASSERT_TRUE(PushModel(Async("b", 1, 5), Filled([](size_t) { return 1.0f; })).ok());
  EXPECT_EQ(Latest(), 5u);  // a's update went with the restore
  ASSERT_TRUE(PushModel(Async("a", 1, 5), Filled([](size_t) { return 3.0f; })).ok());
  ASSERT_EQ(Latest(), 6u);
  for (float v : Values(6)) EXPECT_FLOAT_EQ(v, 12.0f);
  EXPECT_THAT(log.Published().at(0).contributors(), ElementsAre("a", "b"));
}

TEST_F(AggregatorBufferTest, OpenBufferRules) {
  EXPECT_EQ(core_->OpenBuffer(Params(2)).code(), absl::StatusCode::kNotFound);
  PutBase();
  OpenBufferParams no_size = Params(2);
  no_size.async.clear_buffer_size();
  absl::Status s = core_->OpenBuffer(no_size);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "async.buffer_size: required (>= 1)");
  OpenBufferParams bad = Params(2);
  bad.aggregation = StrategySettings(common::v1::AGGREGATION_KRUM);
  EXPECT_EQ(core_->OpenBuffer(bad).code(), absl::StatusCode::kInvalidArgument);  // f required
  EXPECT_EQ(core_->OpenBuffer(Params(2, 3)).code(), absl::StatusCode::kFailedPrecondition);

  // Round-0 pushes need a buffer; a buffer task has no rounds.
  s = PushModel(Async("a", 1, 0), Filled([](size_t) { return 1.0f; }));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("has no federated-async buffer open"));
  Open({"a"});
  OpenBuffer(Params(1));  // abandons the round
  EXPECT_EQ(PushModel(Meta("a", 1), Filled([](size_t) { return 1.0f; })).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_->OpenRound({"t", 2, 0, {"a"}, 0}).code(), absl::StatusCode::kFailedPrecondition);

  // Repeats are OK after versions were published; other settings need the latest version.
  ASSERT_TRUE(PushModel(Async("a", 1, 0), Filled([](size_t) { return 1.0f; })).ok());
  ASSERT_EQ(Latest(), 1u);
  EXPECT_TRUE(core_->OpenBuffer(Params(1, 0)).ok());
  // Another buffer_size is a repeat too (a tree's peers changed); other settings are not.
  EXPECT_TRUE(core_->OpenBuffer(Params(2, 0)).ok());
  OpenBufferParams other = Params(2, 0);
  other.async.set_max_staleness(1);
  EXPECT_EQ(core_->OpenBuffer(other).code(), absl::StatusCode::kFailedPrecondition);
  other.base_version = 1;
  OpenBuffer(other);

  // Members' session tokens apply to buffer pushes as to round pushes.
  core_->SetMembers("t", {{"a", "token-a"}});
  EXPECT_EQ(PushModel(Async("a", 1, 1), Filled([](size_t) { return 1.0f; })).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(AggregatorBufferTest, BufferThatWouldHoldTooMuchIsRefusedNamingBothNumbers) {
  Make(4, /*max_buffer_bytes=*/128);
  PutBase();  // 52 B
  absl::Status s = core_->OpenBuffer(Params(3));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "the buffer of task 't' (mean) holds up to 3 updates × 52 B = 156 B, over this "
            "aggregator's --max-buffer-bytes 128 B");
  EXPECT_EQ(metrics_->max_buffer_refusals.Value(), 1);
  OpenBuffer(Params(2));
}

// Peers pushing at once, each as fast as it can: every version is the mean of K all-ones deltas
// (so it adds exactly 1), and every accepted update is either in a published version, replaced,
// or still waiting.
TEST_F(AggregatorBufferTest, ConcurrentPushersLoseNoVersion) {
  Make(/*max_pushes=*/3);
  PutBase();
  OpenBufferParams p = Params(3);
  p.async.set_max_staleness(1000);
  p.async.set_staleness(common::v1::STALENESS_WEIGHTING_CONSTANT);  // stale deltas count fully
  OpenBuffer(p);
  EventLog log;
  core_->Watch("t", log.Recorder());
  const tensor::FlatModel ones = Filled([](size_t) { return 1.0f; });
  constexpr int kPeers = 5, kPushes = 40;
  std::atomic<int> accepted{0};
  {
    std::vector<std::unique_ptr<shoal::testing::JoiningThread>> peers;
    for (int t = 0; t < kPeers; ++t) {
      peers.push_back(std::make_unique<shoal::testing::JoiningThread>([&, t] {
        const std::string peer = absl::StrCat("p", t);
        for (int n = 0; n < kPushes;) {
          // A different loss per push: none is a retry of another.
          absl::Status s = PushModel(Async(peer, 1, Latest(), 1.0 * n), ones);
          if (s.ok()) {
            ++n;
            ++accepted;
          } else {
            ASSERT_TRUE(s.code() == absl::StatusCode::kResourceExhausted ||
                        s.code() == absl::StatusCode::kAborted)
                << s;
          }
        }
      }));
    }
  }
  const uint64_t versions = Latest();
  EXPECT_GT(versions, 0u);
  EXPECT_EQ(metrics_->versions_published.Value(), static_cast<double>(versions));
  for (size_t i = 0; i < Values(versions).size(); ++i) {
    EXPECT_FLOAT_EQ(Values(versions)[i], i + static_cast<float>(versions)) << i;
  }
  std::vector<v1::VersionPublished> published = log.Published();
  ASSERT_EQ(published.size(), versions);
  size_t pushes_accepted = 0;
  for (const v1::TaskEvent& e : log.events()) pushes_accepted += e.has_push_accepted();
  EXPECT_EQ(pushes_accepted, static_cast<size_t>(accepted.load()));
  EXPECT_EQ(metrics_->updates_accepted.Value(), accepted.load());
  for (const v1::VersionPublished& v : published) EXPECT_EQ(v.contributors_size(), 3);
  EXPECT_LE(Buffered(), 2);
  EXPECT_LE(versions * 3 + Buffered(), static_cast<double>(accepted.load()));
  EXPECT_EQ(metrics_->pushes_in_flight.Value(), 0);
}

// Federated-async trees, at the parent: a child's aggregate is one update of its samples that
// fills the buffer as much as the peers' updates it holds; a second one of the same child is
// merged with the first (they hold other peers' updates), and a retried one counts once.
TEST_F(AggregatorBufferTest, ChildAggregatesAreMergedNotReplacedAndRetriesCountOnce) {
  PutBase();  // base[i] = i
  EventLog log;
  core_->Watch("t", log.Recorder());
  OpenBufferParams params = Params(4);
  params.children = {"c1", "c2"};
  OpenBuffer(params);
  const auto aggregate = [](const std::string& child, std::vector<std::string> peers,
                            uint64_t samples, float value) {
    PartialResult r;
    r.meta = PartialMeta{"t", 0, child, 0, std::move(peers), samples, 0.5 * samples};
    r.sum.sum = Filled([value](size_t) { return value; }).values;
    r.sum.count = r.meta.contributors.size();
    r.sum.total_weight = 1;
    return r;
  };
  const PartialResult a = aggregate("c1", {"p1", "p2"}, 4, 1.0f);
  const PartialResult b = aggregate("c1", {"p3"}, 2, 4.0f);
  const PartialResult c = aggregate("c2", {"p4"}, 2, -2.0f);
  ASSERT_EQ(core_->AddPartial(a.meta, a.sum).value_or(true), false);
  ASSERT_EQ(core_->AddPartial(b.meta, b.sum).value_or(true), false);
  EXPECT_EQ(Latest(), 0u) << "merged: three peers' updates of four";
  EXPECT_EQ(core_->AddPartial(a.meta, a.sum).value_or(false), true) << "a retry";
  const PartialResult stranger = aggregate("c9", {"p9"}, 1, 0.0f);
  auto refused = core_->AddPartial(stranger.meta, stranger.sum);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(core_->AddPartial(c.meta, c.sum).ok());
  ASSERT_EQ(Latest(), 1u);
  const std::vector<float> v1 = Values(1);
  for (size_t i = 0; i < v1.size(); ++i) {
    EXPECT_FLOAT_EQ(v1[i], static_cast<float>(i) + (4 * 1.0f + 2 * 4.0f + 2 * -2.0f) / 8) << i;
  }
  EXPECT_THAT(log.Published().at(0).contributors(), ElementsAre("p1", "p2", "p3", "p4"));
  EXPECT_EQ(log.Published().at(0).num_samples(), 8u);
}

// A parent that records what it is sent (on the core's transfer thread).
class RecordingParent final : public ParentLink {
 public:
  absl::Status Send(const v1::ParentRound& parent, const PartialResult& partial,
                    absl::Time) override {
    absl::MutexLock lock(&mu_);
    children_.push_back(parent.child());
    sent_.push_back(partial);
    return absl::OkStatus();
  }
  std::vector<PartialResult> Sent() {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  std::vector<std::string> Children() {
    absl::MutexLock lock(&mu_);
    return children_;
  }

 private:
  absl::Mutex mu_;
  std::vector<PartialResult> sent_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> children_ ABSL_GUARDED_BY(mu_);
};

// At a child: a full buffer is not published but handed to the parent link as the aggregate
// against the child's latest version, and a version fetched from the parent keeps the updates
// waiting in the buffer.
TEST_F(AggregatorBufferTest, AChildForwardsFullBuffersAndKeepsItsUpdatesAcrossPulledVersions) {
  RecordingParent parent;
  core_->SetParentLink(&parent);
  PutBase();
  OpenBufferParams params = Params(2);
  params.parent.set_address("127.0.0.1:1");
  params.parent.set_child("c1");
  OpenBuffer(params);
  ASSERT_TRUE(PushModel(Async("a", 1, 0), Filled([](size_t) { return 2.0f; })).ok());
  ASSERT_TRUE(PushModel(Async("b", 3, 0), Filled([](size_t) { return 6.0f; })).ok());
  core_->AwaitTransfers();
  std::vector<PartialResult> sent = parent.Sent();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(parent.Children().at(0), "c1");
  EXPECT_EQ(Latest(), 0u) << "a child publishes nothing";
  EXPECT_THAT(sent[0].meta.contributors, ElementsAre("a", "b"));
  EXPECT_EQ(sent[0].meta.num_samples, 4u);
  EXPECT_EQ(sent[0].meta.round, 0u);
  for (float v : sent[0].sum.sum) EXPECT_NEAR(v, 5.0f, 1e-4);  // (1 x 2 + 3 x 6) / 4
  EXPECT_EQ(metrics_->partials_forwarded.Value(), 1);

  ASSERT_TRUE(PushModel(Async("a", 1, 0), Filled([](size_t) { return 1.0f; })).ok());
  ASSERT_TRUE(core_->PutModel("t", 1, Filled([](size_t i) { return 2.0f * i; })).ok());
  EXPECT_EQ(Buffered(), 1) << "the pulled version keeps a's update";
  ASSERT_TRUE(PushModel(Async("b", 1, 1), Filled([](size_t) { return 3.0f; })).ok());
  core_->AwaitTransfers();
  sent = parent.Sent();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[1].meta.base_version, 1u);
  // a's update is one version stale now: scaled by 1/2 (polynomial, a = 1) before the mean.
  for (float v : sent[1].sum.sum) EXPECT_NEAR(v, (0.5f * 1.0f + 3.0f) / 2, 1e-4);
}

// A parent that answers only when the test lets it: the pushes that fill the buffer return
// (their folds are done) while the aggregate waits on the transfer thread.
class HeldParent final : public ParentLink {
 public:
  absl::Status Send(const v1::ParentRound&, const PartialResult&, absl::Time) override {
    absl::MutexLock lock(&mu_);
    ++started_;
    // Bounded: a core that sent on the fold thread fails the test below instead of hanging.
    mu_.AwaitWithTimeout(absl::Condition(&released_), absl::Seconds(10));
    ++sent_;
    return absl::OkStatus();
  }
  int Started() {
    absl::MutexLock lock(&mu_);
    return started_;
  }
  int Sent() {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }

 private:
  absl::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  int sent_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(AggregatorBufferTest, ASlowParentHoldsUpNoFold) {
  HeldParent parent;
  core_->SetParentLink(&parent);
  PutBase();
  OpenBufferParams params = Params(1);
  params.parent.set_address("127.0.0.1:1");
  params.parent.set_child("c1");
  OpenBuffer(params);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(PushModel(Async("a", 1, 0), Filled([](size_t) { return 2.0f; })).ok());
  ASSERT_TRUE(PushModel(Async("b", 1, 0), Filled([](size_t) { return 4.0f; })).ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the pushes waited for the parent";
  EXPECT_EQ(parent.Sent(), 0) << "both aggregates still wait for the parent";
  parent.Release();
  core_->AwaitTransfers();
  EXPECT_EQ(parent.Started(), 2);
  EXPECT_EQ(parent.Sent(), 2);
  EXPECT_EQ(metrics_->partials_forwarded.Value(), 2);
}

}  // namespace
}  // namespace shoal::aggregator
