#include "libs/training/per_sample_grads.h"

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shoal::training {
namespace {

absl::Status CheckBatch(const torch::Tensor& x, const torch::Tensor& y) {
  if (!x.defined() || x.dim() == 0 || x.size(0) == 0) {
    return absl::InvalidArgumentError("per-sample gradients of an empty batch");
  }
  if (!y.defined() || y.dim() == 0 || y.size(0) != x.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("per-sample gradients: the batch has ", x.size(0), " samples but ",
                     y.defined() && y.dim() > 0 ? y.size(0) : 0, " labels"));
  }
  return absl::OkStatus();
}

// [n, shape...] zeros, one per parameter.
std::vector<torch::Tensor> ZerosPerSample(const std::vector<torch::Tensor>& params, int64_t n) {
  std::vector<torch::Tensor> out;
  out.reserve(params.size());
  for (const torch::Tensor& p : params) {
    std::vector<int64_t> shape = {n};
    for (int64_t d : p.sizes()) shape.push_back(d);
    out.push_back(torch::zeros(shape, p.options()));
  }
  return out;
}

std::vector<torch::Tensor> Tensors(
    const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  std::vector<torch::Tensor> out;
  out.reserve(named.size());
  for (const auto& item : named) out.push_back(item.second);
  return out;
}

class LoopPerSampleGrads final : public PerSampleGrads {
 public:
  LoopPerSampleGrads(Model& model, BatchLoss loss) : model_(model), loss_(std::move(loss)) {}

  absl::StatusOr<std::vector<torch::Tensor>> Compute(const torch::Tensor& x,
                                                     const torch::Tensor& y) override {
    if (absl::Status s = CheckBatch(x, y); !s.ok()) return s;
    try {
      const std::vector<torch::Tensor> params = Tensors(model_.NamedParameters());
      const int64_t n = x.size(0);
      std::vector<torch::Tensor> out = ZerosPerSample(params, n);
      for (int64_t i = 0; i < n; ++i) {
        torch::Tensor loss = loss_(model_.Forward(x.narrow(0, i, 1)), y.narrow(0, i, 1));
        std::vector<torch::Tensor> grads =
            torch::autograd::grad({loss}, params, /*grad_outputs=*/{}, /*retain_graph=*/false,
                                  /*create_graph=*/false, /*allow_unused=*/true);
        for (size_t k = 0; k < params.size(); ++k) {
          if (grads[k].defined()) out[k][i].copy_(grads[k]);
        }
      }
      return out;
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("per-sample gradients (loop): ", ErrorFirstLine(e)));
    }
  }
  std::string Kind() const override { return "loop"; }

 private:
  Model& model_;
  BatchLoss loss_;
};

// One step of the chain: a layer with parameters the fast path knows (Linear or Conv2d), or a
// parameter-free layer that treats each sample on its own.
struct Step {
  torch::nn::AnyModule module;
  torch::nn::LinearImpl* linear = nullptr;
  torch::nn::Conv2dImpl* conv = nullptr;
  int weight = -1;  // index in Model::NamedParameters
  int bias = -1;    // -1: no bias
};

// Parameter-free layers whose output for a sample depends on that sample only.
bool IsPerSampleLayer(const std::string& kind) {
  static const auto* known = new absl::flat_hash_set<std::string>{
      "torch::nn::ReLUImpl",      "torch::nn::LeakyReLUImpl", "torch::nn::TanhImpl",
      "torch::nn::SigmoidImpl",   "torch::nn::FlattenImpl",   "torch::nn::IdentityImpl",
      "torch::nn::MaxPool2dImpl", "torch::nn::AvgPool2dImpl", "torch::nn::MaxPool1dImpl",
      "torch::nn::AvgPool1dImpl"};
  return known->contains(kind);
}

class LayerwisePerSampleGrads final : public PerSampleGrads {
 public:
  LayerwisePerSampleGrads(Model& model, BatchLoss loss, std::vector<Step> steps)
      : model_(model), loss_(std::move(loss)), steps_(std::move(steps)) {}

  absl::StatusOr<std::vector<torch::Tensor>> Compute(const torch::Tensor& x,
                                                     const torch::Tensor& y) override {
    if (absl::Status s = CheckBatch(x, y); !s.ok()) return s;
    try {
      const Pass pass = Run(x, y);
      const std::vector<torch::Tensor> params = Tensors(model_.NamedParameters());
      std::vector<torch::Tensor> out = ZerosPerSample(params, x.size(0));
      for (size_t l = 0; l < pass.layers.size(); ++l) {
        if (!pass.grads[l].defined()) continue;
        Accumulate(*pass.layers[l], pass.inputs[l], pass.grads[l], out);
      }
      return out;
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("per-sample gradients (layerwise): ", ErrorFirstLine(e)));
    }
  }

  absl::StatusOr<ClippedGradients> ClippedSum(const torch::Tensor& x, const torch::Tensor& y,
                                              double clip_norm) override {
    if (absl::Status s = CheckBatch(x, y); !s.ok()) return s;
    try {
      torch::NoGradGuard no_grad_after;  // Run's grad() builds its own graph first
      const Pass pass = Run(x, y);
      const int64_t n = x.size(0);
      // Pass 1, the norms: Linear from |g_i| and |a_i| (ghost), Conv2d from its per-sample
      // gradients (small: a kernel's values, not the layer's input).
      torch::Tensor squared = torch::zeros({n}, x.options().dtype(torch::kFloat64));
      std::vector<torch::Tensor> conv_weight(pass.layers.size());
      std::vector<Factors> factors(pass.layers.size());  // kept for pass 2 (unfold once)
      for (size_t l = 0; l < pass.layers.size(); ++l) {
        if (!pass.grads[l].defined()) continue;
        const Step& step = *pass.layers[l];
        factors[l] = FactorsOf(step, pass.inputs[l], pass.grads[l]);
        const Factors& f = factors[l];
        if (step.linear != nullptr) {
          if (f.a.size(1) == 1) {
            squared.add_((f.g.squeeze(1).square().sum(1) * f.a.squeeze(1).square().sum(1))
                             .to(torch::kFloat64));
          } else {
            squared.add_(
                (torch::bmm(f.g, f.g.transpose(1, 2)) * torch::bmm(f.a, f.a.transpose(1, 2)))
                    .sum(std::vector<int64_t>{1, 2})
                    .to(torch::kFloat64));
          }
        } else {
          conv_weight[l] = torch::einsum("nlo,nlk->nok", {f.g, f.a});
          squared.add_(conv_weight[l].square().sum(std::vector<int64_t>{1, 2}).to(torch::kFloat64));
        }
        if (step.bias >= 0) squared.add_(f.g.sum(1).square().sum(1).to(torch::kFloat64));
      }
      const torch::Tensor norms = squared.sqrt().cpu();
      const torch::Tensor factor =
          (clip_norm / norms.clamp_min(1e-300)).clamp_max(1.0).to(x.device(), torch::kFloat32);
      // Pass 2, the clipped sums.
      const std::vector<torch::Tensor> params = Tensors(model_.NamedParameters());
      ClippedGradients out;
      for (const torch::Tensor& p : params) out.sums.push_back(torch::zeros_like(p));
      for (size_t l = 0; l < pass.layers.size(); ++l) {
        if (!pass.grads[l].defined()) continue;
        const Step& step = *pass.layers[l];
        const Factors& f = factors[l];
        const torch::Tensor fg = f.g * factor.view({n, 1, 1});
        torch::Tensor w = step.linear != nullptr
                              ? fg.reshape({-1, fg.size(2)}).t().mm(f.a.reshape({-1, f.a.size(2)}))
                              : torch::einsum("n,nok->ok", {factor, conv_weight[l]});
        out.sums[step.weight].add_(w.reshape(out.sums[step.weight].sizes()));
        if (step.bias >= 0) out.sums[step.bias].add_(fg.sum(std::vector<int64_t>{0, 1}));
      }
      const double* norm = norms.data_ptr<double>();
      out.norms.assign(norm, norm + n);
      return out;
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("clipped gradients (layerwise): ", ErrorFirstLine(e)));
    }
  }

  std::string Kind() const override { return "layerwise"; }

 private:
  // One forward pass keeping each parameterised layer's input a and output z, and dL/dz.
  struct Pass {
    std::vector<torch::Tensor> inputs;
    std::vector<const Step*> layers;
    std::vector<torch::Tensor> grads;
  };
  Pass Run(const torch::Tensor& x, const torch::Tensor& y) {
    torch::AutoGradMode grad_on(true);
    Pass pass;
    std::vector<torch::Tensor> outputs;
    torch::Tensor a = x;
    for (Step& step : steps_) {
      const bool has_params = step.linear != nullptr || step.conv != nullptr;
      if (has_params) pass.inputs.push_back(a);
      a = step.module.forward(a);
      if (has_params) {
        outputs.push_back(a);
        pass.layers.push_back(&step);
      }
    }
    // The batch loss is a mean; times n it is the sum of the samples' own losses, and since
    // samples do not mix, row i of dL/dz is sample i's own.
    torch::Tensor loss = loss_(a, y) * static_cast<double>(x.size(0));
    pass.grads = torch::autograd::grad({loss}, outputs, /*grad_outputs=*/{},
                                       /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    for (torch::Tensor& in : pass.inputs) in = in.detach();
    return pass;
  }

  // A layer's gradient for sample i is sum over positions of g_ip a_ip^T: Linear's positions
  // are its input's middle dimensions, Conv2d's the unfolded patches. g: [n, positions, out],
  // a: [n, positions, in].
  struct Factors {
    torch::Tensor g;
    torch::Tensor a;
  };
  static Factors FactorsOf(const Step& step, const torch::Tensor& a, const torch::Tensor& g) {
    const int64_t n = a.size(0);
    if (step.linear != nullptr) {
      return {g.reshape({n, -1, g.size(-1)}), a.reshape({n, -1, a.size(-1)})};
    }
    const auto& o = step.conv->options;
    namespace F = torch::nn::functional;
    auto padding = c10::get<torch::ExpandingArray<2>>(o.padding());
    torch::Tensor patches = F::unfold(a, F::UnfoldFuncOptions(o.kernel_size())
                                             .dilation(o.dilation())
                                             .padding(padding)
                                             .stride(o.stride()));  // [n, cin·kh·kw, L]
    return {g.reshape({n, g.size(1), -1}).transpose(1, 2), patches.transpose(1, 2)};
  }

  // Adds the layer's per-sample gradients, from its input `a` and dL/d(output) `g`, to `out`:
  // sample i's is the sum over positions of g_ip a_ip^T (FactorsOf).
  static void Accumulate(const Step& step, const torch::Tensor& a, const torch::Tensor& g,
                         std::vector<torch::Tensor>& out) {
    const Factors f = FactorsOf(step, a, g);
    const torch::Tensor gw = torch::einsum("npo,npi->noi", {f.g, f.a});
    const torch::Tensor gb = f.g.sum(1);
    out[step.weight].add_(gw.reshape(out[step.weight].sizes()));
    if (step.bias >= 0) out[step.bias].add_(gb);
  }

  Model& model_;
  BatchLoss loss_;
  std::vector<Step> steps_;
};

// The index of `p` among the model's parameters; -1 when it is not one of them.
int IndexOf(const std::unordered_map<const void*, int>& index, const torch::Tensor& p) {
  auto it = index.find(p.unsafeGetTensorImpl());
  return it == index.end() ? -1 : it->second;
}

}  // namespace

absl::Status CheckSupportsPerSampleGrads(Model& model) {
  for (const auto& [name, kind] : model.NamedModuleKinds()) {
    if (absl::StrContains(kind, "BatchNorm")) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DP-SGD needs each sample's own gradient, which batch normalisation does not have: "
          "layer '",
          name, "' is ", kind, " (use GroupNorm or LayerNorm, or no normalisation)"));
    }
  }
  for (const auto& [name, p] : model.NamedParameters()) {
    if (!p.requires_grad()) {
      return absl::FailedPreconditionError(
          absl::StrCat("DP-SGD: parameter ", name, " does not require a gradient"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PerSampleGrads>> MakeLayerwisePerSampleGrads(Model& model,
                                                                            BatchLoss loss) {
  torch::nn::Sequential chain = model.Layers();
  if (chain.is_empty()) {
    return absl::InvalidArgumentError("the model's forward pass is not a chain of layers");
  }
  std::unordered_map<const void*, int> index;
  const auto named = model.NamedParameters();
  for (size_t k = 0; k < named.size(); ++k) {
    index[named[k].second.unsafeGetTensorImpl()] = static_cast<int>(k);
  }
  std::vector<bool> covered(named.size(), false);
  std::vector<Step> steps;
  for (size_t i = 0; i < chain->size(); ++i) {
    Step step;
    step.module = chain->begin()[static_cast<std::ptrdiff_t>(i)];
    std::shared_ptr<torch::nn::Module> m = chain->ptr(i);
    const std::string where = absl::StrCat("layer ", i, " of the chain (", m->name(), ")");
    step.linear = m->as<torch::nn::LinearImpl>();
    step.conv = m->as<torch::nn::Conv2dImpl>();
    if (step.conv != nullptr) {
      const auto& o = step.conv->options;
      if (o.groups() != 1 || !c10::holds_alternative<torch::ExpandingArray<2>>(o.padding()) ||
          !c10::holds_alternative<torch::enumtype::kZeros>(o.padding_mode())) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": the fast path knows Conv2d with groups 1 and explicit zero padding only"));
      }
    }
    if (step.linear != nullptr || step.conv != nullptr) {
      const torch::Tensor& w = step.linear != nullptr ? step.linear->weight : step.conv->weight;
      const torch::Tensor& b = step.linear != nullptr ? step.linear->bias : step.conv->bias;
      step.weight = IndexOf(index, w);
      step.bias = b.defined() ? IndexOf(index, b) : -1;
      if (step.weight < 0 || (b.defined() && step.bias < 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": its parameters are not the model's own"));
      }
      covered[step.weight] = true;
      if (step.bias >= 0) covered[step.bias] = true;
    } else if (!IsPerSampleLayer(m->name()) || !m->parameters().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the fast path does not know this layer"));
    }
    steps.push_back(std::move(step));
  }
  for (size_t k = 0; k < named.size(); ++k) {
    if (!covered[k]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", named[k].first, " is in no Linear or Conv2d layer of the chain"));
    }
  }
  return std::unique_ptr<PerSampleGrads>(
      std::make_unique<LayerwisePerSampleGrads>(model, std::move(loss), std::move(steps)));
}

std::unique_ptr<PerSampleGrads> MakeLoopPerSampleGrads(Model& model, BatchLoss loss) {
  return std::make_unique<LoopPerSampleGrads>(model, std::move(loss));
}

absl::StatusOr<std::unique_ptr<PerSampleGrads>> ChoosePerSampleGrads(Model& model, BatchLoss loss) {
  if (absl::Status s = CheckSupportsPerSampleGrads(model); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<PerSampleGrads>> fast = MakeLayerwisePerSampleGrads(model, loss);
  if (fast.ok()) return fast;
  return MakeLoopPerSampleGrads(model, std::move(loss));
}

ClippedGradients ClipAndSumPerSample(const std::vector<torch::Tensor>& per_sample,
                                     const std::vector<torch::Tensor>& params, double clip_norm) {
  torch::NoGradGuard no_grad;
  ClippedGradients out;
  const int64_t n = per_sample.empty() ? 0 : per_sample[0].size(0);
  // Each parameter's per-sample gradients as [N, values] views: no copy of the N x D floats
  // (a fresh model-sized buffer per step costs more in page faults than the arithmetic).
  std::vector<torch::Tensor> rows;
  for (size_t k = 0; k < per_sample.size(); ++k) {
    rows.push_back(per_sample[k].reshape({n, params[k].numel()}).to(torch::kFloat32));
  }
  torch::Tensor factor = torch::ones({n}, torch::kFloat32);
  if (n > 0) {
    torch::Tensor squared = torch::zeros({n}, rows[0].options().dtype(torch::kFloat64));
    for (const torch::Tensor& r : rows) {
      squared.add_(
          at::linalg_vector_norm(r, 2, {1}, false, c10::nullopt).square().to(torch::kFloat64));
    }
    const torch::Tensor norms = squared.sqrt().cpu();
    const double* norm = norms.data_ptr<double>();
    out.norms.assign(norm, norm + n);
    factor = (clip_norm / norms.clamp_min(1e-300)).clamp_max(1.0).to(torch::kFloat32);
  }
  for (size_t k = 0; k < rows.size(); ++k) {
    out.sums.push_back(
        factor.to(rows[k].device()).matmul(rows[k]).view(params[k].sizes()).to(params[k].dtype()));
  }
  return out;
}

absl::StatusOr<ClippedGradients> PerSampleGrads::ClippedSum(const torch::Tensor& x,
                                                            const torch::Tensor& y,
                                                            double clip_norm) {
  absl::StatusOr<std::vector<torch::Tensor>> per_sample = Compute(x, y);
  if (!per_sample.ok()) return per_sample.status();
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& g : *per_sample) {
    params.push_back(g.select(0, 0));  // only the shape and type are read
  }
  try {
    return ClipAndSumPerSample(*per_sample, params, clip_norm);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("clipped gradients: ", ErrorFirstLine(e)));
  }
}

}  // namespace shoal::training
