// Peer-level differential privacy (DP-FedAvg, privacy.dp level peer) with many peers, in one
// process (scripts/bench-privacy --only dp-fedavg): --peers trainers of the built-in MLP, each on
// its own IID shard of Fashion-MNIST, run --rounds federated rounds. In each round every peer is
// taken with probability --sample (Poisson, as the accountant assumes), trains --local_batches
// from the global model, and its delta is clipped to --clip_norm; the round adds N(0, (σ·C)²)
// per value to the sum of the clipped deltas and divides by the expected peers (--sample x
// --peers), a fixed denominator, as the aggregator does with central noise. For each σ of
// --noise_multipliers, and for plain FedAvg (no clipping, no noise, the same peers and data):
// epsilon at --delta from Shoal's RDP accountant after each evaluated round, and the global
// model's accuracy on the test set. The same code paths as the services: ClipToNorm,
// GaussianNoise, RdpAccountant, Trainer.

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "libs/privacy/dp_update.h"
#include "libs/privacy/rdp_accountant.h"
#include "libs/training/trainer.h"

ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist", "Fashion-MNIST's files");
ABSL_FLAG(int, peers, 100, "peers, each with an IID shard of the training set");
ABSL_FLAG(int, rounds, 50, "federated rounds");
ABSL_FLAG(double, sample, 1.0, "probability that a peer takes part in a round (Poisson)");
ABSL_FLAG(int, local_batches, 5, "batches each peer trains a round");
ABSL_FLAG(int, batch_size, 32, "samples per local batch");
ABSL_FLAG(double, learning_rate, 0.1, "the peers' SGD learning rate");
ABSL_FLAG(double, clip_norm, 0.5, "C: each delta's L2 norm bound");
ABSL_FLAG(std::string, noise_multipliers, "0.5,1,2", "the σ values to run, comma-separated");
ABSL_FLAG(double, delta, 1e-5, "the δ epsilon is reported at");
ABSL_FLAG(int, eval_every, 10, "evaluate the global model every this many rounds (and the last)");
ABSL_FLAG(int, test_limit, 2000, "test samples the global model is evaluated on");

namespace shoal::training {
namespace {

TrainerOptions PeerOptions(uint32_t index, uint32_t count) {
  TrainerOptions o;
  o.spec.set_name("dp-fedavg-bench");
  o.spec.set_model("mlp");
  o.spec.set_batch_size(static_cast<uint32_t>(absl::GetFlag(FLAGS_batch_size)));
  o.spec.set_seed(1);
  o.spec.mutable_optimizer()->set_kind(common::v1::OPTIMIZER_SGD);
  o.spec.mutable_optimizer()->set_learning_rate(absl::GetFlag(FLAGS_learning_rate));
  o.spec.mutable_dataset()->set_partition(common::v1::PARTITION_IID);
  o.spec.mutable_dataset()->set_test_limit(static_cast<uint32_t>(absl::GetFlag(FLAGS_test_limit)));
  o.shard = ShardSpec{index, count};
  return o;
}

// One configuration: sigma < 0 is plain FedAvg (no clipping, no noise). Prints a line per
// evaluated round. False on failure (printed).
bool RunConfig(double sigma, std::vector<std::unique_ptr<Trainer>>& peers, Trainer& evaluator) {
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const double q = absl::GetFlag(FLAGS_sample);
  const double clip = absl::GetFlag(FLAGS_clip_norm);
  const double expected = q * static_cast<double>(peers.size());
  const bool dp = sigma >= 0;
  absl::StatusOr<tensor::FlatModel> global = evaluator.InitialParameters();
  absl::StatusOr<privacy::GaussianNoise> noise = privacy::GaussianNoise::FromSystemEntropy();
  absl::StatusOr<privacy::RdpAccountant> accountant = privacy::RdpAccountant::Create();
  if (!global.ok() || !noise.ok() || !accountant.ok()) {
    std::fprintf(stderr, "dp_fedavg_bench: cannot set up a configuration\n");
    return false;
  }
  std::mt19937_64 pick(7);  // which peers take part: the same draws in every configuration
  std::bernoulli_distribution takes_part(q);
  const absl::Time start = absl::Now();
  for (int round = 1; round <= rounds; ++round) {
    std::vector<double> sum(global->values.size(), 0.0);
    size_t taking_part = 0;
    for (std::unique_ptr<Trainer>& peer : peers) {
      if (!takes_part(pick)) continue;
      ++taking_part;
      absl::StatusOr<tensor::FlatModel> local;
      absl::Status s = peer->SetParameters(*global);
      if (s.ok()) s = peer->TrainBatches(absl::GetFlag(FLAGS_local_batches), nullptr).status();
      if (s.ok()) local = peer->GetParameters();
      if (!s.ok() || !local.ok()) {
        std::fprintf(stderr, "dp_fedavg_bench: %s\n",
                     (s.ok() ? local.status() : s).ToString().c_str());
        return false;
      }
      std::vector<float> delta(local->values.size());
      for (size_t i = 0; i < delta.size(); ++i) delta[i] = local->values[i] - global->values[i];
      if (dp) privacy::ClipToNorm(absl::MakeSpan(delta), clip);
      for (size_t i = 0; i < delta.size(); ++i) sum[i] += delta[i];
    }
    std::vector<float> mean(sum.begin(), sum.end());
    if (dp) {
      noise->Add(absl::MakeSpan(mean), sigma * clip);
      for (float& v : mean) v = static_cast<float>(v / expected);
      if (!accountant->AddSteps(q, sigma, 1).ok()) return false;
    } else if (taking_part > 0) {
      for (float& v : mean) v /= static_cast<float>(taking_part);
    }
    for (size_t i = 0; i < mean.size(); ++i) global->values[i] += mean[i];
    if (round % absl::GetFlag(FLAGS_eval_every) != 0 && round != rounds) continue;
    absl::StatusOr<EvalStats> eval;
    if (absl::Status s = evaluator.SetParameters(*global); s.ok()) eval = evaluator.Evaluate();
    if (!eval.ok()) {
      std::fprintf(stderr, "dp_fedavg_bench: evaluating: %s\n", eval.status().ToString().c_str());
      return false;
    }
    std::string epsilon = "inf";
    if (!dp) {
      epsilon = "-";
    } else if (sigma > 0) {
      absl::StatusOr<privacy::PrivacySpent> spent = accountant->Spent(absl::GetFlag(FLAGS_delta));
      if (spent.ok()) epsilon = absl::StrFormat("%.3f", spent->epsilon);
    }
    std::printf("%-12s %6d %10s %9.4f %9.1f\n",
                dp ? absl::StrFormat("sigma %g", sigma).c_str() : "plain FedAvg", round,
                epsilon.c_str(), eval->accuracy(), absl::ToDoubleSeconds(absl::Now() - start));
    std::fflush(stdout);
  }
  return true;
}

int Run() {
  if (!SetTorchThreads(1).ok()) return 1;
  const int n = absl::GetFlag(FLAGS_peers);
  std::vector<double> sigmas;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_noise_multipliers), ',', absl::SkipEmpty())) {
    double sigma = 0;
    if (!absl::SimpleAtod(part, &sigma) || sigma < 0) {
      std::fprintf(stderr, "dp_fedavg_bench: --noise_multipliers: not a value >= 0: '%s'\n",
                   std::string(part).c_str());
      return 2;
    }
    sigmas.push_back(sigma);
  }
  if (n < 1 || absl::GetFlag(FLAGS_rounds) < 1 || absl::GetFlag(FLAGS_eval_every) < 1 ||
      !(absl::GetFlag(FLAGS_sample) > 0 && absl::GetFlag(FLAGS_sample) <= 1)) {
    std::fprintf(stderr,
                 "dp_fedavg_bench: --peers, --rounds and --eval_every must be >= 1 and "
                 "--sample in (0, 1]\n");
    return 2;
  }
  auto train = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), Split::kTrain, 0);
  auto test = LoadFashionMnist(absl::GetFlag(FLAGS_data_dir), Split::kTest, 0);
  if (!train.ok() || !test.ok()) {
    std::fprintf(stderr, "dp_fedavg_bench: %s\n",
                 (train.ok() ? test.status() : train.status()).ToString().c_str());
    return 1;
  }
  std::vector<std::unique_ptr<Trainer>> peers;
  for (int i = 0; i < n; ++i) {
    auto peer = Trainer::Create(PeerOptions(static_cast<uint32_t>(i), static_cast<uint32_t>(n)),
                                *train, *test);
    if (!peer.ok()) {
      std::fprintf(stderr, "dp_fedavg_bench: peer %d: %s\n", i, peer.status().ToString().c_str());
      return 1;
    }
    peers.push_back(*std::move(peer));
  }
  auto evaluator = Trainer::Create(PeerOptions(0, 1), *train, *test);
  if (!evaluator.ok()) {
    std::fprintf(stderr, "dp_fedavg_bench: %s\n", evaluator.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "DP-FedAvg: %d peers (IID shards of Fashion-MNIST's %zu training samples), the MLP, %d "
      "rounds, each peer taking part with probability %g, %d local batches of %d at learning "
      "rate %g; clip norm %g, central noise, delta %g; accuracy on %d test samples; 1 LibTorch "
      "thread\n",
      n, train->count, absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_sample),
      absl::GetFlag(FLAGS_local_batches), absl::GetFlag(FLAGS_batch_size),
      absl::GetFlag(FLAGS_learning_rate), absl::GetFlag(FLAGS_clip_norm),
      absl::GetFlag(FLAGS_delta), absl::GetFlag(FLAGS_test_limit));
  std::printf("%-12s %6s %10s %9s %9s\n", "config", "round", "epsilon", "accuracy", "seconds");
  if (!RunConfig(-1, peers, **evaluator)) return 1;
  for (double sigma : sigmas) {
    if (!RunConfig(sigma, peers, **evaluator)) return 1;
  }
  return 0;
}

}  // namespace
}  // namespace shoal::training

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return shoal::training::Run();
}
