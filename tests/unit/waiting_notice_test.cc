#include "services/coordinator/modes/waiting_notice.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace shoal::coordinator {
namespace {

// The peers that `fx` sends a Waiting event to, each with the count it tells.
std::map<std::string, uint32_t> Told(const ModeEffects& fx) {
  std::map<std::string, uint32_t> told;
  for (const auto& [peer, event] : fx.events) {
    EXPECT_TRUE(event.has_waiting()) << peer;
    EXPECT_EQ(told.count(peer), 0u) << peer << " told twice in one input";
    told[peer] = event.waiting().have();
  }
  return told;
}

class WaitingNoticeTest : public ::testing::Test {
 protected:
  // `peer` joins at `now`; returns the effects of the mode's Update.
  ModeEffects Join(const std::string& peer) {
    peers_.insert(peer);
    notice_.Joined(peer);
    return Update();
  }
  ModeEffects Update() {
    ModeEffects fx;
    notice_.Update(peers_, kNeed, now_, status_, fx);
    return fx;
  }

  static constexpr uint32_t kNeed = 5000;
  WaitingNotice notice_{absl::Seconds(1)};
  std::set<std::string> peers_;
  absl::Time now_ = absl::FromUnixSeconds(1000);
  v1::TaskStatus status_;
};

TEST_F(WaitingNoticeTest, FirstJoinTellsEveryoneAndSetsTheStatus) {
  const ModeEffects fx = Join("a");
  EXPECT_EQ(Told(fx), (std::map<std::string, uint32_t>{{"a", 1}}));
  EXPECT_TRUE(fx.changed);
  EXPECT_EQ(status_.state(), v1::TASK_STATE_WAITING);
  EXPECT_EQ(status_.message(), "waiting for peers: have 1, need 5000");
}

TEST_F(WaitingNoticeTest, JoinsWithinTheIntervalTellOnlyTheJoiner) {
  Join("a");
  now_ += absl::Milliseconds(100);
  ModeEffects fx = Join("b");
  EXPECT_EQ(Told(fx), (std::map<std::string, uint32_t>{{"b", 2}}));
  EXPECT_FALSE(fx.changed) << "the status is persisted at the interval's pace";
  EXPECT_EQ(status_.message(), "waiting for peers: have 1, need 5000");

  // A tick before the interval has passed tells no one; the first one after it tells everyone.
  now_ += absl::Milliseconds(800);
  EXPECT_TRUE(Update().events.empty());
  now_ += absl::Milliseconds(100);
  fx = Update();
  EXPECT_EQ(Told(fx), (std::map<std::string, uint32_t>{{"a", 2}, {"b", 2}}));
  EXPECT_TRUE(fx.changed);
  EXPECT_EQ(status_.message(), "waiting for peers: have 2, need 5000");
  // Nothing changed since: later ticks are silent.
  now_ += absl::Seconds(5);
  EXPECT_TRUE(Update().events.empty());
}

TEST_F(WaitingNoticeTest, ALeaverIsToldNothingAndTheCountDrops) {
  Join("a");
  peers_.insert("b");
  notice_.Joined("b");
  peers_.erase("b");  // left before the mode's update
  now_ += absl::Milliseconds(10);
  EXPECT_TRUE(Update().events.empty());
  // a leaves and c joins: the count is the same, but c hears it.
  peers_.erase("a");
  now_ += absl::Seconds(1);
  EXPECT_EQ(Told(Join("c")), (std::map<std::string, uint32_t>{{"c", 1}}));
}

// The regression: 5,000 joins cost N²/2 = 12.5 million events when every join told everyone.
// Now each join tells its joiner, and everyone hears once per simulated second.
TEST_F(WaitingNoticeTest, ThousandsOfJoinsCostEventsLinearInThePeers) {
  constexpr int kPeers = 5000;
  size_t events = 0, broadcasts = 0;
  for (int i = 0; i < kPeers; ++i) {
    now_ += absl::Milliseconds(2);  // 500 joins per second: 10 s in all
    const ModeEffects fx = Join(absl::StrCat("p", i));
    events += fx.events.size();
    if (fx.changed) ++broadcasts;
  }
  now_ += absl::Seconds(1);
  const ModeEffects last = Update();
  EXPECT_EQ(Told(last).size(), size_t{kPeers});
  EXPECT_EQ(last.events[0].second.waiting().have(), uint32_t{kPeers});
  events += last.events.size();
  EXPECT_LE(broadcasts, 11u);
  // kPeers joiners, plus at most 11 broadcasts to at most kPeers peers each.
  EXPECT_LE(events, size_t{kPeers} + 12 * size_t{kPeers});
}

TEST_F(WaitingNoticeTest, ClearStartsTheNextWaitAfresh) {
  Join("a");
  notice_.Clear();
  now_ += absl::Seconds(2);
  const ModeEffects fx = Update();
  EXPECT_EQ(Told(fx), (std::map<std::string, uint32_t>{{"a", 1}}));
  EXPECT_TRUE(fx.changed);
}

}  // namespace
}  // namespace shoal::coordinator
