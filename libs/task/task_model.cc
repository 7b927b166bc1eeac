#include "libs/task/task_model.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "libs/common/escape.h"
#include "libs/common/file_digest.h"
#include "libs/common/status_macros.h"
#include "libs/task/field_error.h"
#include "libs/task/task_file.h"
#include "libs/training/model_names.h"  // the model constants only: no LibTorch

namespace shoal::task {

absl::Status ValidateModelFields(const common::v1::TaskSpec& spec) {
  const bool torchscript = spec.model() == training::kTorchScriptModel;
  if (!torchscript && !training::CheckModelName(spec.model()).ok()) {
    return FieldError(
        "model",
        absl::StrCat("unknown model ", QuoteBytes(spec.model()), " (expected ",
                     absl::StrJoin(training::KnownModels(), ", "), ", or {torchscript: FILE})"));
  }
  if (spec.model_width() != 0 && spec.model() != "wide-mlp") {
    return FieldError("model_width", "used only by model wide-mlp");
  }
  if (spec.model_width() != 0 && (spec.model_width() < training::kMinWideMlpWidth ||
                                  spec.model_width() > training::kMaxWideMlpWidth)) {
    return FieldError("model_width",
                      absl::StrCat("must be in ", training::kMinWideMlpWidth, "..",
                                   training::kMaxWideMlpWidth, ", got ", spec.model_width()));
  }
  if (!torchscript && spec.has_torchscript()) {
    return FieldError("torchscript", "used only by model torchscript ({torchscript: FILE})");
  }
  if (torchscript) {
    if (spec.torchscript().file().empty()) {
      return FieldError("torchscript.file", "required: the TorchScript file of the model");
    }
    if (spec.torchscript().sha256().empty()) {
      return FieldError("torchscript.sha256",
                        "required: the SHA-256 of the model file (shoalctl fills it in from the "
                        "file the task file names)");
    }
    if (!IsSha256Hex(spec.torchscript().sha256())) {
      return FieldError("torchscript.sha256",
                        absl::StrCat("expected 64 lower-case hex digits, got ",
                                     QuoteBytes(spec.torchscript().sha256())));
    }
  }
  switch (spec.loss()) {
    case common::v1::LOSS_UNSPECIFIED:  // a spec from an API client that predates `loss`
    case common::v1::LOSS_CROSS_ENTROPY:
    case common::v1::LOSS_MSE:
    case common::v1::LOSS_BCE:
      break;
    default:
      return FieldError(
          "loss",
          absl::StrCat("unsupported value ",
                       JsonQuote(FriendlyEnumName(*common::v1::Loss_descriptor(), spec.loss())),
                       " (expected cross-entropy, mse, bce)"));
  }
  return absl::OkStatus();
}

std::string ModelFilePath(const common::v1::TaskSpec& spec, const std::string& model_dir) {
  const std::filesystem::path file(spec.torchscript().file());
  if (file.is_absolute() || model_dir.empty()) return file.string();
  return (std::filesystem::path(model_dir) / file).string();
}

absl::Status ResolveModelFile(common::v1::TaskSpec& spec, const std::string& model_dir) {
  if (spec.model() != training::kTorchScriptModel || spec.torchscript().file().empty()) {
    return absl::OkStatus();
  }
  const std::string path = ModelFilePath(spec, model_dir);
  absl::StatusOr<std::string> digest = Sha256File(path);
  if (!digest.ok()) {
    if (digest.status().code() == absl::StatusCode::kNotFound &&
        !spec.torchscript().sha256().empty()) {
      return absl::OkStatus();  // the task names the file by digest; this machine lacks it
    }
    return absl::Status(digest.status().code(),
                        absl::StrCat("model.torchscript: ", digest.status().message()));
  }
  if (!spec.torchscript().sha256().empty() && spec.torchscript().sha256() != *digest) {
    return FieldError("torchscript.sha256",
                      absl::StrCat("the task gives ", EscapeBytes(spec.torchscript().sha256()),
                                   " but ", EscapeBytes(path), " has ", *digest));
  }
  spec.mutable_torchscript()->set_sha256(*digest);
  return absl::OkStatus();
}

absl::Status CheckModelFile(const common::v1::TaskSpec& spec, const std::string& path) {
  SHOAL_ASSIGN_OR_RETURN(std::string digest, Sha256File(path));
  if (digest != spec.torchscript().sha256()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model file ", EscapeBytes(path), " has SHA-256 ", digest, " but the task's model has ",
        spec.torchscript().sha256(), ": every peer needs an identical copy of the file"));
  }
  return absl::OkStatus();
}

}  // namespace shoal::task
