// shoal-example-data: writes example data sets for users and tests, each split over N peers.
//
//   shoal-example-data --out DIR [--peers N] [--kind tabular|images|all] [--seed S]
//       [--fashion-mnist DIR] [--images-per-peer N] [--force]
//
// DIR/tabular/peer-K/{train,test}.csv: a synthetic machine-condition table (label-skewed
// training files, balanced test files); DIR/images/peer-K/{train,test}/<class>/<index>.png:
// Fashion-MNIST images. Each part has a README.txt. The same flags give byte-identical files.

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "libs/common/command_line.h"
#include "libs/common/log.h"
#include "libs/common/status_macros.h"
#include "services/examples/example_data_lib.h"

ABSL_FLAG(std::string, out, "", "the directory to write tabular/ and images/ into (required)");
ABSL_FLAG(int, peers, 4, "how many peers to split the data over (1..1000)");
ABSL_FLAG(std::string, kind, "all", "what to write: tabular, images or all");
ABSL_FLAG(uint64_t, seed, 7, "the seed of every random draw");
ABSL_FLAG(std::string, fashion_mnist, "/usr/share/datasets/fashion-mnist",
          "images: the directory with the four Fashion-MNIST .gz files");
ABSL_FLAG(uint64_t, images_per_peer, 600,
          "images: training images per peer (>= 10: a tenth per class); each also gets 200 test "
          "images");
ABSL_FLAG(bool, force, false, "replace an existing non-empty tabular/ or images/ under --out");

namespace {

namespace fs = std::filesystem;

constexpr int kMaxPeers = 1000;
constexpr size_t kTestImagesPerPeer = 200;

struct Plan {
  fs::path out;
  bool tabular = false;
  bool images = false;
};

absl::StatusOr<Plan> MakePlan() {
  Plan plan;
  if (absl::GetFlag(FLAGS_out).empty()) return absl::InvalidArgumentError("--out is required");
  plan.out = absl::GetFlag(FLAGS_out);
  const std::string kind = absl::GetFlag(FLAGS_kind);
  if (kind != "tabular" && kind != "images" && kind != "all") {
    return absl::InvalidArgumentError(
        absl::StrCat("--kind: expected tabular, images or all, got \"", kind, "\""));
  }
  plan.tabular = kind != "images";
  plan.images = kind != "tabular";
  const int peers = absl::GetFlag(FLAGS_peers);
  if (peers < 1 || peers > kMaxPeers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--peers: expected 1..", kMaxPeers, ", got ", peers));
  }
  if (plan.images && absl::GetFlag(FLAGS_images_per_peer) < 10) {
    return absl::InvalidArgumentError(
        absl::StrCat("--images-per-peer: expected at least 10 (one image per class), got ",
                     absl::GetFlag(FLAGS_images_per_peer)));
  }
  return plan;
}

// Refuses to overwrite a non-empty part unless --force, and with --force removes it so that no
// file of an earlier run (a peer that no longer exists) survives. Every part is checked before
// anything is removed.
absl::Status PrepareParts(const std::vector<fs::path>& parts) {
  std::error_code ec;
  std::vector<fs::path> existing;
  for (const fs::path& part : parts) {
    const fs::file_status st = fs::symlink_status(part, ec);
    if (ec && ec != std::errc::no_such_file_or_directory) {
      return absl::InternalError(absl::StrCat(part.string(), ": ", ec.message()));
    }
    if (!fs::exists(st)) continue;
    if (fs::is_directory(st) && fs::is_empty(part, ec) && !ec) continue;
    if (!absl::GetFlag(FLAGS_force)) {
      return absl::FailedPreconditionError(
          absl::StrCat(part.string(), ": exists and is not empty; pass --force to replace it"));
    }
    existing.push_back(part);
  }
  for (const fs::path& part : existing) {
    fs::remove_all(part, ec);
    if (ec)
      return absl::InternalError(absl::StrCat(part.string(), ": cannot remove: ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status Run() {
  const auto start = std::chrono::steady_clock::now();
  SHOAL_ASSIGN_OR_RETURN(const Plan plan, MakePlan());
  const int peers = absl::GetFlag(FLAGS_peers);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const fs::path fashion(absl::GetFlag(FLAGS_fashion_mnist));
  std::vector<fs::path> parts;
  if (plan.tabular) parts.push_back(plan.out / "tabular");
  if (plan.images) {
    parts.push_back(plan.out / "images");
    // Checked before --force removes anything, so a wrong path costs nothing.
    for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      std::error_code ec;
      if (!fs::is_regular_file(fashion / name, ec)) {
        return absl::NotFoundError(
            absl::StrCat((fashion / name).string(),
                         ": no such file (--fashion-mnist names the directory "
                         "of the Fashion-MNIST .gz files)"));
      }
    }
  }
  SHOAL_RETURN_IF_ERROR(PrepareParts(parts));
  const auto print = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };

  std::string summary;
  if (plan.tabular) {
    shoal::examples::TabularOptions o;
    o.dir = (plan.out / "tabular").string();
    o.peers = peers;
    o.seed = seed;
    SHOAL_RETURN_IF_ERROR(shoal::examples::WriteTabular(o, print));
    absl::StrAppend(&summary, "\n  ", o.dir, ": ", 2 * peers, " CSV files, ",
                    peers * (o.train_rows + o.test_rows), " rows (",
                    shoal::examples::kConditionClasses.size(), " classes)");
  }
  if (plan.images) {
    shoal::examples::ImagesOptions o;
    o.dir = (plan.out / "images").string();
    o.fashion_mnist = fashion.string();
    o.peers = peers;
    o.seed = seed;
    o.train_per_peer = absl::GetFlag(FLAGS_images_per_peer);
    o.test_per_peer = kTestImagesPerPeer;
    SHOAL_RETURN_IF_ERROR(shoal::examples::WriteImages(o, print));
    absl::StrAppend(&summary, "\n  ", o.dir, ": ", peers * (o.train_per_peer + o.test_per_peer),
                    " PNG files (", shoal::examples::kFashionClasses.size(), " classes)");
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  print(absl::StrFormat("wrote %d peers in %.1f s:%s", peers, seconds, summary));
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  shoal::SetLogProgramName("shoal-example-data");
  shoal::ParseCommandLineOrExit(
      argc, argv,
      {.program = "shoal-example-data",
       .usage = "--out DIR [--peers N] [--kind tabular|images|all] [--seed S] "
                "[--fashion-mnist DIR] [--images-per-peer N] [--force]",
       .summary = "Writes example data sets split over N peers: a synthetic machine-condition "
                  "table as CSV files (DIR/tabular) and Fashion-MNIST images as PNG folders "
                  "(DIR/images), each with a README.txt. The same flags give the same files."});
  const absl::Status s = Run();
  if (!s.ok()) {
    shoal::LogError(s.message());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
