// shoalctl task history and ControlService.ListRounds paging, against a fake ControlService on
// 127.0.0.1:0 whose tasks hold more rounds than their status's history window.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/service/shoalctl_fixture.h"

namespace shoal::shoalctl {
namespace {

using ::testing::HasSubstr;

using HistoryTest = ControlClientTest;

TEST_F(HistoryTest, ListRoundsPagesThroughTheStoredRounds) {
  SetUpHistory(fake_, "h", 5, 2);
  fake_.SetPageCap(2);
  absl::StatusOr<RoundsPage> page = client_->ListRounds("h", 0, 1000, absl::Seconds(5));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(RoundNumbers(page->rounds), (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(page->more);
  EXPECT_DOUBLE_EQ(page->rounds[1].test_accuracy(), 0.7);
  EXPECT_EQ(page->rounds[1].participants_size(), 2);
  page = client_->ListRounds("h", 4, 1000, absl::Seconds(5));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(RoundNumbers(page->rounds), (std::vector<uint64_t>{5}));
  EXPECT_FALSE(page->more);
  page = client_->ListRounds("h", 5, 1000, absl::Seconds(5));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_TRUE(page->rounds.empty());
  EXPECT_FALSE(page->more);
  page = client_->ListRounds("h", 2, 1, absl::Seconds(5));
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(RoundNumbers(page->rounds), (std::vector<uint64_t>{3}));
  EXPECT_TRUE(page->more);
  const std::vector<FakeControlService::ListRoundsCall> calls = fake_.list_rounds_calls();
  ASSERT_EQ(calls.size(), 4u);
  EXPECT_EQ(calls[3].name, "h");
  EXPECT_EQ(calls[3].after_round, 2u);
  EXPECT_EQ(calls[3].limit, 1u);
  // gRPC rounds the deadline it sends up a little.
  EXPECT_LT(calls[3].deadline_in, std::chrono::milliseconds(5500));

  EXPECT_EQ(client_->ListRounds("ghost", 0, 10, absl::Seconds(5)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->ListRounds("h", 0, 1001, absl::Seconds(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(HistoryTest, HistoryCommandPrintsEveryRoundAcrossPages) {
  SetUpHistory(fake_, "h", 5, 2);
  fake_.SetPageCap(2);
  auto [code, out, err] = Shoalctl({"task", "history", "h", "--timeout", "7s"});
  ASSERT_EQ(code, 0) << err;
  EXPECT_EQ(
      out,
      "round  peers   dropped  train_loss  test_acc   duration     moved    train     comm\n"
      "    1  2             0      1.0000    0.6000       1.0s         -        -        -\n"
      "    2  2             0      0.5000    0.7000       1.0s         -        -        -\n"
      "    3  2             0      0.3333    0.8000       1.0s         -        -        -\n"
      "    4  2             0      0.2500    0.9000       1.0s         -        -        -\n"
      "    5  2             0      0.2000    1.0000       1.0s         -        -        -\n");
  EXPECT_EQ(err, "");
  // Pages of up to 1000 (the fake serves 2), each after the last round received, each with the
  // --timeout deadline.
  const std::vector<FakeControlService::ListRoundsCall> calls = fake_.list_rounds_calls();
  ASSERT_EQ(calls.size(), 3u);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].after_round, 2 * i);
    EXPECT_EQ(calls[i].limit, 1000u);
    EXPECT_LT(calls[i].deadline_in, std::chrono::milliseconds(7500));  // not the default 10s
    EXPECT_GT(calls[i].deadline_in, std::chrono::seconds(0));
  }
}

TEST_F(HistoryTest, HistoryCommandJsonRendersRoundsAsTaskStatusDoes) {
  const TaskStatus status = SetUpHistory(fake_, "h", 5, 2);
  fake_.SetPageCap(2);
  auto [code, out, err] = Shoalctl({"task", "history", "h", "--json"});
  ASSERT_EQ(code, 0) << err;
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  YAML::Node rounds = YAML::Load(out);
  ASSERT_TRUE(rounds.IsSequence()) << out;
  ASSERT_EQ(rounds.size(), 5u);
  for (size_t i = 0; i < rounds.size(); ++i) {
    EXPECT_EQ(rounds[i]["round"].as<uint64_t>(), i + 1);
    EXPECT_EQ(rounds[i]["participants"].size(), 2u);
  }
  EXPECT_DOUBLE_EQ(rounds[2]["test_accuracy"].as<double>(), 0.8);
  // The rounds still in the status's history read exactly as in `task status --json`.
  auto [status_code, status_out, status_err] = Shoalctl({"task", "status", "h", "--json"});
  ASSERT_EQ(status_code, 0) << status_err;
  const std::string newest =
      absl::StrCat(RoundToJson(status.history(0)), ",", RoundToJson(status.history(1)));
  EXPECT_THAT(status_out, HasSubstr(absl::StrCat("\"history\":[", newest, "]")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat(",", newest, "]\n")));
}

TEST_F(HistoryTest, HistoryCommandAfterARound) {
  SetUpHistory(fake_, "h", 5, 2);
  fake_.SetPageCap(2);
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after", "3"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(
        out,
        "round  peers   dropped  train_loss  test_acc   duration     moved    train     comm\n"
        "    4  2             0      0.2500    0.9000       1.0s         -        -        -\n"
        "    5  2             0      0.2000    1.0000       1.0s         -        -        -\n");
    ASSERT_FALSE(fake_.list_rounds_calls().empty());
    EXPECT_EQ(fake_.list_rounds_calls()[0].after_round, 3u);
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after=1", "--json"});
    ASSERT_EQ(code, 0) << err;
    YAML::Node rounds = YAML::Load(out);
    ASSERT_EQ(rounds.size(), 4u) << out;
    EXPECT_EQ(rounds[0]["round"].as<int>(), 2);
    EXPECT_EQ(rounds[3]["round"].as<int>(), 5);
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after", "5"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(
        out,
        "round  peers   dropped  train_loss  test_acc   duration     moved    train     comm\n");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after", "9", "--json"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_EQ(out, "[]\n");
  }
}

TEST_F(HistoryTest, HistoryCommandShowsTheColumnsOfTheTasksMode) {
  SetUpHistory(fake_, "async", 3, 3, common::v1::MODE_FEDERATED_ASYNC);
  SetUpHistory(fake_, "dec", 3, 3, common::v1::MODE_DECENTRALIZED);
  {
    auto [code, out, err] = Shoalctl({"task", "history", "async"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_THAT(out, HasSubstr("version  updates  staleness"));
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "dec"});
    ASSERT_EQ(code, 0) << err;
    EXPECT_THAT(out, HasSubstr("joins  leaves  retries  removed"));
    EXPECT_THAT(out, HasSubstr("overhead"));
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;
  }
}

TEST_F(HistoryTest, HistoryCommandErrors) {
  SetUpHistory(fake_, "h", 5, 2);
  {
    auto [code, out, err] = Shoalctl({"task", "history", "ghost"});
    EXPECT_EQ(code, 1);
    EXPECT_EQ(err, "shoalctl: no task named ghost\n");
    EXPECT_EQ(out, "");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "ghost", "--json"});
    EXPECT_EQ(code, 1);
    EXPECT_EQ(err, "shoalctl: no task named ghost\n");
    EXPECT_EQ(out, "");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history"});
    EXPECT_EQ(code, 2);
    EXPECT_EQ(err, "shoalctl: usage: shoalctl task history NAME [--after R] [--json]\n");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--after", "-1"});
    EXPECT_EQ(code, 2);
    EXPECT_EQ(err, "shoalctl: --after: expected a round number, got \"-1\"\n");
  }
  {
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--version", "3"});
    EXPECT_EQ(code, 2);
    EXPECT_THAT(err, HasSubstr("--version does not apply here"));
  }
  {
    auto [code, out, err] = Shoalctl({"--coordinator", "127.0.0.1:1", "task", "history", "h"});
    EXPECT_EQ(code, 1);
    EXPECT_THAT(err, HasSubstr("shoalctl: cannot reach coordinator at 127.0.0.1:1"));
  }
  {
    // A server that keeps saying "more" without rounds ends the command instead of looping.
    fake_.SetStuck(true);
    auto [code, out, err] = Shoalctl({"task", "history", "h", "--json"});
    EXPECT_EQ(code, 1);
    EXPECT_THAT(err, HasSubstr("has rounds after round 0 but lists none"));
    EXPECT_EQ(out, "");
  }
  {
    auto [code, out, err] = Shoalctl({"help"});
    EXPECT_EQ(code, 0);
    EXPECT_THAT(out, HasSubstr("task history NAME [--after R] [--json]"));
  }
}

}  // namespace
}  // namespace shoal::shoalctl
