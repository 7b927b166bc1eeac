#include "libs/training/scattering.h"

#include <cmath>
#include <complex>
#include <vector>

namespace shoal::training {
namespace {

constexpr int kScales = 2;        // J
constexpr int kOrientations = 8;  // L
constexpr int kRadius = 10;       // filters are (2 kRadius + 1)^2
constexpr int kSide = 2 * kRadius + 1;
// The low-pass filter for maps at half resolution: half the width, on a grid of half the radius.
constexpr int kHalfRadius = kRadius / 2;
constexpr int64_t kBlock = 128;  // samples transformed at a time

using Grid = std::vector<std::complex<double>>;  // side x side, row-major, centre in the middle

// exp(-u' R D R' u / (2 sigma^2)) exp(i xi (u_0 cos theta + u_1 sin theta)) / (2 pi sigma^2 /
// slant): a Gaussian envelope stretched by 1 / slant across the direction theta, modulated
// along it.
Grid Gabor(double sigma, double theta, double xi, double slant, int radius = kRadius) {
  const double c = std::cos(theta);
  const double s = std::sin(theta);
  // R diag(1, slant^2) R' / (2 sigma^2), R the rotation by theta.
  const double a = (c * c + slant * slant * s * s) / (2 * sigma * sigma);
  const double b = (c * s - slant * slant * c * s) / (2 * sigma * sigma);
  const double d = (s * s + slant * slant * c * c) / (2 * sigma * sigma);
  const double norm = 2 * M_PI * sigma * sigma / slant;
  const int side = 2 * radius + 1;
  Grid g(side * side);
  for (int y = -radius; y <= radius; ++y) {
    for (int x = -radius; x <= radius; ++x) {
      const double envelope = std::exp(-(a * y * y + 2 * b * y * x + d * x * x));
      const double phase = xi * (y * c + x * s);
      g[(y + radius) * side + (x + radius)] = std::polar(envelope, phase) / norm;
    }
  }
  return g;
}

// A Morlet wavelet: the Gabor filter less the multiple of its envelope that makes its sum 0.
Grid Morlet(double sigma, double theta, double xi, double slant) {
  Grid wave = Gabor(sigma, theta, xi, slant);
  const Grid envelope = Gabor(sigma, theta, 0, slant);
  std::complex<double> wave_sum = 0;
  std::complex<double> envelope_sum = 0;
  for (size_t i = 0; i < wave.size(); ++i) {
    wave_sum += wave[i];
    envelope_sum += envelope[i];
  }
  const std::complex<double> k = wave_sum / envelope_sum;
  for (size_t i = 0; i < wave.size(); ++i) wave[i] -= k * envelope[i];
  return wave;
}

struct FilterBank {
  // Per scale j: [2 L, 1, kSide, kSide], the real parts of its L wavelets, then their imaginary
  // parts (one convolution gives both).
  std::vector<torch::Tensor> wavelets;
  torch::Tensor low_pass;       // [1, 1, kSide, kSide], for maps at full resolution
  torch::Tensor low_pass_half;  // [1, 1, 2 kHalfRadius + 1, ...], for maps at half resolution
};

// The Gaussian low-pass filter of width sigma on a (2 radius + 1)^2 grid: [1, 1, side, side].
torch::Tensor LowPassFilter(double sigma, int radius) {
  const Grid phi = Gabor(sigma, 0, 0, 1, radius);
  const int side = 2 * radius + 1;
  torch::Tensor out = torch::empty({1, 1, side, side}, torch::kFloat32);
  auto p = out.accessor<float, 4>();
  for (int i = 0; i < side * side; ++i) p[0][0][i / side][i % side] = phi[i].real();
  return out;
}

FilterBank MakeFilterBank() {
  FilterBank bank;
  for (int j = 0; j < kScales; ++j) {
    torch::Tensor scale = torch::empty({2 * kOrientations, 1, kSide, kSide}, torch::kFloat32);
    auto w = scale.accessor<float, 4>();
    for (int l = 0; l < kOrientations; ++l) {
      const double theta = (kOrientations / 2 - 1 - l) * M_PI / kOrientations;
      const Grid psi = Morlet(0.8 * std::pow(2.0, j), theta, 0.75 * M_PI / std::pow(2.0, j),
                              4.0 / kOrientations);
      for (int i = 0; i < kSide * kSide; ++i) {
        w[l][0][i / kSide][i % kSide] = static_cast<float>(psi[i].real());
        w[kOrientations + l][0][i / kSide][i % kSide] = static_cast<float>(psi[i].imag());
      }
    }
    bank.wavelets.push_back(scale);
  }
  bank.low_pass = LowPassFilter(0.8 * std::pow(2.0, kScales), kRadius);
  bank.low_pass_half = LowPassFilter(0.8 * std::pow(2.0, kScales - 1), kHalfRadius);
  return bank;
}

const FilterBank& Bank() {
  static const FilterBank* bank = new FilterBank(MakeFilterBank());
  return *bank;
}

torch::Tensor Reflect(const torch::Tensor& x, int64_t radius) {
  return torch::reflection_pad2d(x, {radius, radius, radius, radius});
}

// The modulus of x's [M, 1, H, W] convolution with the wavelets of scale j, sampled every
// `stride` pixels: [M, L, H / stride, W / stride].
torch::Tensor WaveletModulus(const torch::Tensor& x, int j, int64_t stride) {
  const torch::Tensor both =
      torch::conv2d(Reflect(x, kRadius), Bank().wavelets[j].to(x.device()),
                    /*bias=*/torch::Tensor(), /*stride=*/torch::IntArrayRef{stride, stride});
  const torch::Tensor re = both.narrow(1, 0, kOrientations);
  const torch::Tensor im = both.narrow(1, kOrientations, kOrientations);
  return torch::sqrt(re * re + im * im);
}

// Each channel of t [N, C, H, W] low-passed and sampled every 2^J pixels of the image: t at full
// resolution (`half` false) or at half resolution (`half` true, every other pixel's map).
torch::Tensor LowPass(const torch::Tensor& t, bool half) {
  const int64_t channels = t.size(1);
  const torch::Tensor& filter = half ? Bank().low_pass_half : Bank().low_pass;
  const int64_t side = filter.size(2);
  const int64_t stride = (int64_t{1} << kScales) / (half ? 2 : 1);
  const torch::Tensor k = filter.to(t.device()).expand({channels, 1, side, side}).contiguous();
  return torch::conv2d(Reflect(t, half ? kHalfRadius : kRadius), k, /*bias=*/torch::Tensor(),
                       /*stride=*/torch::IntArrayRef{stride, stride},
                       /*padding=*/torch::IntArrayRef{0, 0}, /*dilation=*/torch::IntArrayRef{1, 1},
                       /*groups=*/channels);
}

// x [M, 1, H, W] -> [M, 81, H', W']: the low-pass of x; of the first order |x * psi_j|; of the
// second order ||x * psi_0| * psi_1|. Maps of scale 1 are only needed low-passed, so they are
// computed every other pixel (as Kymatio computes them) and low-passed at half resolution: a
// quarter of the work of full-resolution maps, which the features differ from by about 1 %.
torch::Tensor Scatter(const torch::Tensor& x) {
  static_assert(kScales == 2, "Scatter computes the orders of J = 2");
  const int64_t m = x.size(0);
  const int64_t h = x.size(2);
  const int64_t w = x.size(3);
  const torch::Tensor first0 = WaveletModulus(x, 0, 1);  // [M, L, H, W]
  const torch::Tensor first1 = WaveletModulus(x, 1, 2);  // [M, L, H / 2, W / 2]
  const torch::Tensor second =
      WaveletModulus(first0.reshape({m * kOrientations, 1, h, w}), 1, 2);  // [M L, L, ., .]
  return torch::cat(
      {LowPass(x, false), LowPass(first0, false), LowPass(first1, true),
       LowPass(second.reshape({m, kOrientations * kOrientations, second.size(2), second.size(3)}),
               true)},
      1);
}

}  // namespace

torch::Tensor ScatteringFeatures(const torch::Tensor& images) {
  TORCH_CHECK(images.dim() == 4, "scattering: expected images [N, C, H, W], got ", images.sizes());
  TORCH_CHECK(images.size(2) > kRadius && images.size(3) > kRadius,
              "scattering: images must be larger than ", kRadius, " x ", kRadius, ", got ",
              images.size(2), " x ", images.size(3));
  torch::NoGradGuard no_grad;
  const int64_t n = images.size(0);
  const int64_t c = images.size(1);
  std::vector<torch::Tensor> blocks;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    const torch::Tensor x = images.narrow(0, start, len).to(torch::kFloat32);
    const torch::Tensor s = Scatter(x.reshape({len * c, 1, x.size(2), x.size(3)}));
    // Group normalisation of each sample's channels, without parameters.
    const torch::Tensor g = s.reshape({len, c * kScatteringChannels / kScatteringGroup, -1});
    const torch::Tensor mean = g.mean(2, /*keepdim=*/true);
    const torch::Tensor var = (g - mean).pow(2).mean(2, /*keepdim=*/true);
    blocks.push_back(((g - mean) / torch::sqrt(var + 1e-5))
                         .reshape({len, c * kScatteringChannels, s.size(2), s.size(3)}));
  }
  if (blocks.empty()) {
    return torch::empty(
        {0, c * kScatteringChannels, (images.size(2) + 3) / 4, (images.size(3) + 3) / 4});
  }
  return torch::cat(blocks, 0);
}

}  // namespace shoal::training
