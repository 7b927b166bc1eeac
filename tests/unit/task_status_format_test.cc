// shoalctl's rendering of TaskStatus: the JSON of `task status --json`, the progress line and
// the summary table. No server involved.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>
#include <tuple>

#include "services/shoalctl/task_format.h"
#include "shoal/coordinator/v1/control.pb.h"

namespace shoal::shoalctl {
namespace {

using coordinator::v1::TaskStatus;
using ::testing::HasSubstr;
using ::testing::Not;

TaskStatus RunningStatus() {
  TaskStatus s;
  s.mutable_spec()->set_name("fmnist \"cnn\"");  // a quote to check escaping
  s.mutable_spec()->set_mode(common::v1::MODE_FEDERATED_SYNC);
  s.mutable_spec()->set_model("cnn");
  s.mutable_spec()->set_rounds(4);
  s.mutable_spec()->mutable_dataset()->set_partition(common::v1::PARTITION_LABEL_SKEW);
  s.set_state(coordinator::v1::TASK_STATE_RUNNING);
  s.set_phase(coordinator::v1::ROUND_PHASE_TRAINING);
  s.set_round(3);
  s.add_participants("peer-0");
  s.add_participants("peer-1");
  s.set_model_version(2);
  s.set_aggregator("127.0.0.1:4000");
  for (int r = 1; r <= 2; ++r) {
    auto* h = s.add_history();
    h->set_round(r);
    h->add_participants("peer-0");
    h->add_participants("peer-1");
    if (r == 2) h->add_dropped("peer-2");
    h->set_mean_train_loss(1.0 / r);
    h->set_num_samples(3200);
    h->set_model_version(r);
    h->set_duration_ms(1500 * r);
    h->set_evaluated(r == 1);
    h->set_evaluation_complete(r == 1);
    h->set_test_accuracy(r == 1 ? 0.75 : 0);
    h->set_test_loss(0.6);
    h->set_test_samples(10000);
  }
  return s;
}

TEST(TaskStatusJsonTest, HasTheDocumentedKeysWithFriendlyValues) {
  const std::string json = TaskStatusToJson(RunningStatus());
  EXPECT_EQ(json.find('\n'), std::string::npos) << "one line";
  // yaml-cpp reads JSON; a parse error throws.
  YAML::Node root = YAML::Load(json);
  ASSERT_TRUE(root.IsMap());
  EXPECT_EQ(root["name"].as<std::string>(), "fmnist \"cnn\"");
  EXPECT_EQ(root["mode"].as<std::string>(), "federated-sync");
  EXPECT_EQ(root["state"].as<std::string>(), "running");
  EXPECT_EQ(root["phase"].as<std::string>(), "training");
  EXPECT_EQ(root["round"].as<int>(), 3);
  EXPECT_EQ(root["rounds"].as<int>(), 4);
  EXPECT_EQ(root["model_version"].as<int>(), 2);
  ASSERT_TRUE(root["participants"].IsSequence());
  ASSERT_EQ(root["participants"].size(), 2u);
  EXPECT_EQ(root["participants"][1].as<std::string>(), "peer-1");
  EXPECT_DOUBLE_EQ(root["last_test_accuracy"].as<double>(), 0.75);
  EXPECT_EQ(root["spec"]["dataset"]["partition"].as<std::string>(), "label-skew");

  ASSERT_TRUE(root["history"].IsSequence());
  ASSERT_EQ(root["history"].size(), 2u);
  const YAML::Node first = root["history"][0];
  EXPECT_EQ(first["round"].as<int>(), 1);
  EXPECT_EQ(first["participants"].size(), 2u);
  EXPECT_DOUBLE_EQ(first["mean_train_loss"].as<double>(), 1.0);
  EXPECT_DOUBLE_EQ(first["test_accuracy"].as<double>(), 0.75);
  EXPECT_EQ(first["duration_ms"].as<int>(), 1500);
  const YAML::Node second = root["history"][1];
  EXPECT_DOUBLE_EQ(second["mean_train_loss"].as<double>(), 0.5);
  EXPECT_TRUE(second["test_accuracy"].IsNull()) << "not evaluated";
  EXPECT_EQ(second["dropped"][0].as<std::string>(), "peer-2");
}

TEST(TaskStatusJsonTest, DecentralizedShowsPhaseAndWhoIsInIt) {
  TaskStatus s = RunningStatus();
  s.mutable_spec()->set_mode(common::v1::MODE_DECENTRALIZED);
  s.set_phase(coordinator::v1::ROUND_PHASE_SHARING);
  s.clear_aggregator();
  for (const char* id : {"peer-0", "peer-1"}) {
    auto* p = s.add_peers();
    p->set_peer_id(id);
    p->set_state("sharing");
    p->set_model_round(2);
  }
  s.mutable_history(1)->set_model_digest(0xabcdef0123456789ull);
  s.mutable_history(1)->set_connection_retries(2);
  s.mutable_history(1)->add_removed("peer-9");
  s.mutable_history(1)->set_overhead_ms(120);
  YAML::Node root = YAML::Load(TaskStatusToJson(s));
  EXPECT_EQ(root["mode"].as<std::string>(), "decentralized");
  EXPECT_EQ(root["phase"].as<std::string>(), "sharing");
  ASSERT_EQ(root["peers"].size(), 2u);
  EXPECT_EQ(root["peers"][1]["peer_id"].as<std::string>(), "peer-1");
  EXPECT_EQ(root["peers"][1]["state"].as<std::string>(), "sharing");
  EXPECT_EQ(root["peers"][1]["model_round"].as<int>(), 2);
  const YAML::Node second = root["history"][1];
  EXPECT_EQ(second["model_digest"].as<std::string>(), "abcdef0123456789");
  EXPECT_EQ(second["connection_retries"].as<int>(), 2);
  EXPECT_EQ(second["removed"][0].as<std::string>(), "peer-9");
  EXPECT_EQ(second["overhead_ms"].as<int>(), 120);
  EXPECT_TRUE(root["history"][0]["model_digest"].IsNull());

  const std::string text = FormatTaskStatus(s);
  EXPECT_THAT(text, HasSubstr("(sharing)"));
  EXPECT_THAT(text, HasSubstr("peer-1"));
  EXPECT_THAT(text, HasSubstr("model of round 2"));
}

TEST(TaskStatusJsonTest, GossipShowsPerPeerClockAndLoss) {
  TaskStatus s = RunningStatus();
  s.mutable_spec()->set_mode(common::v1::MODE_GOSSIP);
  auto* p = s.add_peers();
  p->set_peer_id("peer-3");
  p->set_state("training");
  p->set_step(250);
  p->set_clock(180.5);
  p->set_loss(0.42);
  YAML::Node root = YAML::Load(TaskStatusToJson(s));
  EXPECT_EQ(root["peers"][0]["step"].as<int>(), 250);
  EXPECT_DOUBLE_EQ(root["peers"][0]["clock"].as<double>(), 180.5);
  EXPECT_DOUBLE_EQ(root["peers"][0]["loss"].as<double>(), 0.42);
  EXPECT_THAT(FormatTaskStatus(s), HasSubstr("step 250  clock 180.5  loss 0.4200"));
}

TEST(TaskStatusJsonTest, ShowsEachPeersDataCounts) {
  TaskStatus s = RunningStatus();
  auto* d = s.add_data();
  d->set_peer_id("peer-1");
  d->set_train_samples(30);
  d->set_test_samples(5);
  for (uint64_t c : {10, 0, 20}) d->add_label_histogram(c);
  YAML::Node root = YAML::Load(TaskStatusToJson(s));
  ASSERT_EQ(root["data"].size(), 1u);
  EXPECT_EQ(root["data"][0]["peer_id"].as<std::string>(), "peer-1");
  EXPECT_EQ(root["data"][0]["train_samples"].as<int>(), 30);
  EXPECT_EQ(root["data"][0]["test_samples"].as<int>(), 5);
  ASSERT_EQ(root["data"][0]["label_histogram"].size(), 3u);
  EXPECT_EQ(root["data"][0]["label_histogram"][2].as<int>(), 20);
  EXPECT_THAT(FormatTaskStatus(s),
              HasSubstr("peer-1                30 train      5 test  [10 0 20]"));
}

TEST(TaskStatusJsonTest, ShowsTheNodesWithTheirCapacity) {
  TaskStatus s = RunningStatus();
  auto* n = s.add_nodes();
  n->set_id("peer-1");
  n->set_role("peer");
  n->set_address("127.0.0.1:9001");
  n->set_device("cpu");
  n->set_task("t");
  n->mutable_capacity()->set_cpu_cores(8);
  n->mutable_capacity()->set_matmul_gflops(31.25);
  n->mutable_capacity()->set_memory_bytes(uint64_t{16} << 30);
  n->mutable_capacity()->set_memory_available_bytes(uint64_t{512} << 20);
  n->mutable_capacity()->set_upload_bytes_per_second(1.25e9);
  n->mutable_capacity()->set_reachability(common::v1::REACHABILITY_UNREACHABLE);
  n->set_supernode("elected");
  auto* a = s.add_nodes();
  a->set_id("127.0.0.1:7100");
  a->set_role("aggregator");
  a->set_address("127.0.0.1:7100");
  a->set_supernode("peer-1");
  YAML::Node root = YAML::Load(TaskStatusToJson(s));
  ASSERT_EQ(root["nodes"].size(), 2u);
  EXPECT_EQ(root["nodes"][0]["id"].as<std::string>(), "peer-1");
  EXPECT_EQ(root["nodes"][0]["cpu_cores"].as<int>(), 8);
  EXPECT_DOUBLE_EQ(root["nodes"][0]["matmul_gflops"].as<double>(), 31.25);
  EXPECT_EQ(root["nodes"][0]["memory_bytes"].as<uint64_t>(), uint64_t{16} << 30);
  EXPECT_DOUBLE_EQ(root["nodes"][0]["upload_bytes_per_second"].as<double>(), 1.25e9);
  EXPECT_EQ(root["nodes"][0]["reachability"].as<std::string>(), "unreachable");
  EXPECT_EQ(root["nodes"][1]["role"].as<std::string>(), "aggregator");
  EXPECT_EQ(root["nodes"][1]["reachability"].as<std::string>(), "unknown");
  EXPECT_EQ(root["nodes"][0]["supernode"].as<std::string>(), "elected");
  EXPECT_EQ(root["nodes"][1]["supernode"].as<std::string>(), "peer-1");
  const std::string text = FormatTaskStatus(s);
  EXPECT_THAT(text, HasSubstr("peer-1          peer/cpu    127.0.0.1:9001  t         8     31.2"
                              "    16.0G     512M    1.25GB/s  unreachable  elected"));
  EXPECT_THAT(text, HasSubstr("127.0.0.1:7100  aggregator  127.0.0.1:7100  -         -        -"
                              "        -        -           -  unknown      on peer-1"));
}

TEST(TaskStatusJsonTest, ShowsEachPeersRoundTimes) {
  TaskStatus s = RunningStatus();
  for (int64_t ms : {1200, 900, 1500}) {
    auto* r = s.add_history();
    r->set_round(static_cast<uint64_t>(s.history_size()));
    auto* t = r->add_peer_times();
    t->set_peer_id("fast");
    t->set_ms(ms / 3);
    t = r->add_peer_times();
    t->set_peer_id("slow");
    t->set_ms(ms);
  }
  YAML::Node root = YAML::Load(TaskStatusToJson(s));
  const YAML::Node last = root["history"][root["history"].size() - 1];
  EXPECT_EQ(last["peer_times"]["slow"].as<int>(), 1500);
  EXPECT_EQ(last["peer_times"]["fast"].as<int>(), 500);
  EXPECT_EQ(FormatPeerRoundTimes(s),
            "round times:   open to update accepted, each peer's median over the rounds above\n"
            "  slow                 1.2s  (3 rounds)\n"
            "  fast                400ms  (3 rounds)\n");
  EXPECT_THAT(FormatTaskStatus(s), HasSubstr("round times:"));
  EXPECT_EQ(FormatPeerRoundTimes(RunningStatus()), "");
}

TEST(TaskStatusJsonTest, EmptyStatusIsStillValidJson) {
  TaskStatus s;
  s.set_state(coordinator::v1::TASK_STATE_WAITING);
  const std::string json = TaskStatusToJson(s);
  YAML::Node root = YAML::Load(json);
  EXPECT_EQ(root["state"].as<std::string>(), "waiting");
  EXPECT_EQ(root["mode"].as<std::string>(), "unspecified");
  EXPECT_EQ(root["participants"].size(), 0u);
  EXPECT_EQ(root["history"].size(), 0u);
  EXPECT_TRUE(root["last_test_accuracy"].IsNull());
  EXPECT_THAT(json, HasSubstr("\"participants\":[]"));
  EXPECT_THAT(json, HasSubstr("\"data\":[]"));
  EXPECT_THAT(json, HasSubstr("\"nodes\":[]"));
  EXPECT_THAT(json, HasSubstr("\"history\":[]"));
}

TEST(TaskStatusJsonTest, NonFiniteLossIsNull) {
  TaskStatus s = RunningStatus();
  s.mutable_history(0)->set_mean_train_loss(std::nan(""));
  YAML::Node root = YAML::Load(TaskStatusToJson(s));
  EXPECT_TRUE(root["history"][0]["mean_train_loss"].IsNull());
}

TEST(ProgressLineTest, ShowsRoundBarPeersLossAndAccuracy) {
  const std::string line = FormatProgressLine(RunningStatus(), 20);
  EXPECT_THAT(line, HasSubstr("round 3/4"));
  EXPECT_THAT(line, HasSubstr("[##########----------]  50%"));  // 2 of 4 rounds done
  EXPECT_THAT(line, HasSubstr("peers 2"));
  EXPECT_THAT(line, HasSubstr("loss 0.5000"));
  EXPECT_THAT(line, HasSubstr("acc 0.7500"));
  EXPECT_THAT(line, HasSubstr("training"));
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST(ProgressLineTest, WaitingShowsTheReason) {
  TaskStatus s;
  s.mutable_spec()->set_rounds(10);
  s.set_state(coordinator::v1::TASK_STATE_WAITING);
  s.set_message("have 1 peers, need 2");
  const std::string line = FormatProgressLine(s, 10);
  EXPECT_THAT(line, HasSubstr("round 0/10 [----------]   0%"));
  EXPECT_THAT(line, HasSubstr("waiting: have 1 peers, need 2"));
  EXPECT_THAT(line, Not(HasSubstr("acc")));
}

TEST(ProgressLineTest, ShowsOnlyAccuraciesWhoseEvaluationIsComplete) {
  TaskStatus s = RunningStatus();
  // Round 2's reports are still coming in: its partial accuracy is not shown.
  s.mutable_history(1)->set_evaluated(true);
  s.mutable_history(1)->set_test_accuracy(0.9);
  EXPECT_THAT(FormatProgressLine(s, 20), HasSubstr("acc 0.7500"));
  s.mutable_history(1)->set_evaluation_complete(true);
  EXPECT_THAT(FormatProgressLine(s, 20), HasSubstr("acc 0.9000"));
}

TEST(ProgressLogLineTest, DescribesTheNewestSettledRoundWithoutThePhase) {
  TaskStatus s = RunningStatus();
  // Round 2 closed but is still being evaluated: the log line still describes round 1.
  s.mutable_history(1)->set_evaluated(true);
  s.mutable_history(1)->set_test_accuracy(0.9);
  const std::string before = FormatProgressLogLine(s, 20);
  EXPECT_EQ(before, "round 1/4 [#####---------------]  25%  peers 2  loss 1.0000  acc 0.7500");
  // A phase change alone changes nothing.
  s.set_phase(coordinator::v1::ROUND_PHASE_CLOSING);
  EXPECT_EQ(FormatProgressLogLine(s, 20), before);
  // Its evaluation completes: one new line for round 2.
  s.mutable_history(1)->set_evaluation_complete(true);
  EXPECT_EQ(FormatProgressLogLine(s, 20),
            "round 2/4 [##########----------]  50%  peers 2  loss 0.5000  acc 0.9000");
  // A round that is never evaluated is settled once a later round closed.
  s.mutable_history(1)->set_evaluation_complete(false);
  s.mutable_history(1)->set_evaluated(false);
  auto* h = s.add_history();
  h->set_round(3);
  h->set_mean_train_loss(0.25);
  EXPECT_EQ(FormatProgressLogLine(s, 20),
            "round 2/4 [##########----------]  50%  peers 2  loss 0.5000");
  // The end settles every round and names the state.
  s.set_state(coordinator::v1::TASK_STATE_STOPPED);
  s.set_message("stopped by an operator");
  EXPECT_EQ(FormatProgressLogLine(s, 20),
            "round 3/4 [###############-----]  75%  peers 2  loss 0.2500  stopped: stopped by an "
            "operator");
}

// The coordinator sends only the newest rounds of a long task: the counts still cover them all.
TEST(ProgressLineTest, CountsTheRoundsBeforeTheHistoryWindow) {
  TaskStatus s = RunningStatus();
  s.mutable_spec()->set_rounds(500);
  s.set_state(coordinator::v1::TASK_STATE_COMPLETED);
  s.set_round(500);
  s.clear_history();
  for (uint64_t r = 401; r <= 500; ++r) {
    coordinator::v1::RoundSummary& h = *s.add_history();
    h.set_round(r);
    h.set_model_version(r);
    h.set_evaluation_complete(true);
  }
  EXPECT_THAT(FormatProgressLine(s, 10), HasSubstr("round 500/500 [##########] 100%"));
  EXPECT_THAT(FormatProgressLogLine(s, 10), HasSubstr("round 500/500"));
  EXPECT_THAT(FormatSummary(s), HasSubstr("after 500/500 rounds"));
  EXPECT_THAT(FormatSummary(s), HasSubstr("the last 100; `shoalctl task history` has all"));
}

TEST(SummaryTest, ListsEveryRoundAndTheFinalAccuracy) {
  TaskStatus s = RunningStatus();
  s.set_state(coordinator::v1::TASK_STATE_COMPLETED);
  s.mutable_history(1)->set_evaluated(true);
  s.mutable_history(1)->set_test_accuracy(0.8612);
  const std::string summary = FormatSummary(s);
  EXPECT_THAT(summary, HasSubstr("train_loss"));
  EXPECT_THAT(summary, HasSubstr("    1  2             0      1.0000    0.7500       1.5s"));
  EXPECT_THAT(summary, HasSubstr("    2  2             1      0.5000    0.8612       3.0s"));
  EXPECT_THAT(summary, HasSubstr("completed after 2/4 rounds in 4.5s"));
  EXPECT_THAT(summary, HasSubstr("final test accuracy: 0.8612"));
}

TEST(SummaryTest, DecentralizedShowsJoinsRetriesRemovedAndOverhead) {
  TaskStatus s = RunningStatus();
  s.mutable_spec()->set_mode(common::v1::MODE_DECENTRALIZED);
  s.set_state(coordinator::v1::TASK_STATE_COMPLETED);
  auto* h = s.mutable_history(1);
  h->set_joins(3);
  h->set_leaves(1);
  h->set_connection_retries(2);
  h->add_removed("peer-2");
  h->set_overhead_ms(250);
  const std::string summary = FormatSummary(s);
  EXPECT_THAT(summary, HasSubstr("joins  leaves  retries  removed"));
  EXPECT_THAT(summary, HasSubstr("overhead"));
  EXPECT_THAT(summary, Not(HasSubstr("dropped")));
  EXPECT_THAT(summary, HasSubstr("    2  2           3       1        2        1      0.5000"));
  EXPECT_THAT(summary, HasSubstr("completed after 2/4 rounds in 4.5s"));
}

// `task history` prints the summary's table from rounds it paged through: the same header and
// rows, per mode, and the trailing lines only in the summary.
TEST(SummaryTest, IsTheRoundTableThenTheTotals) {
  for (const common::v1::Mode mode :
       {common::v1::MODE_FEDERATED_SYNC, common::v1::MODE_FEDERATED_ASYNC,
        common::v1::MODE_DECENTRALIZED}) {
    TaskStatus s = RunningStatus();
    s.mutable_spec()->set_mode(mode);
    std::string table = FormatRoundTableHeader(mode);
    for (const auto& r : s.history()) table += FormatRoundTableRow(mode, r);
    const std::string summary = FormatSummary(s);
    EXPECT_EQ(summary.substr(0, table.size()), table) << ModeName(mode);
    EXPECT_THAT(summary.substr(table.size()), HasSubstr("task fmnist \"cnn\" running after 2/4"));
    EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 3) << table;
  }
  EXPECT_EQ(FormatRoundTableHeader(common::v1::MODE_FEDERATED_ASYNC),
            "version  updates  staleness  train_loss  test_acc   duration\n");
  coordinator::v1::RoundSummary r;
  r.set_round(7);
  r.add_participants("peer-0");
  r.set_mean_staleness(1.5);
  r.set_mean_train_loss(0.25);
  r.set_duration_ms(800);
  EXPECT_EQ(FormatRoundTableRow(common::v1::MODE_FEDERATED_ASYNC, r),
            "      7  1             1.50      0.2500         -      800ms\n");
}

// A federated-sync round shows what it moved (each participant's model download and the
// updates as they travelled) and its contributors' median training time and the rest.
TEST(SummaryTest, FederatedSyncRoundsShowBytesMovedAndTrainingBesideCommunication) {
  coordinator::v1::RoundSummary r;
  r.set_round(3);
  r.add_participants("peer-0");
  r.add_participants("peer-1");
  r.set_mean_train_loss(0.5);
  r.set_duration_ms(5'000);
  r.set_model_bytes(400'000'000);
  r.set_update_bytes(20'000'000);
  for (const auto& [peer, ms, train] :
       {std::tuple{"peer-0", 4'000, 3'000}, std::tuple{"peer-1", 4'800, 3'400}}) {
    auto* t = r.add_peer_times();
    t->set_peer_id(peer);
    t->set_ms(ms);
    t->set_train_ms(train);
    t->set_update_bytes(10'000'000);
  }
  EXPECT_EQ(
      FormatRoundTableHeader(common::v1::MODE_FEDERATED_SYNC),
      "round  peers   dropped  train_loss  test_acc   duration     moved    train     comm\n");
  EXPECT_EQ(
      FormatRoundTableRow(common::v1::MODE_FEDERATED_SYNC, r),
      "    3  2             0      0.5000         -       5.0s   820.0MB     3.4s     1.4s\n");
  TaskStatus s = RunningStatus();
  s.clear_history();
  *s.add_history() = r;
  EXPECT_EQ(FormatPeerRoundTimes(s),
            "round times:   open to update accepted, each peer's median over the rounds above\n"
            "  peer-1               4.8s  (1 rounds)  train 3.4s, model and push 1.4s\n"
            "  peer-0               4.0s  (1 rounds)  train 3.0s, model and push 1.0s\n");
  YAML::Node round = YAML::Load(TaskStatusToJson(s))["history"][0];
  EXPECT_EQ(round["update_bytes"].as<uint64_t>(), 20'000'000u);
  EXPECT_EQ(round["model_bytes"].as<uint64_t>(), 400'000'000u);
  EXPECT_EQ(round["peer_train_ms"]["peer-1"].as<int>(), 3'400);
  EXPECT_EQ(round["peer_update_bytes"]["peer-0"].as<uint64_t>(), 10'000'000u);
  // Not measured (an older summary): dashes.
  coordinator::v1::RoundSummary old;
  old.set_round(1);
  EXPECT_THAT(FormatRoundTableRow(common::v1::MODE_FEDERATED_SYNC, old),
              HasSubstr("         -        -        -\n"));
}

TEST(SummaryTest, FederatedSyncShowsWhoIsAsyncAndTheLateUpdates) {
  TaskStatus s = RunningStatus();
  s.add_participants("peer-2");
  s.add_async_peers("peer-2");
  coordinator::v1::RoundSummary& r = *s.mutable_history(1);
  r.add_participants("peer-2");
  r.add_late("peer-2");
  r.clear_dropped();
  EXPECT_THAT(FormatTaskStatus(s), HasSubstr("async:         1 [peer-2] (stragglers"));
  EXPECT_THAT(FormatRoundTableRow(common::v1::MODE_FEDERATED_SYNC, r), HasSubstr("    2  2+1  "));
  YAML::Node root = YAML::Load(TaskStatusToJson(s));
  ASSERT_EQ(root["async_peers"].size(), 1u);
  EXPECT_EQ(root["async_peers"][0].as<std::string>(), "peer-2");
  ASSERT_EQ(root["history"][1]["late"].size(), 1u);
  EXPECT_EQ(root["history"][0]["late"].size(), 0u);
}

// A round the coordinator sent without its lists (RoundSummary.lists_omitted) shows its counts.
TEST(SummaryTest, ARoundWithoutItsListsShowsItsCounts) {
  coordinator::v1::RoundSummary r;
  r.set_round(4);
  r.set_lists_omitted(true);
  r.set_participant_count(10'000);
  r.set_dropped_count(3);
  r.set_late_count(12);
  r.set_mean_train_loss(0.5);
  r.set_duration_ms(2'000);
  r.set_model_bytes(1'000);
  EXPECT_EQ(
      FormatRoundTableRow(common::v1::MODE_FEDERATED_SYNC, r),
      "    4  9988+12        3      0.5000         -       2.0s    10.0MB        -        -\n");
  EXPECT_THAT(FormatRoundTableRow(common::v1::MODE_FEDERATED_ASYNC, r), HasSubstr("  10000  "));
  EXPECT_THAT(FormatRoundTableRow(common::v1::MODE_DECENTRALIZED, r), HasSubstr("  10000  "));
  TaskStatus s = RunningStatus();
  s.clear_history();
  *s.add_history() = r;
  YAML::Node round = YAML::Load(TaskStatusToJson(s))["history"][0];
  EXPECT_TRUE(round["lists_omitted"].as<bool>());
  EXPECT_EQ(round["participant_count"].as<int>(), 10'000);
  EXPECT_EQ(round["dropped_count"].as<int>(), 3);
  EXPECT_EQ(round["late_count"].as<int>(), 12);
  EXPECT_EQ(round["participants"].size(), 0u);
  // A round with its lists counts them, whatever its count fields say (an older coordinator
  // sends none).
  coordinator::v1::RoundSummary listed;
  listed.set_round(5);
  listed.add_participants("peer-0");
  listed.add_dropped("peer-1");
  *s.add_history() = listed;
  round = YAML::Load(TaskStatusToJson(s))["history"][1];
  EXPECT_FALSE(round["lists_omitted"].as<bool>());
  EXPECT_EQ(round["participant_count"].as<int>(), 1);
  EXPECT_EQ(round["dropped_count"].as<int>(), 1);
}

TEST(TaskStatusJsonTest, HierarchicalShowsTheTree) {
  TaskStatus s = RunningStatus();
  coordinator::v1::ClusterInfo* root = s.add_clusters();
  root->set_aggregator("10.0.0.1:7100");
  coordinator::v1::ClusterInfo* child = s.add_clusters();
  child->set_aggregator("10.0.0.2:7100");
  child->set_child_id("aggregator-2");
  child->set_level(1);
  child->set_parent("10.0.0.1:7100");
  child->add_peers("peer-0");
  child->add_peers("peer-1");
  child->set_host_peer("peer-7");
  child->add_backups("10.0.0.3:7100");
  const std::string text = FormatTaskStatus(s);
  EXPECT_THAT(text, HasSubstr("clusters:      2 (hierarchical"));
  EXPECT_THAT(text, HasSubstr("  level 0 10.0.0.1:7100          0 peers [] (root)\n"));
  EXPECT_THAT(text, HasSubstr("  level 1 10.0.0.2:7100          2 peers [peer-0, peer-1] below "
                              "10.0.0.1:7100, elected: peer peer-7, backups: 10.0.0.3:7100\n"));
  YAML::Node json = YAML::Load(TaskStatusToJson(s));
  ASSERT_EQ(json["clusters"].size(), 2u);
  EXPECT_EQ(json["clusters"][0]["parent"].as<std::string>(), "");
  EXPECT_EQ(json["clusters"][1]["child_id"].as<std::string>(), "aggregator-2");
  EXPECT_EQ(json["clusters"][1]["level"].as<int>(), 1);
  EXPECT_EQ(json["clusters"][1]["parent"].as<std::string>(), "10.0.0.1:7100");
  ASSERT_EQ(json["clusters"][1]["peers"].size(), 2u);
  EXPECT_EQ(json["clusters"][1]["peers"][1].as<std::string>(), "peer-1");
  EXPECT_EQ(json["clusters"][0]["host_peer"].as<std::string>(), "") << "a dedicated aggregator";
  EXPECT_EQ(json["clusters"][1]["host_peer"].as<std::string>(), "peer-7");
  ASSERT_EQ(json["clusters"][1]["backups"].size(), 1u);
  EXPECT_EQ(json["clusters"][1]["backups"][0].as<std::string>(), "10.0.0.3:7100");
  EXPECT_EQ(json["clusters"][0]["backups"].size(), 0u);
  // A flat task has none.
  EXPECT_EQ(YAML::Load(TaskStatusToJson(RunningStatus()))["clusters"].size(), 0u);
}

TEST(FormatTest, Durations) {
  EXPECT_EQ(FormatDurationMs(850), "850ms");
  EXPECT_EQ(FormatDurationMs(12'345), "12.3s");
  EXPECT_EQ(FormatDurationMs(185'000), "3m05s");
  EXPECT_EQ(FormatDurationMs(3'720'000), "1h02m");
}

TEST(FormatTest, TaskListHasAHeaderAndARowPerTask) {
  const std::string table = FormatTaskList({RunningStatus()});
  EXPECT_THAT(table, HasSubstr("NAME"));
  EXPECT_THAT(table, HasSubstr("running"));
  EXPECT_THAT(table, HasSubstr("3/4"));
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 2);
}

TEST(FormatTest, TerminalStates) {
  EXPECT_TRUE(IsTerminal(coordinator::v1::TASK_STATE_COMPLETED));
  EXPECT_TRUE(IsTerminal(coordinator::v1::TASK_STATE_STOPPED));
  EXPECT_TRUE(IsTerminal(coordinator::v1::TASK_STATE_FAILED));
  EXPECT_FALSE(IsTerminal(coordinator::v1::TASK_STATE_RUNNING));
  EXPECT_FALSE(IsTerminal(coordinator::v1::TASK_STATE_WAITING));
}

}  // namespace
}  // namespace shoal::shoalctl

namespace shoal::shoalctl {
namespace {

// privacy.dp tasks show the epsilon spent (text and JSON); others show none.
TEST(TaskStatusPrivacyTest, EpsilonShowsInTextAndJson) {
  TaskStatus s = RunningStatus();
  EXPECT_EQ(FormatPrivacyLine(s), "");
  EXPECT_TRUE(YAML::Load(TaskStatusToJson(s))["privacy"].IsNull());
  EXPECT_TRUE(YAML::Load(TaskStatusToJson(s))["history"][0]["epsilon"].IsNull());

  common::v1::DpSpec& dp = *s.mutable_spec()->mutable_privacy()->mutable_dp();
  dp.set_level(common::v1::DP_LEVEL_PEER);
  dp.set_clip_norm(0.5);
  dp.set_noise_multiplier(1.1);
  dp.set_noise(common::v1::DP_NOISE_CENTRAL);
  dp.set_delta(1e-5);
  dp.set_target_epsilon(8);
  coordinator::v1::PrivacyStatus& p = *s.mutable_privacy();
  p.set_epsilon(2.345678);
  p.set_delta(1e-5);
  p.set_rounds(3);
  p.set_sampling_rate(1);
  p.set_target_epsilon(8);
  p.set_rounds_left(7);
  s.mutable_history(0)->set_epsilon(1.25);
  EXPECT_EQ(FormatPrivacyLine(s),
            "privacy:       epsilon 2.346 at delta 1e-05 after 3 rounds (target 8: 7 more rounds "
            "fit)\n"
            "               peer-level DP: clip_norm 0.5, noise_multiplier 1.1, noise central\n");
  EXPECT_THAT(FormatTaskStatus(s), HasSubstr("privacy:       epsilon 2.346"));
  YAML::Node root = YAML::Load(TaskStatusToJson(s));
  EXPECT_DOUBLE_EQ(root["privacy"]["epsilon"].as<double>(), 2.345678);
  EXPECT_DOUBLE_EQ(root["privacy"]["delta"].as<double>(), 1e-5);
  EXPECT_EQ(root["privacy"]["rounds"].as<int>(), 3);
  EXPECT_DOUBLE_EQ(root["privacy"]["target_epsilon"].as<double>(), 8);
  EXPECT_EQ(root["privacy"]["rounds_left"].as<int>(), 7);
  EXPECT_DOUBLE_EQ(root["history"][0]["epsilon"].as<double>(), 1.25);
  EXPECT_EQ(root["spec"]["privacy"]["dp"]["noise"].as<std::string>(), "central");

  // A task its budget completed early says why in the summary.
  s.set_state(coordinator::v1::TASK_STATE_COMPLETED);
  s.set_message("privacy budget reached: ...");
  EXPECT_THAT(FormatSummary(s), HasSubstr("(privacy budget reached: ...)"));
  s.set_round(4);  // its last round: the usual message is not repeated
  s.set_message("completed 4 rounds");
  EXPECT_THAT(FormatSummary(s), Not(HasSubstr("(completed 4 rounds)")));
}

}  // namespace
}  // namespace shoal::shoalctl
