#include "services/examples/example_data_lib.h"

#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "libs/common/status_macros.h"
#include "libs/data/idx_dataset.h"

namespace shoal::examples {
namespace {

namespace fs = std::filesystem;

constexpr size_t kPixels = 28 * 28;  // a Fashion-MNIST image

// SplitMix64's finaliser: spreads (seed, stream) over the engine's seed space, so nearby seeds
// and streams give unrelated sequences.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

absl::Status WriteError(const fs::path& path, const std::string& why) {
  return absl::InternalError(absl::StrCat(path.string(), ": cannot write: ", why));
}

absl::Status MakeDirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return WriteError(dir, ec.message());
  return absl::OkStatus();
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return WriteError(path, "write failed");
  return absl::OkStatus();
}

// %.6g keeps about a micro-unit of every feature's scale (vibration in 1e-3 g, pressure in
// hPa), which is finer than the noise in each.
std::string Number(double v) { return absl::StrFormat("%.6g", v); }

// Written from the constants DrawConditionRow uses, so the two cannot drift apart silently.
std::string TabularReadme(const TabularOptions& o) {
  std::string peers;
  for (int k = 0; k < o.peers; ++k) {
    absl::StrAppend(&peers, "  peer-", k, ": mostly ", kConditionClasses[k % 4], " and ",
                    kConditionClasses[(k + 1) % 4], "\n");
  }
  return absl::StrCat(
      "Machine condition: a synthetic classification table (shoal-example-data --seed ", o.seed,
      ").\n\n"
      "Each row is one reading of a rotating machine; the task is to predict its condition.\n\n"
      "Files: peer-K/train.csv (",
      o.train_rows, " rows) and peer-K/test.csv (", o.test_rows, " rows) for K = 0..", o.peers - 1,
      ".\n\n"
      "Columns (comma-separated, one header row, nothing quoted):\n"
      "  id           row number, unique across all files: NOT a feature, leave it out\n"
      "  temperature  bearing temperature, deg C (22 +- 4, about 12..37)\n"
      "  pressure     ambient pressure, hPa (1013 +- 10; carries no signal)\n"
      "  vibration    vibration RMS, g (0.0001..0.01)\n"
      "  rpm          shaft speed, revolutions per minute (about 1400..4600)\n"
      "  current      motor current, A (about 4..16)\n"
      "  humidity     relative humidity, % (5..95; carries no signal)\n"
      "  noise_db     sound level, dB (about 55..75)\n"
      "  oil_hours    hours since the last oil change (0..5500)\n"
      "  condition    the label: normal, worn, overheating, misaligned\n\n"
      "How the classes differ (a load in [0, 1) drives rpm, temperature, current and noise):\n"
      "  worn         higher vibration regardless of speed, louder, old oil (2500..5500 h)\n"
      "  overheating  hotter than the load explains (the excess grows with load), more current\n"
      "  misaligned   vibration that grows with the square of the load: at low speed it looks\n"
      "               normal, at high speed like wear (but with fresh oil)\n"
      "So the class depends on combinations of features, and the features' scales differ by\n"
      "six orders of magnitude (vibration vs. rpm): standardize them (x - mean) / std before\n"
      "training, or the large columns drown the small ones.\n\n"
      "Splits: the training files are label-skewed (non-IID), the test files are not:\n",
      peers,
      "  every train.csv: its two classes 40% each, the other two 10% each\n"
      "  every test.csv:  all four classes equally, drawn from the same distribution\n\n"
      "A task's dataset section for these files (paths relative to a peer's --data-dir, which\n"
      "would be this directory's peer-K):\n"
      "  dataset:\n"
      "    name: machine-condition\n"
      "    format: csv\n"
      "    train: train.csv\n"
      "    test: test.csv\n"
      "    label_column: condition\n"
      "    feature_columns: [",
      absl::StrJoin(kConditionFeatures, ", "),
      "]\n"
      "    classes: [",
      absl::StrJoin(kConditionClasses, ", "),
      "]\n"
      "    normalization: standardize\n");
}

std::string ImagesReadme(const ImagesOptions& o) {
  return absl::StrCat(
      "Fashion-MNIST as PNG folders (shoal-example-data --seed ", o.seed,
      "), one set per peer.\n\n"
      "Source: Fashion-MNIST by Zalando Research (MIT licence), read from ",
      o.fashion_mnist,
      ".\n"
      "Images: 28x28 grayscale PNG, the original pixels unchanged.\n\n"
      "Layout, for K = 0..",
      o.peers - 1,
      ":\n"
      "  peer-K/train/<class>/<index>.png   ",
      o.train_per_peer,
      " images from the training set\n"
      "  peer-K/test/<class>/<index>.png    ",
      o.test_per_peer,
      " images from the test set (t10k)\n"
      "<index> is the image's position in its source file (zero-padded to 5 digits). The peers'\n"
      "slices are disjoint and IID: each class gets a tenth of a peer's images (a remainder goes\n"
      "to the first classes), drawn at random with the seed.\n\n"
      "Classes, in label order (the directory names):\n  ",
      absl::StrJoin(kFashionClasses, ", "),
      "\n\n"
      "A task's dataset section for these folders (paths relative to a peer's --data-dir, which\n"
      "would be this directory's peer-K):\n"
      "  dataset:\n"
      "    name: fashion-mnist-png\n"
      "    format: image-folder\n"
      "    train: train\n"
      "    test: test\n"
      "    classes: [",
      absl::StrJoin(kFashionClasses, ", "),
      "]\n"
      "    image_size: [28, 28]\n"
      "    channels: 1\n");
}

// Rows per class for `total` rows: `weights` (summing to 1) rounded down, the remainder one by
// one to the classes in order.
std::vector<size_t> ClassCounts(size_t total, const std::vector<double>& weights) {
  std::vector<size_t> counts;
  size_t given = 0;
  for (double w : weights) {
    counts.push_back(static_cast<size_t>(std::floor(w * static_cast<double>(total))));
    given += counts.back();
  }
  for (size_t c = 0; given < total; c = (c + 1) % counts.size(), ++given) ++counts[c];
  return counts;
}

}  // namespace

Rng::Rng(uint64_t seed, uint64_t stream) : engine_(Mix(seed ^ Mix(stream))) {}

double Rng::Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

double Rng::Normal() {
  const double u1 = 1.0 - Uniform();  // (0, 1]: log stays finite
  const double u2 = Uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

uint64_t Rng::Below(uint64_t n) {
  // Reject the top partial copy of [0, n) so every value is equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = engine_();
  } while (x >= limit);
  return x % n;
}

ConditionRow DrawConditionRow(int label, Rng& rng) {
  // One operating point drives speed, heat, current and noise, so that a reading is "hot" or
  // "loud" only relative to its load: the features are correlated and the classes are not
  // separable one column at a time.
  const double load = rng.Uniform();
  const double rpm = 1500 + 3000 * load + 40 * rng.Normal();
  double temperature = 18 + 5 * load + 2 * rng.Normal();
  double current = 6 + 7 * load + 0.7 * rng.Normal();
  double vibration = 0.0020 + 0.0006 * rng.Normal();
  double noise_db = 60 + 6 * load + 2 * rng.Normal();
  double oil_hours = 4000 * rng.Uniform();
  const double pressure = 1013 + 10 * rng.Normal();
  const double humidity = std::clamp(45 + 12 * rng.Normal(), 5.0, 95.0);
  switch (label) {
    case 1:  // worn: rough at every speed, louder, overdue oil
      vibration = 0.0045 + 0.0010 * rng.Normal();
      noise_db += 4;
      oil_hours = 2500 + 3000 * rng.Uniform();
      break;
    case 2:  // overheating: the excess heat grows with load
      temperature += 4 + 6 * load;
      current += 1.5;
      break;
    case 3:  // misaligned: vibration grows with the square of the load
      vibration = 0.0025 + 0.0060 * load * load + 0.0005 * rng.Normal();
      noise_db += 3 * load;
      break;
    default:
      break;
  }
  vibration = std::clamp(vibration, 0.0001, 0.01);
  return {{temperature, pressure, vibration, rpm, current, humidity, noise_db, oil_hours}, label};
}

std::vector<ConditionRow> ConditionRows(const TabularOptions& options, int peer, bool train) {
  std::vector<double> weights(4, 0.25);
  if (train) {
    weights.assign(4, 0.1);
    weights[peer % 4] = weights[(peer + 1) % 4] = 0.4;
  }
  const std::vector<size_t> counts =
      ClassCounts(train ? options.train_rows : options.test_rows, weights);
  std::vector<int> labels;
  for (int c = 0; c < 4; ++c) labels.insert(labels.end(), counts[c], c);
  Rng rng(options.seed, 2 * static_cast<uint64_t>(peer) + (train ? 0 : 1));
  rng.Shuffle(labels);
  std::vector<ConditionRow> rows;
  rows.reserve(labels.size());
  for (int label : labels) rows.push_back(DrawConditionRow(label, rng));
  return rows;
}

absl::Status WriteTabular(const TabularOptions& options, const ProgressFn& progress) {
  const fs::path root(options.dir);
  SHOAL_RETURN_IF_ERROR(MakeDirs(root));
  const std::string header =
      absl::StrCat("id,", absl::StrJoin(kConditionFeatures, ","), ",condition\n");
  uint64_t id = 0;
  for (int peer = 0; peer < options.peers; ++peer) {
    const fs::path dir = root / absl::StrCat("peer-", peer);
    SHOAL_RETURN_IF_ERROR(MakeDirs(dir));
    std::string line = absl::StrCat("tabular peer-", peer, ":");
    for (bool train : {true, false}) {
      const std::vector<ConditionRow> rows = ConditionRows(options, peer, train);
      std::string text = header;
      std::vector<size_t> per_class(4);
      for (const ConditionRow& row : rows) {
        absl::StrAppend(&text, id++);
        for (double v : row.features) absl::StrAppend(&text, ",", Number(v));
        absl::StrAppend(&text, ",", kConditionClasses[row.label], "\n");
        ++per_class[row.label];
      }
      const char* name = train ? "train.csv" : "test.csv";
      SHOAL_RETURN_IF_ERROR(WriteText(dir / name, text));
      absl::StrAppend(&line, " ", name, " ", rows.size(), " rows (");
      for (int c = 0; c < 4; ++c) {
        absl::StrAppend(&line, c > 0 ? ", " : "", kConditionClasses[c], " ", per_class[c]);
      }
      absl::StrAppend(&line, ")", train ? "," : "");
    }
    progress(line);
  }
  return WriteText(root / "README.txt", TabularReadme(options));
}

absl::Status WriteImages(const ImagesOptions& options, const ProgressFn& progress) {
  const fs::path root(options.dir);
  const fs::path source(options.fashion_mnist);
  // One split of Fashion-MNIST and, per class, its images in a seeded order: peer K takes the
  // K-th run of each class's share, so the slices are disjoint and every peer gets every class.
  struct Split {
    const char* name;   // the directory in each peer's
    const char* files;  // the Fashion-MNIST file prefix
    size_t per_peer;
    data::Dataset data;
    std::vector<std::vector<size_t>> by_class;
    std::vector<size_t> share;  // per peer, per class
  };
  Split splits[] = {{"train", "train", options.train_per_peer, {}, {}, {}},
                    {"test", "t10k", options.test_per_peer, {}, {}, {}}};
  data::IdxOptions idx;
  idx.num_classes = static_cast<uint32_t>(kFashionClasses.size());
  for (size_t s = 0; s < std::size(splits); ++s) {
    Split& split = splits[s];
    SHOAL_ASSIGN_OR_RETURN(
        split.data,
        data::LoadIdx((source / absl::StrCat(split.files, "-images-idx3-ubyte.gz")).string(),
                      (source / absl::StrCat(split.files, "-labels-idx1-ubyte.gz")).string(), idx));
    if (split.data.SampleSize() != kPixels) {
      return absl::InvalidArgumentError(
          absl::StrCat(source.string(), ": the ", split.files, " images are not 28x28"));
    }
    split.by_class.resize(kFashionClasses.size());
    for (size_t i = 0; i < split.data.count; ++i) {
      split.by_class[split.data.labels[i]].push_back(i);
    }
    split.share = ClassCounts(split.per_peer, std::vector<double>(kFashionClasses.size(), 0.1));
    for (size_t c = 0; c < split.by_class.size(); ++c) {
      Rng rng(options.seed, (uint64_t{1} << 32) + 100 * s + c);  // apart from the table's streams
      rng.Shuffle(split.by_class[c]);
      const size_t needed = split.share[c] * static_cast<size_t>(options.peers);
      if (needed > split.by_class[c].size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(options.peers, " peers x ", split.share[c], " ", split.name,
                         " images of class ", kFashionClasses[c], " need ", needed, ", but ",
                         source.string(), " has ", split.by_class[c].size()));
      }
    }
  }

  std::vector<uint8_t> pixels(kPixels);
  for (int peer = 0; peer < options.peers; ++peer) {
    for (const Split& split : splits) {
      for (size_t c = 0; c < split.by_class.size(); ++c) {
        const fs::path dir = root / absl::StrCat("peer-", peer) / split.name / kFashionClasses[c];
        SHOAL_RETURN_IF_ERROR(MakeDirs(dir));
        for (size_t j = 0; j < split.share[c]; ++j) {
          const size_t index = split.by_class[c][peer * split.share[c] + j];
          const float* v = &split.data.values[index * kPixels];
          // LoadIdx scaled uint8 by 1/255; rounding undoes it exactly.
          for (size_t p = 0; p < kPixels; ++p) {
            pixels[p] = static_cast<uint8_t>(std::lround(v[p] * 255.0f));
          }
          const fs::path file = dir / absl::StrFormat("%05d.png", index);
          if (stbi_write_png(file.c_str(), 28, 28, 1, pixels.data(), 28) == 0) {
            return WriteError(file, "stbi_write_png failed");
          }
        }
      }
    }
    progress(absl::StrCat("images peer-", peer, ": train ", options.train_per_peer,
                          " PNG files, test ", options.test_per_peer, " PNG files"));
  }
  return WriteText(root / "README.txt", ImagesReadme(options));
}

}  // namespace shoal::examples
