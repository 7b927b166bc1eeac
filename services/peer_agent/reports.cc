#include "services/peer_agent/reports.h"

#include <string>

namespace shoal::peer {

coordinator::v1::PeerMessage MakeEvalReport(uint64_t version, const training::EvalStats& eval) {
  coordinator::v1::PeerMessage m;
  coordinator::v1::EvalReport& r = *m.mutable_eval_report();
  r.set_version(version);
  r.set_correct(eval.correct);
  r.set_total(eval.total);
  r.set_loss_sum(eval.loss_sum);
  return m;
}

coordinator::v1::PeerMessage MakePeerError(uint64_t round, const absl::Status& status) {
  coordinator::v1::PeerMessage m;
  m.mutable_error()->set_round(round);
  m.mutable_error()->set_message(std::string(status.message()));
  return m;
}

}  // namespace shoal::peer
