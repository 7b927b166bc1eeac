#pragma once

// The data sets shoal-example-data writes: a synthetic machine-condition table and Fashion-MNIST
// PNG folders, each split over N peers. Kept apart from the binary's flags so that the generator
// reads as plain functions of their options.
//
// Every draw is made here from std::mt19937_64 (whose output the standard fixes) rather than by
// std:: distributions (whose algorithms differ between standard libraries), so the same options
// give byte-identical files everywhere.

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace shoal::examples {

// Seeded draws with algorithms of our own. A value type; not thread-safe.
class Rng {
 public:
  // `stream` separates independent sequences of one seed (one per peer and split), so a peer's
  // data does not change when another peer is added.
  Rng(uint64_t seed, uint64_t stream);

  double Uniform();            // [0, 1), 53 random bits
  double Normal();             // mean 0, standard deviation 1 (Box-Muller)
  uint64_t Below(uint64_t n);  // [0, n), unbiased; n > 0
  template <typename T>
  void Shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Below(i)]);
  }

 private:
  std::mt19937_64 engine_;
};

// Receives one progress line (no newline) per peer.
using ProgressFn = std::function<void(const std::string&)>;

// The table's label classes, in label order.
inline const std::vector<std::string> kConditionClasses = {"normal", "worn", "overheating",
                                                           "misaligned"};
// The numeric feature columns, between `id` and `condition`.
inline const std::vector<std::string> kConditionFeatures = {
    "temperature", "pressure", "vibration", "rpm", "current", "humidity", "noise_db", "oil_hours"};

struct TabularOptions {
  std::string dir;  // written: dir/peer-K/{train,test}.csv and dir/README.txt
  int peers = 4;
  uint64_t seed = 7;
  size_t train_rows = 1500;  // per peer, label-skewed
  size_t test_rows = 400;    // per peer, balanced over the classes
};

// One generated row: kConditionFeatures' values and the index of its kConditionClasses label.
struct ConditionRow {
  double features[8];
  int label;
};

// One row of class `label`, drawn from the class's distribution (the README describes it).
ConditionRow DrawConditionRow(int label, Rng& rng);

// Peer `peer`'s rows of one split, in file order (before ids are given). Train: the peer's two
// dominant classes (peer mod 4 and the next) take 40% each and the other two 10% each; test:
// equal counts of every class (a remainder goes to the first classes), shuffled.
std::vector<ConditionRow> ConditionRows(const TabularOptions& options, int peer, bool train);

// Writes the table files and README (dir must exist and be empty or absent). INTERNAL on a
// write failure, naming the file.
absl::Status WriteTabular(const TabularOptions& options, const ProgressFn& progress);

// Fashion-MNIST class directory names, in label order.
inline const std::vector<std::string> kFashionClasses = {
    "t-shirt", "trouser", "pullover", "dress", "coat",
    "sandal",  "shirt",   "sneaker",  "bag",   "ankle-boot"};

struct ImagesOptions {
  std::string dir;            // written: dir/peer-K/{train,test}/<class>/<index>.png, README.txt
  std::string fashion_mnist;  // directory of the four Fashion-MNIST .gz files
  int peers = 4;
  uint64_t seed = 7;
  size_t train_per_peer = 600;  // >= 10, so that every class gets an image
  size_t test_per_peer = 200;
};

// Loads Fashion-MNIST and writes each peer a disjoint, class-balanced slice of the training and
// test images as grayscale PNGs. NOT_FOUND / INVALID_ARGUMENT from the loader; INVALID_ARGUMENT
// when a class has too few images for peers x per-peer counts; INTERNAL on a write failure.
absl::Status WriteImages(const ImagesOptions& options, const ProgressFn& progress);

}  // namespace shoal::examples
