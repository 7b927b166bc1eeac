// Tree rounds over real gRPC: three in-process shoal-aggregator servers on 127.0.0.1:0, a root
// and two leaves. Peers push to the leaves; each leaf's CloseRound sends its partial sum to the
// root (PushPartial), and the root publishes the model one flat round over the same updates
// would: bit-identical with exact_sum.

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/rpc/server.h"
#include "libs/tensor/compression.h"
#include "libs/tensor/frame_codec.h"
#include "services/aggregator/grpc_aggregator_client.h"
#include "services/aggregator/partial_wire.h"
#include "services/aggregator/replicas.h"
#include "tests/fakes/peer_side_aggregator.h"
#include "tests/service/aggregator_service_fixture.h"
#include "tests/testing/joining_thread.h"
#include "tests/testing/wait.h"

namespace shoal::aggregator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

tensor::FlatModel Delta(int k) {
  return Filled([k](size_t i) {
    return std::pow(10.0f, static_cast<float>(k % 4) - 2.0f) *
           std::sin(0.001f * static_cast<float>(i) + 1.3f * static_cast<float>(k));
  });
}

class AggregatorTreeServiceTest : public AggregatorServiceFixture {
 protected:
  void SetUp() override {
    AggregatorServiceFixture::SetUp();
    for (auto* leaf : {&leaf_a_, &leaf_b_}) {
      AggregatorOptions options;
      options.tls.insecure = true;
      options.listen = "127.0.0.1:0";
      options.metrics_listen = "127.0.0.1:0";
      options.coordinator = registry_server_->address();
      options.shutdown_grace = absl::Seconds(1);
      auto server = AggregatorServer::Start(options);
      ASSERT_TRUE(server.ok()) << server.status();
      *leaf = *std::move(server);
    }
    root_ = server_->address();
    a_ = leaf_a_->address();
    b_ = leaf_b_->address();
    for (const std::string& at : {root_, a_, b_}) {
      auto put = client_.PutModel(at, tensor::MakeModelMeta("t", 0, *base_),
                                  tensor::EncodeRaw(base_), {}, Deadline());
      ASSERT_TRUE(put.ok()) << put.status();
    }
  }
  void TearDown() override {
    for (auto* leaf : {&leaf_a_, &leaf_b_}) {
      if (*leaf) (*leaf)->Shutdown();
    }
    AggregatorServiceFixture::TearDown();
  }

  static absl::Time Deadline() { return absl::Now() + absl::Seconds(30); }

  static v1::OpenRoundRequest Round(const std::string& task, std::vector<std::string> peers,
                                    bool exact) {
    v1::OpenRoundRequest request;
    request.set_task(task);
    request.set_round(1);
    request.set_base_version(0);
    for (const std::string& p : peers) request.add_expected_peers(p);
    request.mutable_aggregation()->set_strategy(common::v1::AGGREGATION_MEAN);
    if (exact) request.mutable_aggregation()->mutable_options()->set_exact_sum(true);
    return request;
  }

  absl::StatusOr<bool> PushTo(const std::string& at, const std::string& task, int k) {
    auto delta = std::make_shared<const tensor::FlatModel>(Delta(k));
    v1::UpdateMeta meta = Meta(absl::StrCat("p", k), 100 + 37 * k, task);
    return client_.PushUpdate(at, meta, tensor::EncodeRaw(delta), Deadline());
  }

  absl::StatusOr<v1::CloseRoundResponse> CloseAt(const std::string& at, const std::string& task) {
    v1::CloseRoundRequest request;
    request.set_task(task);
    request.set_round(1);
    return client_.CloseRound(at, request, Deadline());
  }

  // Root "t": peer p6 and children a (p0..p2) and b (p3..p5).
  void OpenTree(bool exact) {
    v1::OpenRoundRequest root = Round("t", {"p6"}, exact);
    root.add_expected_children("leaf-a");
    root.add_expected_children("leaf-b");
    ASSERT_TRUE(client_.OpenRound(root_, root, Deadline()).ok());
    v1::OpenRoundRequest a = Round("t", {"p0", "p1", "p2"}, exact);
    a.mutable_parent()->set_address(root_);
    a.mutable_parent()->set_child("leaf-a");
    ASSERT_TRUE(client_.OpenRound(a_, a, Deadline()).ok());
    v1::OpenRoundRequest b = Round("t", {"p3", "p4", "p5"}, exact);
    b.mutable_parent()->set_address(root_);
    b.mutable_parent()->set_child("leaf-b");
    ASSERT_TRUE(client_.OpenRound(b_, b, Deadline()).ok());
  }

  // A counter of another server than the fixture's, summed over the series with
  // `label`=`value` (every series when `label` is empty).
  static double MetricOf(AggregatorServer& server, const std::string& name,
                         const std::string& label = "", const std::string& value = "") {
    double total = 0;
    for (const auto& family : server.registry().Collect()) {
      if (family.name != name) continue;
      for (const auto& m : family.metric) {
        bool match = label.empty();
        for (const auto& l : m.label) match = match || (l.name == label && l.value == value);
        if (match) total += m.counter.value;
      }
    }
    return total;
  }

  std::shared_ptr<const tensor::FlatModel> base_ = std::make_shared<const tensor::FlatModel>(
      Filled([](size_t i) { return 0.001f * static_cast<float>(i % 1000); }));
  GrpcAggregatorClient client_;
  std::unique_ptr<AggregatorServer> leaf_a_, leaf_b_;
  std::string root_, a_, b_;
};

TEST_F(AggregatorTreeServiceTest, LeavesForwardPartialSumsAndTheRootPublishesTheFlatModel) {
  OpenTree(/*exact=*/true);
  for (int k : {0, 1, 2}) ASSERT_TRUE(PushTo(a_, "t", k).ok());
  for (int k : {5, 4, 3}) ASSERT_TRUE(PushTo(b_, "t", k).ok());
  ASSERT_TRUE(PushTo(root_, "t", 6).ok());

  auto a = CloseAt(a_, "t");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->forwarded());
  EXPECT_EQ(a->version(), 0u);
  EXPECT_THAT(a->contributors(), ElementsAre("p0", "p1", "p2"));
  EXPECT_EQ(a->num_samples(), 100u + 137u + 174u);
  // A repeat (the coordinator retrying) sends the same sum again; the root counts it once.
  auto again = CloseAt(a_, "t");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->forwarded());
  auto b = CloseAt(b_, "t");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Metric("shoal_aggregator_partials_accepted_total"), 2);  // the repeat not counted
  auto root = CloseAt(root_, "t");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_FALSE(root->forwarded());
  EXPECT_EQ(root->version(), 1u);
  EXPECT_EQ(root->contributors_size(), 7);

  // The same seven updates in one flat round, in another order.
  ASSERT_TRUE(client_
                  .PutModel(root_, tensor::MakeModelMeta("flat", 0, *base_),
                            tensor::EncodeRaw(base_), {}, Deadline())
                  .ok());
  const std::vector<std::string> all = {"p0", "p1", "p2", "p3", "p4", "p5", "p6"};
  ASSERT_TRUE(client_.OpenRound(root_, Round("flat", all, true), Deadline()).ok());
  for (int k : {6, 3, 0, 5, 1, 4, 2}) ASSERT_TRUE(PushTo(root_, "flat", k).ok());
  auto flat = CloseAt(root_, "flat");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(root->digest_xxh3(), flat->digest_xxh3());
  EXPECT_EQ(root->num_samples(), flat->num_samples());
  EXPECT_DOUBLE_EQ(root->mean_train_loss(), flat->mean_train_loss());
  // Each leaf sent one exact sum (16 bytes a value) up; the root's ingress is O(children).
  EXPECT_GE(Metric("shoal_aggregator_bytes_received_total"),
            2.0 * 16 * static_cast<double>(base_->values.size()));
}

TEST_F(AggregatorTreeServiceTest, ChildRoundsFetchTheirBaseVersionFromTheParent) {
  OpenTree(/*exact=*/false);
  ASSERT_TRUE(PushTo(a_, "t", 0).ok());
  ASSERT_TRUE(PushTo(b_, "t", 3).ok());
  ASSERT_TRUE(CloseAt(a_, "t").ok());
  ASSERT_TRUE(CloseAt(b_, "t").ok());
  auto closed = CloseAt(root_, "t");
  ASSERT_TRUE(closed.ok()) << closed.status();
  ASSERT_EQ(closed->version(), 1u);

  // Round 2 on version 1, which only the root holds: leaf a fetches it as child "leaf-a".
  v1::OpenRoundRequest root = Round("t", {}, false);
  root.set_round(2);
  root.set_base_version(1);
  root.add_expected_children("leaf-a");
  ASSERT_TRUE(client_.OpenRound(root_, root, Deadline()).ok());
  v1::OpenRoundRequest a = Round("t", {"p0"}, false);
  a.set_round(2);
  a.set_base_version(1);
  a.mutable_parent()->set_address(root_);
  a.mutable_parent()->set_child("leaf-a");
  auto opened = client_.OpenRound(a_, a, Deadline());
  ASSERT_TRUE(opened.ok()) << opened;
  auto fetched = client_.GetModel(a_, "t", 1, {}, Deadline());
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched->Digest(), closed->digest_xxh3());

  // Once the root knows the task's members, a child it never named may not read its models.
  v1::SetMembersRequest members;
  members.set_task("t");
  (*members.mutable_session_tokens())["p6"] = "token-6";
  ASSERT_TRUE(client_.SetMembers(root_, members, Deadline()).ok());
  a.set_round(3);
  a.mutable_parent()->set_child("leaf-z");
  auto b = client_.OpenRound(b_, a, Deadline());
  EXPECT_EQ(b.code(), absl::StatusCode::kUnauthenticated) << b;
  EXPECT_THAT(b.message(), HasSubstr("fetching base version 1 from the parent"));

  // The round runs on the fetched version.
  v1::UpdateMeta meta = Meta("p0", 100, "t", 2, 1);
  auto delta = std::make_shared<const tensor::FlatModel>(Delta(0));
  ASSERT_TRUE(client_.PushUpdate(a_, meta, tensor::EncodeRaw(delta), Deadline()).ok());
  v1::CloseRoundRequest close;
  close.set_task("t");
  close.set_round(2);
  ASSERT_TRUE(client_.CloseRound(a_, close, Deadline()).ok());
  auto done = client_.CloseRound(root_, close, Deadline());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->version(), 2u);
  EXPECT_THAT(done->contributors(), ElementsAre("p0"));

  // PullModel: the coordinator has each child fetch the version the root published, for its
  // peers' evaluation; once held, a repeat fetches nothing.
  v1::PullModelRequest pull;
  pull.set_task("t");
  pull.set_version(2);
  pull.mutable_parent()->set_address(root_);
  pull.mutable_parent()->set_child("leaf-a");
  auto pulled = client_.PullModel(a_, pull, Deadline());
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_TRUE(*pulled);
  auto held = client_.GetModel(a_, "t", 2, {}, Deadline());
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->Digest(), done->digest_xxh3());
  pulled = client_.PullModel(a_, pull, Deadline());
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  EXPECT_FALSE(*pulled);
  // A child the root never named may not fetch; a request without a parent is malformed.
  pull.mutable_parent()->set_child("leaf-z");
  pulled = client_.PullModel(b_, pull, Deadline());
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kUnauthenticated) << pulled.status();
  EXPECT_THAT(pulled.status().message(), HasSubstr("fetching version 2 from the parent"));
  pull.clear_parent();
  pulled = client_.PullModel(b_, pull, Deadline());
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kInvalidArgument) << pulled.status();
}

TEST_F(AggregatorTreeServiceTest, BadPartialsAreRefusedWithTheRightStatus) {
  OpenTree(/*exact=*/false);
  for (int k : {0, 1}) ASSERT_TRUE(PushTo(a_, "t", k).ok());
  // A hand-made partial: the leaf's real sum, sent with broken metas.
  PartialResult partial;
  partial.meta = {"t", 1, "", 0, {"p0"}, 100, 0};
  partial.sum.summation = aggregation::Summation::kFloat;
  partial.sum.sum.assign(base_->values.size(), 0.5f);
  partial.sum.count = 1;
  partial.sum.total_weight = 100;
  const absl::string_view bytes = PartialBytes(partial.sum);

  v1::PartialMeta meta = PartialMetaFor(partial, "leaf-z");
  auto r = client_.PushPartial(root_, meta, bytes, Deadline());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("child 'leaf-z' is not expected"));

  meta = PartialMetaFor(partial, "leaf-a");
  meta.set_digest_xxh3(meta.digest_xxh3() + 1);
  r = client_.PushPartial(root_, meta, bytes, Deadline());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("digest mismatch"));

  meta = PartialMetaFor(partial, "leaf-a");
  r = client_.PushPartial(root_, meta, bytes.substr(0, bytes.size() - 4), Deadline());
  EXPECT_THAT(r.status().message(), HasSubstr("ended after"));

  meta.set_values(7);
  r = client_.PushPartial(root_, meta, bytes, Deadline());
  EXPECT_THAT(r.status().message(), HasSubstr("has 7 values"));

  meta = PartialMetaFor(partial, "leaf-a");
  meta.set_exact(true);
  r = client_.PushPartial(root_, meta, bytes, Deadline());
  EXPECT_THAT(r.status().message(), HasSubstr("exact_weight has 0 bytes"));

  meta = PartialMetaFor(partial, "leaf-a");
  meta.set_round(9);
  r = client_.PushPartial(root_, meta, bytes, Deadline());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);

  // Nothing of that counted: the leaf's own partial goes in, and the root holds just it.
  auto a = CloseAt(a_, "t");
  ASSERT_TRUE(a.ok()) << a.status();
  auto root = CloseAt(root_, "t");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_THAT(root->contributors(), ElementsAre("p0", "p1"));
  EXPECT_EQ(root->num_samples(), 237u);
}

TEST_F(AggregatorTreeServiceTest, AnUnreachableParentFailsTheLeafsCloseWithUnavailable) {
  v1::OpenRoundRequest a = Round("t", {"p0"}, false);
  a.mutable_parent()->set_address("127.0.0.1:1");  // nothing listens there
  a.mutable_parent()->set_child("leaf-a");
  ASSERT_TRUE(client_.OpenRound(a_, a, Deadline()).ok());
  ASSERT_TRUE(PushTo(a_, "t", 0).ok());
  auto closed = CloseAt(a_, "t");
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(closed.status().message(), HasSubstr("sending its partial sum to the parent"));
}

// Replicas: leaf b is leaf a's backup. Leaf a copies every update it accepts to b before it
// answers; b, a standby, refuses the peers' own pushes until it is promoted (opened again without
// standby_for). Leaf a is then lost: b takes over its round, a repeat of an acknowledged push
// is a duplicate, and the root gets each update exactly once.
// A parent that holds every GetModel until released, then answers NOT_FOUND (an error that no
// channel retries): a parent that is slow or stuck. Counts the calls that have come.
class StalledParent final : public v1::AggregatorService::Service {
 public:
  grpc::Status GetModel(grpc::ServerContext*, const v1::GetModelRequest*,
                        grpc::ServerWriter<common::v1::ModelChunk>*) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    mu_.Await(absl::Condition(&released_));
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "released by the test");
  }
  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }

 private:
  mutable absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

// What waits on a parent runs apart from the folds. Two child rounds at leaf a whose parent
// holds their fetches (each OpenRound fetches its base version first) stay open; meanwhile a
// peer's push to another task at the same leaf is accepted and answered. The leaf folds on two
// threads: were the fetches run there, they would take both, and the push would wait until the
// parent let go (here: past the push's deadline).
TEST_F(AggregatorTreeServiceTest, AParentThatNeverAnswersHoldsUpNoPush) {
  ASSERT_TRUE(client_.OpenRound(a_, Round("t", {"p0"}, false), Deadline()).ok());
  StalledParent stalled;
  rpc::ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.service_name = "stalled-parent";
  auto parent = rpc::Server::Start(options, {&stalled});
  ASSERT_TRUE(parent.ok()) << parent.status();
  const std::string parent_address = (*parent)->address();
  std::atomic<int> opens_done{0};
  std::vector<std::unique_ptr<testing::JoiningThread>> opens;
  for (int i = 0; i < 2; ++i) {
    opens.push_back(std::make_unique<testing::JoiningThread>(
        [&, i] {
          v1::OpenRoundRequest child = Round(absl::StrCat("s", i), {"p9"}, false);
          child.mutable_parent()->set_address(parent_address);
          child.mutable_parent()->set_child("leaf-a");
          EXPECT_FALSE(client_.OpenRound(a_, child, absl::Now() + absl::Minutes(2)).ok());
          opens_done.fetch_add(1);
        },
        [&stalled] { stalled.Release(); }));
  }
  ASSERT_TRUE(testing::WaitUntil([&] { return stalled.calls() == 2; }, absl::Seconds(10)))
      << "the child rounds' fetches never reached the parent";
  const absl::StatusOr<bool> pushed = PushTo(a_, "t", 0);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ(opens_done.load(), 0);
  auto closed = CloseAt(a_, "t");
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_THAT(closed->contributors(), ElementsAre("p0"));
  opens.clear();  // releases the parent's calls and joins
  EXPECT_EQ(opens_done.load(), 2);
  (*parent)->Shutdown(absl::Seconds(1));
}

TEST_F(AggregatorTreeServiceTest, ABackupTakesOverWithEveryAcknowledgedUpdateOnce) {
  v1::OpenRoundRequest root = Round("t", {"p6"}, /*exact=*/true);
  root.add_expected_children("leaf-a");
  ASSERT_TRUE(client_.OpenRound(root_, root, Deadline()).ok());
  v1::OpenRoundRequest cluster = Round("t", {"p0", "p1", "p2"}, /*exact=*/true);
  cluster.mutable_parent()->set_address(root_);
  cluster.mutable_parent()->set_child("leaf-a");
  v1::OpenRoundRequest standby = cluster;
  standby.set_standby_for("leaf-a");
  standby.add_backups(a_);
  EXPECT_EQ(client_.OpenRound(b_, standby, Deadline()).code(), absl::StatusCode::kInvalidArgument);
  standby.clear_backups();
  ASSERT_TRUE(client_.OpenRound(b_, standby, Deadline()).ok());
  cluster.add_backups(b_);
  ASSERT_TRUE(client_.OpenRound(a_, cluster, Deadline()).ok());

  // A standby takes no push of a peer's own.
  absl::StatusOr<bool> refused = PushTo(b_, "t", 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("standby backup of 'leaf-a'"));
  // Nor a copy from another primary.
  v1::UpdateMeta forged = Meta("p0", 100, "t");
  forged.set_replicated_by("leaf-x");
  EXPECT_EQ(client_
                .PushUpdate(b_, forged,
                            tensor::EncodeRaw(std::make_shared<const tensor::FlatModel>(Delta(0))),
                            Deadline())
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  for (int k : {0, 1}) {
    absl::StatusOr<bool> pushed = PushTo(a_, "t", k);
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_FALSE(*pushed);
  }
  EXPECT_EQ(MetricOf(*leaf_a_, "shoal_aggregator_replications_total", "result", "copied"), 2);
  EXPECT_EQ(MetricOf(*leaf_a_, "shoal_aggregator_replications_total", "result", "failed"), 0);

  // Leaf a is lost; the coordinator promotes b.
  leaf_a_->Shutdown();
  leaf_a_.reset();
  v1::OpenRoundRequest promoted = cluster;
  promoted.clear_backups();
  ASSERT_TRUE(client_.OpenRound(b_, promoted, Deadline()).ok());
  // p1 was told its update is in: its retry at b is a duplicate. p2 pushes there first.
  absl::StatusOr<bool> again = PushTo(b_, "t", 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(*again);
  absl::StatusOr<bool> fresh = PushTo(b_, "t", 2);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(*fresh);
  ASSERT_TRUE(PushTo(root_, "t", 6).ok());

  auto b = CloseAt(b_, "t");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE(b->forwarded());
  EXPECT_THAT(b->contributors(), ElementsAre("p0", "p1", "p2"));
  EXPECT_EQ(b->num_samples(), 100u + 137u + 174u);
  auto closed = CloseAt(root_, "t");
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->version(), 1u);
  EXPECT_EQ(closed->contributors_size(), 4);
  EXPECT_EQ(closed->num_samples(), 100u + 137u + 174u + 322u);
}

// The root's replica: leaf a is the root's backup, leaf b a child. The backup's standby round
// fetches its base version from the root as the root's child; the root copies its own peer's
// update to it. Leaf b's partial sum reaches the root, which is then lost: the backup is
// promoted (opened again as a root), leaf b's closed round is pointed at it (opened again with
// the new parent) and its close repeated: the new root publishes what one flat round over the
// same updates would, bit for bit.
TEST_F(AggregatorTreeServiceTest, TheRootsBackupTakesOverAndPublishesTheSameModel) {
  ASSERT_TRUE(client_
                  .PutModel(root_, tensor::MakeModelMeta("r", 0, *base_), tensor::EncodeRaw(base_),
                            {}, Deadline())
                  .ok());
  v1::OpenRoundRequest root = Round("r", {"p6"}, /*exact=*/true);
  root.add_expected_children("leaf-b");
  root.add_expected_children("backup");
  ASSERT_TRUE(client_.OpenRound(root_, root, Deadline()).ok());
  v1::OpenRoundRequest standby = root;
  standby.set_standby_for("root");
  standby.mutable_parent()->set_address(root_);
  standby.mutable_parent()->set_child("backup");
  ASSERT_TRUE(client_.OpenRound(a_, standby, Deadline()).ok());  // fetches version 0
  root.add_backups(a_);
  root.set_replica_id("root");
  ASSERT_TRUE(client_.OpenRound(root_, root, Deadline()).ok());
  v1::OpenRoundRequest child = Round("r", {"p3", "p4"}, /*exact=*/true);
  child.mutable_parent()->set_address(root_);
  child.mutable_parent()->set_child("leaf-b");
  ASSERT_TRUE(client_.OpenRound(b_, child, Deadline()).ok());

  ASSERT_TRUE(PushTo(root_, "r", 6).ok());
  EXPECT_EQ(Metric("shoal_aggregator_replications_total"), 1);
  for (int k : {3, 4}) ASSERT_TRUE(PushTo(b_, "r", k).ok());
  auto forwarded = CloseAt(b_, "r");
  ASSERT_TRUE(forwarded.ok()) << forwarded.status();
  EXPECT_TRUE(forwarded->forwarded());

  // The root is lost before it closes the round.
  server_->Shutdown();
  server_.reset();
  v1::OpenRoundRequest promoted = standby;
  promoted.clear_standby_for();
  promoted.clear_parent();
  promoted.set_replica_id("backup");
  promoted.clear_expected_children();
  promoted.add_expected_children("leaf-b");
  ASSERT_TRUE(client_.OpenRound(a_, promoted, Deadline()).ok());
  // Leaf b's round is closed: only its parent may change (it stays a child's round).
  v1::OpenRoundRequest moved = child;
  moved.clear_parent();
  EXPECT_EQ(client_.OpenRound(b_, moved, Deadline()).code(), absl::StatusCode::kFailedPrecondition);
  moved = child;
  moved.mutable_parent()->set_address(a_);
  ASSERT_TRUE(client_.OpenRound(b_, moved, Deadline()).ok());
  forwarded = CloseAt(b_, "r");
  ASSERT_TRUE(forwarded.ok()) << forwarded.status();
  EXPECT_THAT(forwarded->contributors(), ElementsAre("p3", "p4"));
  auto closed = CloseAt(a_, "r");
  ASSERT_TRUE(closed.ok()) << closed.status();
  EXPECT_EQ(closed->version(), 1u);
  EXPECT_EQ(closed->contributors_size(), 3);

  // The same three updates in one flat round.
  ASSERT_TRUE(client_
                  .PutModel(a_, tensor::MakeModelMeta("flat", 0, *base_), tensor::EncodeRaw(base_),
                            {}, Deadline())
                  .ok());
  ASSERT_TRUE(client_.OpenRound(a_, Round("flat", {"p3", "p4", "p6"}, true), Deadline()).ok());
  for (int k : {6, 4, 3}) ASSERT_TRUE(PushTo(a_, "flat", k).ok());
  auto flat = CloseAt(a_, "flat");
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(closed->digest_xxh3(), flat->digest_xxh3());
  EXPECT_EQ(closed->num_samples(), flat->num_samples());
}

// Federated-async on a tree: each leaf's full buffer goes to the root as one update (its
// aggregate, weighted by its samples); only the root publishes.
TEST_F(AggregatorTreeServiceTest, AsyncLeavesSendFullBuffersUpAndOnlyTheRootPublishes) {
  const auto buffer = [](uint32_t size) {
    v1::OpenBufferRequest request;
    request.set_task("t");
    request.set_base_version(0);
    request.mutable_async()->set_buffer_size(size);
    request.mutable_aggregation()->set_strategy(common::v1::AGGREGATION_MEAN);
    return request;
  };
  v1::OpenBufferRequest root = buffer(4);  // filled by four peers' updates
  root.add_children("leaf-a");
  root.add_children("leaf-b");
  ASSERT_TRUE(client_.OpenBuffer(root_, root, Deadline()).ok());
  for (const auto& [at, id] : {std::pair{a_, "leaf-a"}, std::pair{b_, "leaf-b"}}) {
    v1::OpenBufferRequest leaf = buffer(2);
    leaf.mutable_parent()->set_address(root_);
    leaf.mutable_parent()->set_child(id);
    ASSERT_TRUE(client_.OpenBuffer(at, leaf, Deadline()).ok());
  }
  const auto push = [&](const std::string& at, int k, uint64_t base) {
    auto delta = std::make_shared<const tensor::FlatModel>(Delta(k));
    v1::UpdateMeta meta = Meta(absl::StrCat("p", k), 100 + 37 * k, "t", 0, base);
    return client_.PushUpdate(at, meta, tensor::EncodeRaw(delta), Deadline());
  };
  for (int k : {0, 1}) ASSERT_TRUE(push(a_, k, 0).ok());
  for (int k : {3, 4}) ASSERT_TRUE(push(b_, k, 0).ok());
  absl::StatusOr<tensor::FlatModel> v1;
  ASSERT_TRUE(shoal::testing::WaitUntil(
      [&] { return (v1 = client_.GetModel(root_, "t", 1, {}, Deadline())).ok(); },
      absl::Seconds(30)))
      << v1.status();
  // Flat FedBuff over the same four updates (none stale): base + their sample-weighted mean.
  double weight = 0;
  std::vector<double> sum(base_->values.size(), 0);
  for (int k : {0, 1, 3, 4}) {
    const double w = 100 + 37 * k;
    const tensor::FlatModel d = Delta(k);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += w * d.values[i];
    weight += w;
  }
  for (size_t i = 0; i < sum.size(); i += 97) {
    EXPECT_NEAR(v1->values[i], base_->values[i] + sum[i] / weight, 1e-5) << "value " << i;
  }
  EXPECT_FALSE(client_.GetModel(a_, "t", 1, {}, Deadline()).ok()) << "a leaf publishes nothing";
  EXPECT_EQ(Metric("shoal_aggregator_partials_accepted_total"), 2);
  EXPECT_EQ(MetricOf(*leaf_a_, "shoal_aggregator_partials_forwarded_total"), 1);

  // A version the leaf fetches keeps the update waiting in its buffer: with the next one the
  // buffer is full and goes up, trained on version 1.
  ASSERT_TRUE(push(a_, 0, 0).ok());
  v1::PullModelRequest pull;
  pull.set_task("t");
  pull.set_version(1);
  pull.mutable_parent()->set_address(root_);
  pull.mutable_parent()->set_child("leaf-a");
  ASSERT_TRUE(client_.PullModel(a_, pull, Deadline()).ok());
  ASSERT_TRUE(push(a_, 1, 1).ok());
  EXPECT_TRUE(shoal::testing::WaitUntil(
      [&] { return Metric("shoal_aggregator_partials_accepted_total") == 3; }, absl::Seconds(30)));
  EXPECT_FALSE(client_.GetModel(root_, "t", 2, {}, Deadline()).ok())
      << "the root's buffer holds 2 peers' updates of 4";

  // A child the root's buffer does not name is refused.
  v1::PartialMeta meta;
  meta.set_task("t");
  meta.set_child("leaf-z");
  meta.set_base_version(1);
  meta.add_contributors("p9");
  meta.set_num_samples(10);
  meta.set_total_weight(1);
  meta.set_values(base_->values.size());
  const std::vector<float> zeros(base_->values.size(), 0.0f);
  const absl::string_view bytes(reinterpret_cast<const char*>(zeros.data()),
                                zeros.size() * sizeof(float));
  meta.set_digest_xxh3(tensor::DigestBytes(bytes.data(), bytes.size()));
  auto refused = client_.PushPartial(root_, meta, bytes, Deadline());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("not a child of the buffer"));
}

// A copy to a backup is bounded by 30 s plus the update's bytes at 1 Mbit/s: a 40 MB update is
// not cut off after 30 s (over a busy link, or behind the copies of other pushes).
TEST(CopyToBackupsTest, EachCopysBoundGrowsWithTheUpdatesBytes) {
  prometheus::Registry registry;
  AggregatorMetrics metrics(registry);
  fakes::PeerSideAggregator backups;
  PushReplica replica;
  replica.backups = {"backup-a:1", "backup-b:1"};
  replica.meta.set_task("t");
  replica.meta.set_base_version(3);
  auto update = std::make_shared<tensor::FlatModel>();
  update->layout = *tensor::ModelLayout::Create({{"w", {10'000'000}}});
  update->values.assign(10'000'000, 0.5f);
  replica.update = update;
  const absl::Time before = absl::Now();
  CopyToBackups(replica, backups, metrics);
  const absl::Time after = absl::Now();
  const std::vector<fakes::PeerSideAggregator::Call> calls = backups.calls();
  ASSERT_EQ(calls.size(), 2u);
  const absl::Duration bound = absl::Seconds(30) + absl::Seconds(40e6 / 125e3);  // 350 s
  for (const auto& call : calls) {
    EXPECT_EQ(call.method, "PushUpdate");
    EXPECT_GE(call.deadline, before + bound) << call.address;
    EXPECT_LE(call.deadline, after + bound + absl::Seconds(1)) << call.address;
  }
  EXPECT_EQ(calls[0].address, "backup-a:1");
  EXPECT_EQ(calls[1].address, "backup-b:1");
}

}  // namespace
}  // namespace shoal::aggregator
