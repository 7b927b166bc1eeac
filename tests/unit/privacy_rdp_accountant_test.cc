#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libs/privacy/rdp_accountant.h"

namespace shoal::privacy {
namespace {

using ::testing::HasSubstr;

// Relative tolerance for values published by other implementations: the issue asks for 1 %;
// these agree far more closely, so a real regression cannot hide inside the slack.
constexpr double kPublishedTolerance = 1e-4;

void ExpectRelativelyNear(double actual, double expected, double tolerance) {
  EXPECT_NEAR(actual, expected, std::abs(expected) * tolerance)
      << "actual " << actual << ", expected " << expected;
}

// Opacus's and dp_accounting's tutorials' grid: 1.1, 1.2, ..., 10.9, then 12 to 63.
std::vector<double> TutorialOrders() {
  std::vector<double> orders;
  for (int x = 1; x < 100; ++x) orders.push_back(1 + x / 10.0);
  for (int order = 12; order < 64; ++order) orders.push_back(order);
  return orders;
}

// ε of DP-SGD as TF Privacy's compute_dp_sgd_privacy(n, batch_size, noise_multiplier, epochs,
// delta) computes it: q = batch / n, ceil(epochs · n / batch) steps, DefaultRdpOrders().
PrivacySpent DpSgd(double n, double batch, double sigma, double epochs, double delta,
                   RdpConversion conversion) {
  RdpAccountantOptions options;
  options.conversion = conversion;
  RdpAccountant accountant = *RdpAccountant::Create(options);
  const auto steps = static_cast<int64_t>(std::ceil(epochs * n / batch));
  EXPECT_TRUE(accountant.AddSteps(batch / n, sigma, steps).ok());
  return *accountant.Spent(delta);
}

TEST(RdpAccountantTest, FullSamplingIsTheGaussianMechanismClosedForm) {
  // q = 1: RDP of the Gaussian mechanism, α / (2σ²) per step (Mironov 2017, Proposition 7).
  const double sigma = 1.3;
  auto rdp = SampledGaussianRdp(1.0, sigma, DefaultRdpOrders());
  ASSERT_TRUE(rdp.ok()) << rdp.status();
  const std::vector<double> orders = DefaultRdpOrders();
  for (size_t i = 0; i < orders.size(); ++i) {
    EXPECT_DOUBLE_EQ((*rdp)[i], orders[i] / (2 * sigma * sigma)) << "order " << orders[i];
  }
  RdpAccountant accountant = *RdpAccountant::Create();
  ASSERT_TRUE(accountant.AddSteps(1.0, sigma, 7).ok());
  for (size_t i = 0; i < orders.size(); ++i) {
    EXPECT_NEAR(accountant.rdp()[i], 7 * orders[i] / (2 * sigma * sigma), 1e-12 * orders[i]);
  }
}

TEST(RdpAccountantTest, MatchesDpAccountingAtIntegerAndFractionalOrders) {
  // google/differential-privacy, python/dp_accounting/dp_accounting/rdp/
  // rdp_privacy_accountant_test.py, test_compute_rdp_poisson_sampled_gaussian: q = 0.01,
  // σ = 2.5, 50 steps (compared there with rtol 1e-4).
  const std::vector<double> orders = {2.5, 5, 50, 100, 1.5};
  const std::vector<double> expected = {1.08548710e-03, 2.18075656e-03, 2.38460375e-02,
                                        1.67416308e02};
  RdpAccountant accountant = *RdpAccountant::Create({.orders = orders});
  ASSERT_TRUE(accountant.AddSteps(0.01, 2.5, 50).ok());
  for (size_t i = 0; i < expected.size(); ++i) {
    ExpectRelativelyNear(accountant.rdp()[i], expected[i], kPublishedTolerance);
  }
  // At α = 1.5 that test expects 6.70579741e-04: dp_accounting sums the fractional-order series'
  // terms in absolute value, an upper bound. The series itself (Mironov et al. 2019, Sec. 3.3,
  // with the generalised binomials' signs, as Opacus and TF Privacy before dp_accounting sum it)
  // gives the exact value, 3.1 % lower: 50 log(A_1.5) / 0.5 with A_α integrated numerically
  // (mpmath.quad at 40 digits, the check dp_accounting's test_compute_log_a_equals_mp makes) is
  // 6.500708971880e-04.
  ExpectRelativelyNear(accountant.rdp()[4], 6.500708971880e-04, 1e-8);
  EXPECT_LT(accountant.rdp()[4], 6.70579741e-04);
}

TEST(RdpAccountantTest, MatchesTfPrivacyComputeDpSgdPrivacy) {
  // tensorflow/privacy, tensorflow_privacy/privacy/analysis/compute_dp_sgd_privacy_test.py,
  // test_compute_dp_sgd_privacy (current, dp_accounting's conversion, Balle et al. 2020), with the
  // optimal orders it states.
  struct Case {
    double n, batch, sigma, epochs, delta, epsilon, order;
  };
  for (const Case& c : {Case{60000, 150, 1.3, 15, 1e-5, 0.7242234026109595, 19},
                        Case{100000, 100, 1.0, 30, 1e-7, 1.4154988495444842, 13},
                        Case{1e8, 1024, 0.1, 10, 1e-7, 5907982.3113984, 1.25}}) {
    SCOPED_TRACE(testing::Message() << "n " << c.n << " batch " << c.batch);
    const PrivacySpent spent =
        DpSgd(c.n, c.batch, c.sigma, c.epochs, c.delta, RdpConversion::kBalle2020);
    ExpectRelativelyNear(spent.epsilon, c.epsilon, kPublishedTolerance);
    EXPECT_EQ(spent.order, c.order);
  }
}

TEST(RdpAccountantTest, MatchesTfPrivacy2019WithTheClassicConversion) {
  // The same test as first written (tensorflow/privacy commit 2007aac, October 2019), when
  // compute_eps used Mironov 2017's ε = rdp + log(1/δ) / (α - 1).
  struct Case {
    double n, batch, sigma, epochs, delta, epsilon, order;
  };
  for (const Case& c : {Case{60000, 150, 1.3, 15, 1e-5, 0.941870567, 19},
                        Case{100000, 100, 1.0, 30, 1e-7, 1.70928734, 13},
                        Case{1e8, 1024, 0.1, 10, 1e-7, 5907984.81339406, 1.25}}) {
    SCOPED_TRACE(testing::Message() << "n " << c.n << " batch " << c.batch);
    const PrivacySpent spent =
        DpSgd(c.n, c.batch, c.sigma, c.epochs, c.delta, RdpConversion::kMironov2017);
    ExpectRelativelyNear(spent.epsilon, c.epsilon, kPublishedTolerance);
    EXPECT_EQ(spent.order, c.order);
  }
}

TEST(RdpAccountantTest, MatchesAbadiMnistSettingInTfPrivacyTutorial) {
  // tensorflow/privacy, tutorials/README.md: the MNIST tutorial's defaults (Abadi et al. 2016's
  // setting: N = 60000, batch 256, σ = 1.1, 60 epochs) give ε = 3.01 at δ = 1e-5, from
  // compute_dp_sgd_privacy.py of that time (the classic conversion), to two decimals.
  const PrivacySpent classic = DpSgd(60000, 256, 1.1, 60, 1e-5, RdpConversion::kMironov2017);
  EXPECT_NEAR(classic.epsilon, 3.01, 0.005 + 1e-9);
  // The tighter conversion can only lower it.
  const PrivacySpent tight = DpSgd(60000, 256, 1.1, 60, 1e-5, RdpConversion::kBalle2020);
  EXPECT_LT(tight.epsilon, classic.epsilon);
  EXPECT_GT(tight.epsilon, 0.8 * classic.epsilon);
}

TEST(RdpAccountantTest, MatchesOpacusAccountantTest) {
  // pytorch/opacus, opacus/tests/accountants_test.py, test_rdp_accountant: q = 0.04, σ = 1.5,
  // int(90 / 0.04) = 2250 steps, δ = 1e-5, at Opacus's RDPAccountant.DEFAULT_ALPHAS.
  RdpAccountant accountant = *RdpAccountant::Create({.orders = TutorialOrders()});
  ASSERT_TRUE(accountant.AddSteps(0.04, 1.5, static_cast<int64_t>(90 / 0.04)).ok());
  ExpectRelativelyNear(accountant.Spent(1e-5)->epsilon, 7.32911117143, kPublishedTolerance);
}

TEST(RdpAccountantTest, ConversionMatchesDpAccountingPureDpExample) {
  // dp_accounting's rdp_privacy_accountant_test.py, test_compute_epsilon_delta_pure_dp:
  // RDP 1.1 at orders 2..32, δ = 1e-5 gives ε = 1.32783806176 at order 32.
  std::vector<double> orders;
  for (int order = 2; order <= 32; ++order) orders.push_back(order);
  const std::vector<double> rdp(orders.size(), 1.1);
  auto spent = EpsilonFromRdp(orders, rdp, 1e-5);
  ASSERT_TRUE(spent.ok()) << spent.status();
  EXPECT_NEAR(spent->epsilon, 1.32783806176, 1e-9);
  EXPECT_EQ(spent->order, 32);
}

TEST(RdpAccountantTest, EpsilonGrowsWithStepsAndSamplingRate) {
  double previous = 0;
  RdpAccountant accountant = *RdpAccountant::Create();
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(accountant.AddSteps(0.01, 1.0, 100).ok());
    const double epsilon = accountant.Spent(1e-5)->epsilon;
    EXPECT_GT(epsilon, previous) << "after " << accountant.steps() << " steps";
    previous = epsilon;
  }
  previous = 0;
  for (double q : {1e-4, 1e-3, 0.01, 0.05, 0.2, 0.5, 1.0}) {
    RdpAccountant one = *RdpAccountant::Create();
    ASSERT_TRUE(one.AddSteps(q, 1.0, 1000).ok());
    const double epsilon = one.Spent(1e-5)->epsilon;
    EXPECT_GT(epsilon, previous) << "q " << q;
    previous = epsilon;
  }
  // ...and falls as the noise grows.
  previous = std::numeric_limits<double>::infinity();
  for (double sigma : {0.5, 0.8, 1.0, 2.0, 5.0}) {
    RdpAccountant one = *RdpAccountant::Create();
    ASSERT_TRUE(one.AddSteps(0.01, sigma, 1000).ok());
    const double epsilon = one.Spent(1e-5)->epsilon;
    EXPECT_LT(epsilon, previous) << "sigma " << sigma;
    previous = epsilon;
  }
}

TEST(RdpAccountantTest, HeterogeneousStepsComposeInAnyOrder) {
  RdpAccountant a = *RdpAccountant::Create();
  ASSERT_TRUE(a.AddSteps(0.01, 1.1, 300).ok());
  ASSERT_TRUE(a.AddSteps(0.05, 2.0, 40).ok());
  ASSERT_TRUE(a.AddSteps(1.0, 8.0, 3).ok());
  RdpAccountant b = *RdpAccountant::Create();
  ASSERT_TRUE(b.AddSteps(1.0, 8.0, 3).ok());
  ASSERT_TRUE(b.AddSteps(0.05, 2.0, 40).ok());
  ASSERT_TRUE(b.AddSteps(0.01, 1.1, 300).ok());
  EXPECT_EQ(a.steps(), 343);
  const std::vector<double> r1 = *SampledGaussianRdp(0.01, 1.1, a.orders());
  const std::vector<double> r2 = *SampledGaussianRdp(0.05, 2.0, a.orders());
  const std::vector<double> r3 = *SampledGaussianRdp(1.0, 8.0, a.orders());
  for (size_t i = 0; i < a.orders().size(); ++i) {
    const double expected = 300 * r1[i] + 40 * r2[i] + 3 * r3[i];
    EXPECT_NEAR(a.rdp()[i], expected, 1e-12 * expected);
    EXPECT_NEAR(b.rdp()[i], expected, 1e-12 * expected);
  }
  // Composition is additive in RDP, so ε is that of the total, below the sum of the parts' ε.
  RdpAccountant part = *RdpAccountant::Create();
  ASSERT_TRUE(part.AddSteps(0.01, 1.1, 300).ok());
  EXPECT_GT(a.Spent(1e-5)->epsilon, part.Spent(1e-5)->epsilon);
}

TEST(RdpAccountantTest, StepsLeftStopsExactlyAtTheTarget) {
  RdpAccountant accountant = *RdpAccountant::Create();
  ASSERT_TRUE(accountant.AddSteps(0.02, 1.0, 200).ok());
  const double target = 3.0;
  const double delta = 1e-5;
  auto left = accountant.StepsLeft(0.02, 1.0, target, delta);
  ASSERT_TRUE(left.ok()) << left.status();
  ASSERT_GT(*left, 0);
  RdpAccountant at = accountant;
  ASSERT_TRUE(at.AddSteps(0.02, 1.0, *left).ok());
  EXPECT_LE(at.Spent(delta)->epsilon, target);
  ASSERT_TRUE(at.AddSteps(0.02, 1.0, 1).ok());
  EXPECT_GT(at.Spent(delta)->epsilon, target);
  // Nothing left once the budget is spent; unlimited when a step costs nothing.
  EXPECT_EQ(*at.StepsLeft(0.02, 1.0, target, delta), 0);
  EXPECT_EQ(*accountant.StepsLeft(0.0, 1.0, target, delta), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(*accountant.StepsLeft(0.02, 0.0, target, delta), 0);  // σ = 0: no privacy at all
}

TEST(RdpAccountantTest, RestoreContinuesTheBudget) {
  RdpAccountant accountant = *RdpAccountant::Create();
  ASSERT_TRUE(accountant.AddSteps(0.01, 1.2, 500).ok());
  auto restored = RdpAccountant::Restore({}, accountant.rdp(), accountant.steps());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->Spent(1e-6)->epsilon, accountant.Spent(1e-6)->epsilon);
  EXPECT_EQ(restored->steps(), 500);
  EXPECT_THAT(RdpAccountant::Restore({}, {1.0, 2.0}, 3).status().message(),
              HasSubstr("orders but 2 values"));
}

TEST(RdpAccountantTest, NoStepsNoCostAndNoNoiseNoPrivacy) {
  RdpAccountant accountant = *RdpAccountant::Create();
  EXPECT_EQ(accountant.Spent(1e-5)->epsilon, 0);
  ASSERT_TRUE(accountant.AddSteps(0.0, 1.0, 1000).ok());
  EXPECT_EQ(accountant.Spent(1e-5)->epsilon, 0);
  ASSERT_TRUE(accountant.AddSteps(0.1, 0.0, 1).ok());
  EXPECT_EQ(accountant.Spent(1e-5)->epsilon, std::numeric_limits<double>::infinity());
}

TEST(RdpAccountantTest, StaysFiniteAtExtremeParameters) {
  // Large orders with little noise overflow exp() outside log space; tiny q underflows.
  for (double q : {1e-9, 1e-5, 0.3, 0.999}) {
    for (double sigma : {0.05, 0.5, 5.0, 500.0}) {
      auto rdp = SampledGaussianRdp(q, sigma, DefaultRdpOrders());
      ASSERT_TRUE(rdp.ok());
      double previous = 0;
      for (double r : *rdp) {
        EXPECT_TRUE(std::isfinite(r)) << "q " << q << " sigma " << sigma;
        EXPECT_GE(r, 0);
        // RDP is nondecreasing in the order (Mironov 2017, Proposition 9), up to the rounding of
        // log(A) near log(1) = 0 (about 1e-16) where q is tiny.
        EXPECT_GE(r, previous * (1 - 1e-9) - 1e-15) << "q " << q << " sigma " << sigma;
        previous = r;
      }
    }
  }
}

TEST(RdpAccountantTest, RefusesBadArgumentsNamingThem) {
  RdpAccountant accountant = *RdpAccountant::Create();
  EXPECT_THAT(accountant.AddSteps(1.5, 1.0, 1).message(), HasSubstr("sampling rate"));
  EXPECT_THAT(accountant.AddSteps(0.1, -1.0, 1).message(), HasSubstr("noise multiplier"));
  EXPECT_THAT(accountant.AddSteps(0.1, 1.0, -1).message(), HasSubstr("step count"));
  EXPECT_EQ(accountant.steps(), 0);
  EXPECT_THAT(accountant.Spent(0).status().message(), HasSubstr("delta"));
  EXPECT_THAT(accountant.Spent(1).status().message(), HasSubstr("delta"));
  EXPECT_THAT(accountant.StepsLeft(0.1, 1.0, 0, 1e-5).status().message(),
              HasSubstr("target epsilon"));
  EXPECT_THAT(RdpAccountant::Create({.orders = {1.0, 2.0}}).status().message(),
              HasSubstr("order must be in (1"));
  EXPECT_THAT(RdpAccountant::Create({.orders = {2.0, 2.0}}).status().message(),
              HasSubstr("listed twice"));
  EXPECT_THAT(RdpAccountant::Create({.orders = {}}).status().message(), HasSubstr("none"));
  EXPECT_THAT(EpsilonFromRdp({2.0, 3.0}, {0.1}, 1e-5).status().message(),
              HasSubstr("2 orders but 1 values"));
}

}  // namespace
}  // namespace shoal::privacy
