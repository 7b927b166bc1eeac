#include "libs/common/yaml_depth.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "libs/common/escape.h"

namespace shoal {
namespace {

struct TooDeep {
  YAML::Mark mark;
};

// Counts open mappings and lists; throws TooDeep (not a YAML::Exception) past the limit, which
// unwinds the parser at once.
class DepthCounter final : public YAML::EventHandler {
 public:
  explicit DepthCounter(int max_depth) : max_depth_(max_depth) {}

  void OnDocumentStart(const YAML::Mark&) override { depth_ = 0; }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Open(mark);
  }
  void OnSequenceEnd() override { --depth_; }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Open(mark);
  }
  void OnMapEnd() override { --depth_; }

 private:
  void Open(const YAML::Mark& mark) {
    if (++depth_ > max_depth_) throw TooDeep{mark};
  }

  const int max_depth_;
  int depth_ = 0;
};

}  // namespace

absl::Status CheckYamlDepth(absl::string_view text, absl::string_view source, int max_depth) {
  std::istringstream in{std::string(text)};
  DepthCounter counter(max_depth);
  try {
    // Only the first document, the one YAML::Load reads (looping over "all" documents never
    // ends on some malformed input).
    YAML::Parser parser(in);
    parser.HandleNextDocument(counter);
  } catch (const TooDeep& e) {
    return absl::InvalidArgumentError(absl::StrCat(EscapeBytes(source), ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": nested more than ",
                                                   max_depth, " levels deep (the limit)"));
  } catch (const YAML::Exception&) {
    // Not valid YAML: the caller's own parse reports it, with its position.
  }
  return absl::OkStatus();
}

}  // namespace shoal
