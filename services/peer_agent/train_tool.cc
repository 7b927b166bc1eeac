// shoal-train: single-process helpers for scripts/bench-gossip (not a service).
//
//   shoal-train train --task-file F --data-dir D --samples N [--model-out FILE]
//       Centralized baseline: trains the task's model on the whole training set (train_limit
//       applies, no partition) for N samples (N / batch_size batches) and evaluates it on the
//       whole test set. Prints one JSON line.
//   shoal-train eval --task-file F --data-dir D MODEL_FILE...
//       Evaluates each model file and their element-wise average on the whole test set, and
//       computes the consensus distance sqrt(mean_i ||x_i - x̄||²). Prints one JSON line.
//   shoal-train export --task-file F [--model-dir D] --model MODEL_FILE --out FILE.pt
//       Writes a Shoal model file of a TorchScript task (e.g. from `shoalctl model get`) as a
//       TorchScript file: the task's file with the trained parameters, for torch.jit.load.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "libs/common/command_line.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "libs/gossip/interpolation.h"
#include "libs/task/task_file.h"
#include "libs/tensor/model_file.h"
#include "libs/training/trainer.h"

ABSL_FLAG(std::string, task_file, "", "the task file (model, data, optimizer, seed)");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "directory with the Fashion-MNIST .gz files");
ABSL_FLAG(uint64_t, samples, 0, "train: samples to train (rounded down to whole batches)");
ABSL_FLAG(std::string, model_out, "", "train: write the trained model here");
ABSL_FLAG(int, torch_threads, 1, "LibTorch intra-op threads");
ABSL_FLAG(std::string, device, "cpu", "train, eval: cpu or cuda");
ABSL_FLAG(uint32_t, curve_every, 0,
          "train: also report the mean loss of every N batches (the loss curve; 0 = off)");
ABSL_FLAG(std::string, model_dir, "",
          "where a TorchScript task's relative model file is (default: the task file's "
          "directory)");
ABSL_FLAG(std::string, model, "", "export: the Shoal model file to write as TorchScript");
ABSL_FLAG(std::string, out, "", "export: the TorchScript file to write");

namespace {

using shoal::task::JsonNumber;

std::string ModelDir() {
  if (!absl::GetFlag(FLAGS_model_dir).empty()) return absl::GetFlag(FLAGS_model_dir);
  return std::filesystem::path(absl::GetFlag(FLAGS_task_file)).parent_path().string();
}

absl::StatusOr<std::unique_ptr<shoal::training::Trainer>> MakeTrainer() {
  SHOAL_ASSIGN_OR_RETURN(shoal::common::v1::TaskSpec spec,
                         shoal::task::LoadTaskFile(absl::GetFlag(FLAGS_task_file)));
  // The whole training set (one shard), the whole test set.
  spec.mutable_dataset()->set_partition(shoal::common::v1::PARTITION_IID);
  shoal::training::TrainerOptions o;
  o.spec = spec;
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.shard = {0, 1};
  o.holds_all_data = true;  // its statistics are the federation's (normalization standardize)
  o.model_dir = ModelDir();
  o.device = absl::GetFlag(FLAGS_device);
  return shoal::training::Trainer::Create(o);
}

absl::Status Export() {
  if (absl::GetFlag(FLAGS_model).empty()) return absl::InvalidArgumentError("--model is required");
  if (absl::GetFlag(FLAGS_out).empty()) return absl::InvalidArgumentError("--out is required");
  SHOAL_ASSIGN_OR_RETURN(shoal::common::v1::TaskSpec spec,
                         shoal::task::LoadTaskFile(absl::GetFlag(FLAGS_task_file)));
  SHOAL_ASSIGN_OR_RETURN(shoal::tensor::FlatModel model,
                         shoal::tensor::ReadModelFile(absl::GetFlag(FLAGS_model)));
  SHOAL_RETURN_IF_ERROR(
      shoal::training::WriteTorchScript(spec, ModelDir(), model, absl::GetFlag(FLAGS_out)));
  std::printf("wrote %s (TorchScript, %zu parameters)\n", absl::GetFlag(FLAGS_out).c_str(),
              model.layout.total_elements());
  return absl::OkStatus();
}

absl::Status Train() {
  SHOAL_ASSIGN_OR_RETURN(auto trainer, MakeTrainer());
  SHOAL_ASSIGN_OR_RETURN(shoal::common::v1::TaskSpec spec,
                         shoal::task::LoadTaskFile(absl::GetFlag(FLAGS_task_file)));
  const uint64_t batches = absl::GetFlag(FLAGS_samples) / spec.batch_size();
  if (batches == 0) return absl::InvalidArgumentError("--samples: less than one batch");
  const uint32_t every = absl::GetFlag(FLAGS_curve_every) > 0 ? absl::GetFlag(FLAGS_curve_every)
                                                              : static_cast<uint32_t>(batches);
  std::vector<std::string> curve;
  shoal::training::TrainStats stats;
  double loss_sum = 0;
  const absl::Time start = absl::Now();
  for (uint64_t done = 0; done < batches;) {
    const auto n = static_cast<uint32_t>(std::min<uint64_t>(every, batches - done));
    SHOAL_ASSIGN_OR_RETURN(shoal::training::TrainStats part, trainer->TrainBatches(n, nullptr));
    curve.push_back(JsonNumber(part.mean_loss));
    loss_sum += part.mean_loss * part.batches;
    stats.samples += part.samples;
    stats.batches += part.batches;
    done += n;
  }
  stats.mean_loss = stats.batches == 0 ? 0 : loss_sum / stats.batches;
  const double train_s = absl::ToDoubleSeconds(absl::Now() - start);
  SHOAL_ASSIGN_OR_RETURN(shoal::training::EvalStats eval, trainer->Evaluate());
  if (!absl::GetFlag(FLAGS_model_out).empty()) {
    // The state: the parameters and the float buffers (batch-norm statistics), as peers send it.
    SHOAL_ASSIGN_OR_RETURN(shoal::tensor::FlatModel model,
                           trainer->GetState(/*include_buffers=*/true));
    SHOAL_RETURN_IF_ERROR(shoal::tensor::WriteModelFile(absl::GetFlag(FLAGS_model_out), model));
  }
  std::printf(
      "{\"samples\": %llu, \"train_loss\": %s, \"accuracy\": %s, \"test_loss\": %s, "
      "\"test_samples\": %llu, \"wall_seconds\": %s, \"step_ms\": %s, \"device\": \"%s\", "
      "\"curve\": [%s]}\n",
      static_cast<unsigned long long>(stats.samples), JsonNumber(stats.mean_loss).c_str(),
      JsonNumber(eval.accuracy()).c_str(),
      JsonNumber(eval.loss_sum / static_cast<double>(eval.total)).c_str(),
      static_cast<unsigned long long>(eval.total), JsonNumber(train_s).c_str(),
      JsonNumber(stats.batches == 0 ? 0 : 1000 * train_s / stats.batches).c_str(),
      absl::GetFlag(FLAGS_device).c_str(), absl::StrJoin(curve, ", ").c_str());
  return absl::OkStatus();
}

absl::Status Eval(const std::vector<std::string>& files) {
  if (files.empty()) return absl::InvalidArgumentError("eval: no model files given");
  SHOAL_ASSIGN_OR_RETURN(auto trainer, MakeTrainer());
  std::vector<shoal::tensor::FlatModel> models;
  std::vector<std::string> accuracies;
  for (const std::string& f : files) {
    SHOAL_ASSIGN_OR_RETURN(shoal::tensor::FlatModel m, shoal::tensor::ReadModelFile(f));
    SHOAL_RETURN_IF_ERROR(trainer->SetState(m));
    SHOAL_ASSIGN_OR_RETURN(shoal::training::EvalStats e, trainer->Evaluate());
    accuracies.push_back(JsonNumber(e.accuracy()));
    models.push_back(std::move(m));
  }
  std::vector<absl::Span<const float>> spans;
  for (const auto& m : models) spans.emplace_back(m.values);
  SHOAL_ASSIGN_OR_RETURN(std::vector<float> mean, shoal::gossip::MeanModel(spans));
  SHOAL_ASSIGN_OR_RETURN(double consensus, shoal::gossip::ConsensusDistance(spans));
  shoal::tensor::FlatModel avg{models[0].layout, std::move(mean)};
  SHOAL_RETURN_IF_ERROR(trainer->SetState(avg));
  SHOAL_ASSIGN_OR_RETURN(shoal::training::EvalStats e, trainer->Evaluate());
  std::printf(
      "{\"accuracies\": [%s], \"averaged_accuracy\": %s, \"consensus_distance\": %s, "
      "\"test_samples\": %llu}\n",
      absl::StrJoin(accuracies, ", ").c_str(), JsonNumber(e.accuracy()).c_str(),
      JsonNumber(consensus).c_str(), static_cast<unsigned long long>(e.total));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  shoal::SetLogProgramName("shoal-train");
  // args[0] stays the program, as the code below expects.
  std::vector<std::string> args = {argv[0]};
  for (std::string& a : shoal::ParseCommandLineOrExit(
           argc, argv,
           {.program = "shoal-train",
           .usage = "train --task-file F [--data-dir D] --samples N [--model-out FILE] "
                    "[--device cpu|cuda] [--curve-every N]\n"
                    "eval --task-file F [--data-dir D] MODEL_FILE...\n"
                    "export --task-file F [--model-dir D] --model MODEL_FILE --out FILE.pt",
           .summary = "Single-process helpers for scripts/bench-gossip: a centralized training "
                      "baseline, evaluation and averaging of model files, and the TorchScript "
                      "export of a TorchScript task's trained model.",
           .allow_positional = true})) {
    args.push_back(std::move(a));
  }
  absl::Status s;
  if (absl::GetFlag(FLAGS_task_file).empty()) {
    s = absl::InvalidArgumentError("--task-file is required");
  } else if (absl::Status t = shoal::training::SetTorchThreads(absl::GetFlag(FLAGS_torch_threads));
             !t.ok()) {
    s = t;
  } else if (args.size() >= 2 && args[1] == "train") {
    s = Train();
  } else if (args.size() >= 2 && args[1] == "eval") {
    s = Eval(std::vector<std::string>(args.begin() + 2, args.end()));
  } else if (args.size() == 2 && args[1] == "export") {
    s = Export();
  } else {
    s = absl::InvalidArgumentError("expected a command: train, eval or export");
  }
  if (!s.ok()) {
    shoal::LogError(s.message());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
