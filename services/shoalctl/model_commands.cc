// shoalctl model get: download a task's global model as a Shoal model file, or as the task's
// TorchScript file with the trained weights (written by shoal-train export, which links
// LibTorch so that shoalctl does not have to).

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"
#include "libs/task/task_file.h"
#include "libs/task/task_model.h"
#include "libs/tensor/model_file.h"
#include "libs/training/model_names.h"  // the model constants only: no LibTorch
#include "services/shoalctl/dispatcher.h"
#include "services/shoalctl/process.h"

namespace shoal::shoalctl::internal {
namespace {

// Removes the temporary files of an export on every path.
struct TempFiles {
  std::vector<std::string> paths;
  ~TempFiles() {
    for (const std::string& p : paths) std::remove(p.c_str());
  }
};

}  // namespace

int Shoalctl::ModelGet() {
  const std::string usage =
      "shoalctl model get NAME --out FILE|- [--version V] [--format shoal|torchscript] "
      "[--model-dir DIR]";
  if (absl::Status s = CheckArgs(args_, 2, 1, {"out", "version", "format", "model-dir"}, usage);
      !s.ok()) {
    return UsageFail(s);
  }
  const std::string& name = args_.positional[2];
  auto out = args_.values.find("out");
  if (out == args_.values.end() || out->second.empty()) {
    return Fail(env_, absl::StrCat("--out FILE is required; usage: ", usage), 2);
  }
  std::optional<uint64_t> version;
  if (auto v = args_.values.find("version"); v != args_.values.end()) {
    uint64_t parsed = 0;
    if (!absl::SimpleAtoi(v->second, &parsed)) {
      return Fail(
          env_, absl::StrCat("--version: expected a model version number, got \"", v->second, "\""),
          2);
    }
    version = parsed;
  }
  const std::string format = args_.values.count("format") > 0 ? args_.values["format"] : "shoal";
  if (format != "shoal" && format != "torchscript") {
    return Fail(
        env_,
        absl::StrCat("--format: expected shoal or torchscript, got \"", EscapeBytes(format), "\""),
        2);
  }
  const bool torchscript = format == "torchscript";
  const bool to_stdout = out->second == "-";
  if (torchscript && to_stdout) {
    return Fail(env_, "--format torchscript writes a file: give --out FILE", 2);
  }
  if (!torchscript && args_.values.count("model-dir") > 0) {
    return Fail(env_, "--model-dir is used only with --format torchscript", 2);
  }
  auto client = Client(g_.coordinator);
  if (!client.ok()) return UsageFail(client.status());

  // A TorchScript export needs the task's file: check that this machine has the right one
  // before downloading anything.
  common::v1::TaskSpec spec;
  std::string export_tool;
  if (torchscript) {
    absl::StatusOr<coordinator::v1::TaskStatus> status = (*client)->GetTaskStatus(name, g_.timeout);
    if (!status.ok()) return RpcFail(status.status(), name);
    spec = status->spec();
    if (spec.model() != training::kTorchScriptModel) {
      return Fail(env_, absl::StrCat("task ", name, "'s model is ", spec.model(),
                                     ", a built-in model with no TorchScript form; --format "
                                     "torchscript needs a task with model {torchscript: FILE}"));
    }
    const std::string dir =
        args_.values.count("model-dir") > 0 ? args_.values["model-dir"] : std::string(".");
    std::error_code ec;
    const std::string path =
        std::filesystem::absolute(task::ModelFilePath(spec, dir), ec).lexically_normal().string();
    if (absl::Status s = task::CheckModelFile(spec, path); !s.ok()) {
      return Fail(env_, absl::StrCat(s.message(),
                                     " (--model-dir names where the task's model "
                                     "file is)"));
    }
    spec.mutable_torchscript()->set_file(path);
    absl::StatusOr<std::string> bin = process::SelfExecutableDir();
    if (!bin.ok()) return Fail(env_, std::string(bin.status().message()));
    export_tool = *bin + "/shoal-train";
  }

  if (env_.interrupt != nullptr) env_.interrupt->graceful = true;
  // A model can be large: unless --timeout was given, allow two minutes for the download.
  const absl::Duration timeout = g_.timeout_given ? g_.timeout : absl::Minutes(2);
  Canceller* canceller = env_.interrupt != nullptr ? &env_.interrupt->canceller : nullptr;
  // A file is written as the model arrives (no buffer the size of the model here); stdout gets
  // the model once it is all in (the file's header leads with the values' digest).
  TempFiles temps;
  const std::string model_tmp = out->second + ".shoal-model.part";
  const std::string task_tmp = out->second + ".task.json.part";
  const std::string log_tmp = out->second + ".export.log.part";
  if (torchscript) temps.paths = {model_tmp, task_tmp, log_tmp};
  absl::StatusOr<DownloadedModel> model =
      to_stdout ? (*client)->GetModel(name, version, timeout, canceller)
                : (*client)->GetModelFile(name, version, torchscript ? model_tmp : out->second,
                                          timeout, canceller);
  if (!model.ok()) {
    if (model.status().code() == absl::StatusCode::kCancelled) return 130;
    if (model.status().code() == absl::StatusCode::kNotFound) {
      return Fail(env_, std::string(model.status().message()));
    }
    return Fail(env_, DescribeRpcError(model.status(), g_.coordinator, name, timeout));
  }
  const std::string what = absl::StrCat(name, " version ", model->meta.version(), " (",
                                        model->model.layout.num_tensors(), " tensors, ",
                                        model->model.layout.total_elements(), " parameters");
  if (!torchscript) {
    // `--out -`: the model file goes to stdout (e.g. out of a container), the note to stderr.
    if (to_stdout) {
      if (absl::Status s = tensor::WriteModel(env_.out_fd, model->model, "stdout"); !s.ok()) {
        return Fail(env_, std::string(s.message()));
      }
    }
    *(to_stdout ? env_.err : env_.out)
        << "wrote " << what << ", " << model->model.layout.total_bytes() << " bytes) to "
        << (to_stdout ? "stdout" : out->second) << "\n";
    return 0;
  }

  if (FILE* f = std::fopen(task_tmp.c_str(), "w"); f != nullptr) {
    const std::string json = task::MessageToFriendlyJson(spec, 2);
    const bool ok = std::fwrite(json.data(), 1, json.size(), f) == json.size();
    if (std::fclose(f) != 0 || !ok) return Fail(env_, absl::StrCat("cannot write ", task_tmp));
  } else {
    return Fail(env_, absl::StrCat("cannot write ", task_tmp));
  }
  process::ProcessOptions options;
  options.name = "shoal-train export";
  options.binary = export_tool;
  options.args = {"export", "--task-file", task_tmp, "--model", model_tmp, "--out", out->second};
  options.log_path = log_tmp;
  absl::StatusOr<std::unique_ptr<process::Process>> tool = process::Process::Start(options);
  if (!tool.ok()) {
    return Fail(env_, absl::StrCat("--format torchscript needs shoal-train beside shoalctl: ",
                                   tool.status().message()));
  }
  absl::StatusOr<process::ExitStatus> exit = (*tool)->Wait(absl::Minutes(10));
  if (!exit.ok() || !exit->success()) {
    return Fail(
        env_, absl::StrCat("writing the TorchScript file failed (",
                           exit.ok() ? exit->ToString() : "timed out", "): ", (*tool)->LogTail(5)));
  }
  *env_.out << "wrote " << what << ") to " << out->second << " as TorchScript (the task's "
            << spec.torchscript().file() << " with the trained weights)\n";
  return 0;
}

}  // namespace shoal::shoalctl::internal
