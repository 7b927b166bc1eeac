#include "services/aggregator/sessions/secure_exchange.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/common/status_macros.h"

namespace shoal::aggregator {

SecureExchange::SecureExchange(std::string label, uint64_t round, v1::SecureAggregationStart start,
                               std::unique_ptr<privacy::secagg::SecAggServer> server,
                               absl::Duration step_timeout,
                               std::function<void(const v1::PushAccepted&)> on_masked)
    : label_(std::move(label)),
      number_(round),
      start_(std::move(start)),
      step_timeout_(step_timeout),
      on_masked_(std::move(on_masked)),
      server_(std::move(server)) {
  const auto& ids = start_.config().participant_ids();
  owed_.insert(ids.begin(), ids.end());
}

absl::Status SecureExchange::Join(const std::string& peer, std::shared_ptr<Link> link) {
  Outbox out;
  absl::Status joined;
  {
    absl::MutexLock lock(&mu_);
    joined = JoinLocked(peer, std::move(link));
    out.swap(outbox_);
  }
  for (auto& action : out) action();
  return joined;
}

absl::Status SecureExchange::JoinLocked(const std::string& peer, std::shared_ptr<Link> link) {
  const std::string who = absl::StrCat("peer '", EscapeBytes(peer), "'");
  const auto& ids = start_.config().participant_ids();
  if (std::find(ids.begin(), ids.end(), peer) == ids.end()) {
    return absl::FailedPreconditionError(absl::StrCat(who, " is not expected in ", label_));
  }
  if (step_ == Step::kFailed) return failure_;
  if (participants_.count(peer) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, " already joined the secure aggregation of ", label_));
  }
  if (step_ != Step::kAdvertising || owed_.count(peer) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, " joined too late: the keys of ", label_, " are advertised"));
  }
  v1::SecureAggregationResponse start;
  *start.mutable_start() = start_;
  Post(link, start);
  participants_[peer].link = std::move(link);
  return absl::OkStatus();
}

absl::Status SecureExchange::Receive(const std::string& peer,
                                     v1::SecureAggregationRequest message) {
  v1::PushAccepted accepted;
  absl::Status status;
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    bool whole = false;
    status = message.has_masked() ? HandleMasked(peer, *message.mutable_masked(), whole)
                                  : Handle(peer, message);
    if (!status.ok()) {
      Drop(peer, status);
    } else if (whole) {
      const Participant& participant = participants_.at(peer);
      v1::PushAccepted& event = accepted;
      event.set_round(number_);
      event.set_peer_id(peer);
      event.set_base_version(start_.base_version());
      event.set_num_samples(participant.num_samples);
      event.set_train_ms(participant.train_ms);
      event.set_update_bytes(start_.config().vector_length() * 4);
    }
    MaybeCloseStep(absl::Now() >= step_deadline_);
    out.swap(outbox_);
  }
  for (auto& action : out) action();
  if (!accepted.peer_id().empty()) on_masked_(accepted);
  return status;
}

absl::Status SecureExchange::Admit(const std::string& peer, const std::string& who) const {
  auto it = participants_.find(peer);
  if (it == participants_.end() || it->second.left) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, " is not in the secure aggregation of ", label_));
  }
  if (step_ == Step::kFailed) return failure_;
  if (owed_.count(peer) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, " sent a message out of turn in ", label_));
  }
  return absl::OkStatus();
}

absl::Status SecureExchange::Handle(const std::string& peer,
                                    const v1::SecureAggregationRequest& message) {
  const std::string who = absl::StrCat("peer '", EscapeBytes(peer), "'");
  SHOAL_RETURN_IF_ERROR(Admit(peer, who));
  auto names = [&](const std::string& id, absl::string_view what) {
    return id == peer ? absl::OkStatus()
                      : absl::InvalidArgumentError(absl::StrCat(
                            who, "'s ", what, " names participant '", EscapeBytes(id), "'"));
  };
  absl::Status s;
  switch (message.step_case()) {
    case v1::SecureAggregationRequest::kKeys:
      if (step_ != Step::kAdvertising) break;
      s = names(message.keys().participant_id(), "advertised keys");
      if (s.ok()) s = server_->AddAdvertisedKeys(message.keys());
      return s.ok() ? (owed_.erase(peer), s) : s;
    case v1::SecureAggregationRequest::kShares:
      if (step_ != Step::kSharing) break;
      for (const privacy::v1::EncryptedShare& share : message.shares().shares()) {
        if (s = names(share.sender(), "share"); !s.ok()) return s;
      }
      s = server_->AddShares(message.shares());
      return s.ok() ? (owed_.erase(peer), s) : s;
    case v1::SecureAggregationRequest::kMasked:
      break;  // HandleMasked takes these
    case v1::SecureAggregationRequest::kConsistency:
      if (step_ != Step::kConsistency) break;
      s = names(message.consistency().participant_id(), "survivor-list signature");
      if (s.ok()) s = server_->AddSurvivorSignature(message.consistency());
      return s.ok() ? (owed_.erase(peer), s) : s;
    case v1::SecureAggregationRequest::kUnmask:
      if (step_ != Step::kUnmasking) break;
      s = names(message.unmask().participant_id(), "unmask response");
      if (s.ok()) s = server_->AddUnmaskResponse(message.unmask());
      return s.ok() ? (owed_.erase(peer), s) : s;
    case v1::SecureAggregationRequest::kJoin:
      return absl::InvalidArgumentError(absl::StrCat(who, " joined twice"));
    case v1::SecureAggregationRequest::STEP_NOT_SET:
      return absl::InvalidArgumentError(absl::StrCat(who, " sent an empty message"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(who, " sent a message of another step in ", label_));
}

absl::Status SecureExchange::HandleMasked(const std::string& peer, v1::SecureMaskedUpdate& masked,
                                          bool& whole) {
  whole = false;
  const std::string who = absl::StrCat("peer '", EscapeBytes(peer), "'");
  SHOAL_RETURN_IF_ERROR(Admit(peer, who));
  Participant& participant = participants_.at(peer);
  if (step_ != Step::kMasking) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " sent a message of another step in ", label_));
  }
  if (masked.input().participant_id() != peer) {
    return absl::InvalidArgumentError(absl::StrCat(who, "'s masked update names participant '",
                                                   EscapeBytes(masked.input().participant_id()),
                                                   "'"));
  }
  if (!participant.chunking) {  // the first message carries the update's report
    if (masked.num_samples() == 0 || !std::isfinite(masked.train_loss())) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, "'s masked update needs num_samples >= 1 and a finite train_loss"));
    }
    participant.chunking = true;
    participant.chunking_samples = masked.num_samples();
    participant.chunking_loss = masked.train_loss();
    participant.train_ms = masked.train_ms();
  }
  absl::StatusOr<bool> done =
      server_->AddMaskedChunk(peer, std::move(*masked.mutable_input()->mutable_values()));
  if (!done.ok()) return done.status();
  if (!*done) {  // more is owed: the step waits for it
    step_deadline_ = std::max(step_deadline_, absl::Now() + step_timeout_);
    return absl::OkStatus();
  }
  participant.num_samples = participant.chunking_samples;
  participant.train_loss = participant.chunking_loss;
  owed_.erase(peer);
  whole = true;
  return absl::OkStatus();
}

void SecureExchange::Leave(const std::string& peer) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    auto it = participants_.find(peer);
    if (it == participants_.end() || it->second.left) return;
    it->second.left = true;
    it->second.link = nullptr;
    owed_.erase(peer);
    server_->AbandonMaskedInput(peer);
    MaybeCloseStep(absl::Now() >= step_deadline_);
    out.swap(outbox_);
  }
  for (auto& action : out) action();
}

void SecureExchange::Post(const std::shared_ptr<Link>& link,
                          v1::SecureAggregationResponse message) {
  outbox_.push_back([link, message = std::move(message)] { link->Send(message); });
}

void SecureExchange::PostEnd(const std::shared_ptr<Link>& link, absl::Status status) {
  outbox_.push_back([link, status = std::move(status)] { link->End(status); });
}

void SecureExchange::Drop(const std::string& peer, const absl::Status& status) {
  owed_.erase(peer);
  server_->AbandonMaskedInput(peer);
  auto it = participants_.find(peer);
  if (it == participants_.end() || it->second.left) return;
  it->second.left = true;
  if (it->second.link != nullptr) PostEnd(it->second.link, status);
  it->second.link = nullptr;
}

void SecureExchange::FailProtocol(absl::Status error) {
  if (step_ == Step::kDone || step_ == Step::kFailed) return;
  step_ = Step::kFailed;
  failure_ = std::move(error);
  owed_.clear();
  for (auto& [peer, participant] : participants_) {
    if (participant.link != nullptr) PostEnd(participant.link, failure_);
    participant.link = nullptr;
    participant.left = true;
  }
}

void SecureExchange::BeginStep(Step step, std::set<std::string> owed) {
  step_ = step;
  step_deadline_ = absl::Now() + step_timeout_;
  owed_.clear();
  for (auto& [peer, participant] : participants_) {
    if (participant.left) continue;
    if (owed.count(peer) > 0) {
      owed_.insert(peer);
    } else {
      // Its message of the step that closed did not come in time: it is out of the round.
      Drop(peer, absl::FailedPreconditionError(absl::StrCat(
                     "peer '", EscapeBytes(peer), "' is out of the secure aggregation of ", label_,
                     ": its message did not come in time")));
    }
  }
}

namespace {

// Each participant's message of the next step, for those still linked.
template <typename Message, typename Set>
std::map<std::string, v1::SecureAggregationResponse> StepMessages(
    std::map<std::string, Message>& messages,
    const std::map<std::string, std::shared_ptr<SecureExchange::Link>>& links, Set set) {
  std::map<std::string, v1::SecureAggregationResponse> out;
  for (auto& [peer, message] : messages) {
    if (links.count(peer) == 0) continue;
    set(out[peer]) = std::move(message);
  }
  return out;
}

}  // namespace

void SecureExchange::MaybeCloseStep(bool force) {
  while (step_ != Step::kDone && step_ != Step::kFailed && (force || owed_.empty())) {
    force = false;
    std::map<std::string, std::shared_ptr<Link>> links;
    for (auto& [peer, participant] : participants_) {
      if (!participant.left && participant.link != nullptr) links[peer] = participant.link;
    }
    // Sends each its message of the next step; returns who got one.
    auto send = [&](std::map<std::string, v1::SecureAggregationResponse> messages) {
      std::set<std::string> sent;
      for (auto& [peer, message] : messages) {
        Post(links.at(peer), std::move(message));
        sent.insert(peer);
      }
      return sent;
    };
    switch (step_) {
      case Step::kAdvertising: {
        auto bundles = server_->CloseAdvertising();
        if (!bundles.ok()) return FailProtocol(bundles.status());
        BeginStep(
            Step::kSharing,
            send(StepMessages(*bundles, links,
                              [](v1::SecureAggregationResponse& r) -> privacy::v1::KeyBundle& {
                                return *r.mutable_key_bundle();
                              })));
        break;
      }
      case Step::kSharing: {
        auto relayed = server_->CloseSharing();
        if (!relayed.ok()) return FailProtocol(relayed.status());
        BeginStep(Step::kMasking,
                  send(StepMessages(
                      *relayed, links,
                      [](v1::SecureAggregationResponse& r) -> privacy::v1::EncryptedShares& {
                        return *r.mutable_shares();
                      })));
        break;
      }
      case Step::kMasking: {
        auto checks = server_->CloseMasking();
        if (!checks.ok()) return FailProtocol(checks.status());
        survivors_ = server_->survivors();
        BeginStep(
            Step::kConsistency,
            send(StepMessages(
                *checks, links,
                [](v1::SecureAggregationResponse& r) -> privacy::v1::ConsistencyCheckRequest& {
                  return *r.mutable_consistency();
                })));
        break;
      }
      case Step::kConsistency: {
        auto requests = server_->CloseConsistencyCheck();
        if (!requests.ok()) return FailProtocol(requests.status());
        BeginStep(
            Step::kUnmasking,
            send(StepMessages(*requests, links,
                              [](v1::SecureAggregationResponse& r) -> privacy::v1::UnmaskRequest& {
                                return *r.mutable_unmask();
                              })));
        break;
      }
      case Step::kUnmasking: {
        auto sum = server_->CloseUnmasking();
        if (!sum.ok()) return FailProtocol(sum.status());
        sum_ = std::make_shared<std::vector<uint32_t>>(*std::move(sum));
        step_ = Step::kDone;
        owed_.clear();
        v1::SecureAggregationResponse done;
        for (const std::string& id : survivors_) done.mutable_done()->add_survivors(id);
        for (auto& [peer, link] : links) {
          Post(link, done);
          PostEnd(link, absl::OkStatus());
          participants_[peer].link = nullptr;
        }
        break;
      }
      case Step::kDone:
      case Step::kFailed:
        return;
    }
  }
}

void SecureExchange::Fail(absl::Status error) {
  Outbox out;
  {
    absl::MutexLock lock(&mu_);
    FailProtocol(std::move(error));
    out.swap(outbox_);
  }
  for (auto& action : out) action();
}

absl::StatusOr<SecureExchange::Outcome> SecureExchange::RunOut() {
  absl::MutexLock lock(&mu_);
  while (step_ != Step::kDone && step_ != Step::kFailed) {
    if (step_ == Step::kAdvertising || absl::Now() >= step_deadline_) {
      MaybeCloseStep(true);
      // The next step's messages go out now, without the lock.
      Outbox out;
      out.swap(outbox_);
      mu_.Unlock();
      for (auto& action : out) action();
      mu_.Lock();
      continue;
    }
    struct Progress {
      const SecureExchange* exchange;
      Step at;
    } progress{this, step_};
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](Progress* p) { return p->exchange->step_ != p->at; }, &progress),
                          step_deadline_);
  }
  if (step_ == Step::kFailed) return failure_;
  Outcome outcome;
  outcome.sum = sum_;
  outcome.survivors = survivors_;
  for (const std::string& id : survivors_) {
    const Participant& p = participants_.at(id);
    outcome.num_samples += p.num_samples;
    outcome.loss_sum += p.train_loss * static_cast<double>(p.num_samples);
  }
  return outcome;
}

std::vector<std::string> SecureExchange::Accepted() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> peers;
  for (const auto& [peer, participant] : participants_) {
    if (participant.num_samples > 0) peers.push_back(peer);
  }
  return peers;
}

}  // namespace shoal::aggregator
