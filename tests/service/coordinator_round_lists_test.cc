// A real coordinator (in-process, gRPC on 127.0.0.1:0) holding a task whose rounds had 20,000
// peers each: its status and ListRounds pages stay within a client's default message limit
// (4 MiB), the newest round with its lists, older ones with their counts (round_lists.h).

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "libs/rpc/channel.h"
#include "services/coordinator/coordinator_server.h"
#include "services/coordinator/round_lists.h"
#include "services/coordinator/store/sqlite_task_store.h"
#include "shoal/coordinator/v1/control.grpc.pb.h"

namespace shoal::coordinator {
namespace {

constexpr int kRounds = 8;
constexpr int kPeers = 20'000;

// Round r: kPeers participants, each with a time, and r dropped peers.
v1::RoundSummary BigRound(int r) {
  v1::RoundSummary round;
  round.set_round(static_cast<uint64_t>(r));
  round.set_model_version(static_cast<uint64_t>(r));
  round.set_test_accuracy(0.5 + r / 100.0);
  round.set_evaluated(true);
  round.set_note(absl::StrFormat("round %d", r));
  for (int i = 0; i < kPeers; ++i) {
    const std::string id = absl::StrFormat("peer-%05d", i);
    round.add_participants(id);
    v1::PeerRoundTime* t = round.add_peer_times();
    t->set_peer_id(id);
    t->set_ms(1000 + i);
  }
  for (int i = 0; i < r; ++i) round.add_dropped(absl::StrFormat("gone-%d", i));
  return round;
}

class RoundListsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("shoal-round-lists-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    {
      auto store = SqliteTaskStore::Open(dir_.string());
      ASSERT_TRUE(store.ok()) << store.status();
      v1::TaskStatus task;
      task.mutable_spec()->set_name("big");
      task.mutable_spec()->set_mode(common::v1::MODE_FEDERATED_SYNC);
      task.mutable_spec()->set_rounds(kRounds);
      task.set_state(v1::TASK_STATE_COMPLETED);
      task.set_round(kRounds);
      task.set_model_version(kRounds);
      ASSERT_TRUE((*store)->PutTask(task).ok());
      for (int r = 1; r <= kRounds; ++r) ASSERT_TRUE((*store)->PutRound("big", BigRound(r)).ok());
    }
    CoordinatorServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.state_dir = dir_.string();
    options.tls.insecure = true;
    auto server = CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    // gRPC's default limits (4 MiB received), as any client has.
    control_ = v1::ControlService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::filesystem::path dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::ControlService::Stub> control_;
};

TEST_F(RoundListsTest, TheStatusListsTheNewestRoundsAndCountsTheOthers) {
  // Every round in full would be about 5 MB.
  grpc::ClientContext context;
  rpc::SetTimeout(context, absl::Seconds(30));
  v1::GetTaskStatusRequest request;
  request.set_name("big");
  v1::GetTaskStatusResponse response;
  const grpc::Status s = control_->GetTaskStatus(&context, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const v1::TaskStatus& status = response.status();
  ASSERT_EQ(status.history_size(), kRounds);
  size_t listed = 0;
  for (int i = 0; i < kRounds; ++i) {
    const v1::RoundSummary& r = status.history(i);
    SCOPED_TRACE(r.ShortDebugString().substr(0, 200));
    EXPECT_EQ(r.round(), static_cast<uint64_t>(i + 1));
    EXPECT_EQ(r.participant_count(), static_cast<uint32_t>(kPeers));
    EXPECT_EQ(r.dropped_count(), static_cast<uint32_t>(i + 1));
    EXPECT_EQ(r.note(), absl::StrFormat("round %d", i + 1));
    EXPECT_DOUBLE_EQ(r.test_accuracy(), 0.5 + (i + 1) / 100.0);
    listed += ListEntries(r);
    if (i == kRounds - 1) {  // the newest: in full (40,008 entries fit in 50,000)
      EXPECT_FALSE(r.lists_omitted());
      EXPECT_EQ(r.participants_size(), kPeers);
      EXPECT_EQ(r.peer_times_size(), kPeers);
      EXPECT_EQ(r.dropped_size(), kRounds);
    } else {  // the next would not fit with it
      EXPECT_TRUE(r.lists_omitted());
      EXPECT_EQ(r.participants_size(), 0);
      EXPECT_EQ(r.peer_times_size(), 0);
      EXPECT_EQ(r.dropped_size(), 0);
    }
  }
  EXPECT_LE(listed, kRoundListBudget);
}

TEST_F(RoundListsTest, ListRoundsPagesHoldWholeRoundsWithinTheBudget) {
  std::vector<v1::RoundSummary> rounds;
  uint64_t after = 0;
  for (int call = 0; call < 2 * kRounds; ++call) {
    grpc::ClientContext context;
    rpc::SetTimeout(context, absl::Seconds(30));
    v1::ListRoundsRequest request;
    request.set_name("big");
    request.set_after_round(after);
    request.set_limit(1000);
    v1::ListRoundsResponse response;
    const grpc::Status s = control_->ListRounds(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    // One round of 40,000 entries per page: two would pass the budget.
    ASSERT_EQ(response.rounds_size(), 1) << "page after round " << after;
    for (const v1::RoundSummary& r : response.rounds()) rounds.push_back(r);
    after = rounds.back().round();
    if (!response.more()) break;
  }
  ASSERT_EQ(rounds.size(), static_cast<size_t>(kRounds));
  for (int i = 0; i < kRounds; ++i) {
    const v1::RoundSummary& r = rounds[i];
    EXPECT_EQ(r.round(), static_cast<uint64_t>(i + 1));
    EXPECT_FALSE(r.lists_omitted());
    EXPECT_EQ(r.participants_size(), kPeers);
    EXPECT_EQ(r.participant_count(), static_cast<uint32_t>(kPeers));
    EXPECT_EQ(r.peer_times_size(), kPeers);
    EXPECT_EQ(r.dropped_count(), static_cast<uint32_t>(i + 1));
  }
}

}  // namespace
}  // namespace shoal::coordinator
