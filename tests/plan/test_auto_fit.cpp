// Fitting the auto cost model (treeattn calibrate --auto-cost): the
// non-negative least squares, the fit on samples whose times a known model
// made, the margin rule, and the samples' JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "support/error_text.hpp"
#include "treeattn/cost_models.hpp"

namespace treeattn {
namespace {

// KKT conditions of min |Ax - b| s.t. x >= 0 at x: x >= 0, the gradient
// w = A^T (b - A x) is ~0 where x > 0 and <= ~0 where x = 0.
void expect_kkt(const std::vector<double>& a, size_t rows, size_t cols, const std::vector<double>& b,
                const std::vector<double>& x) {
  ASSERT_EQ(x.size(), cols);
  std::vector<double> w(cols, 0.0);
  double scale = 0;
  for (size_t i = 0; i < rows; ++i) {
    double r = b[i];
    for (size_t j = 0; j < cols; ++j) r -= a[i * cols + j] * x[j];
    for (size_t j = 0; j < cols; ++j) {
      w[j] += a[i * cols + j] * r;
      scale = std::max(scale, std::abs(a[i * cols + j] * b[i]));
    }
  }
  const double tol = 1e-8 * std::max(scale, 1.0) * double(rows);
  for (size_t j = 0; j < cols; ++j) {
    EXPECT_GE(x[j], 0) << "x[" << j << "]";
    if (x[j] > 0) EXPECT_NEAR(w[j], 0, tol) << "column " << j << " is free: its gradient must vanish";
    else EXPECT_LE(w[j], tol) << "column " << j << " is at 0: moving it up must not lower the residual";
  }
}

TEST(AutoCostFit, NonnegativeLeastSquaresMeetsKktOnRandomProblems) {
  std::mt19937 rng(7);
  std::normal_distribution<double> n01;
  int clamped = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const size_t rows = 5 + trial % 40, cols = 1 + trial % 9;
    std::vector<double> a(rows * cols), b(rows);
    for (double& v : a) v = n01(rng);
    for (double& v : b) v = n01(rng);
    const std::vector<double> x = nonnegative_least_squares(a, rows, cols, b);
    expect_kkt(a, rows, cols, b, x);
    for (double v : x) clamped += v == 0;
  }
  EXPECT_GT(clamped, 100) << "random problems must exercise the constraint";
}

TEST(AutoCostFit, NonnegativeLeastSquaresIsPlainLeastSquaresWhenThatIsPositive) {
  // b = A x* with x* > 0: the unconstrained solution is feasible and exact.
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0.1, 2.0);
  const size_t rows = 30, cols = 6;
  std::vector<double> a(rows * cols), b(rows, 0.0), truth(cols);
  for (double& v : a) v = u(rng);
  for (double& v : truth) v = u(rng);
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) b[i] += a[i * cols + j] * truth[j];
  const std::vector<double> x = nonnegative_least_squares(a, rows, cols, b);
  for (size_t j = 0; j < cols; ++j) EXPECT_NEAR(x[j], truth[j], 1e-9) << j;
}

TEST(AutoCostFit, NonnegativeLeastSquaresHandlesZeroAndRepeatedColumns) {
  // Column 1 is zero, column 2 repeats column 0: any split of column 0's
  // weight between 0 and 2 is optimal; the residual is what must be right.
  const size_t rows = 4, cols = 3;
  const std::vector<double> a = {1, 0, 1, 2, 0, 2, 3, 0, 3, 4, 0, 4};
  const std::vector<double> b = {2, 4, 6, 8};
  const std::vector<double> x = nonnegative_least_squares(a, rows, cols, b);
  EXPECT_EQ(x[1], 0);
  EXPECT_NEAR(x[0] + x[2], 2, 1e-12);
  expect_kkt(a, rows, cols, b, x);
  EXPECT_THROW(nonnegative_least_squares(a, rows, cols + 1, b), Error);
}

// Samples whose times a known model produced (features random, >= 0).
std::vector<AutoCostSample> model_samples(const AutoCostFeatures& coef, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<AutoCostSample> out;
  for (int i = 0; i < n; ++i) {
    AutoCostSample s;
    s.config = "sample " + std::to_string(i);
    s.group = i % 3 == 0 ? "a" : "b";
    for (int f = 0; f < kAutoCostFeatures; ++f) {
      s.per_query[f] = f == 0 ? 1 : 10 * u(rng);
      s.node[f] = f == 0 ? 1 : 10 * u(rng);
    }
    for (int f = 0; f < kAutoCostFeatures; ++f) {
      s.per_query_us += coef[f] * s.per_query[f];
      s.node_us += coef[f] * s.node[f];
    }
    out.push_back(s);
  }
  return out;
}

TEST(AutoCostFit, RecoversTheModelThatMadeTheTimes) {
  const AutoCostFeatures coef = {0.7, 7.6, 0.12, 0.17, 0.55, 7.1, 6.3, 0.2, 0.0, 2.5};
  const std::vector<AutoCostSample> samples = model_samples(coef, 80, 11);
  const AutoCostModel m = fit_auto_cost_model(samples);
  for (int f = 0; f < kAutoCostFeatures; ++f) EXPECT_NEAR(m.coefficients[f], coef[f], 1e-7) << kAutoCostFeatureNames[f];
  // An exact model picks the faster plan everywhere, at margin 0.
  EXPECT_EQ(auto_cost_hits(m, samples), int(samples.size()));
  EXPECT_EQ(m.margin, 0);
  for (const AutoCostSample& s : samples) {
    EXPECT_NEAR(m.predict(s.node), s.node_us, 1e-6 * s.node_us);
    EXPECT_EQ(auto_picks_per_query(m, s), s.per_query_us < s.node_us) << s.config;
  }
}

TEST(AutoCostFit, MarginIsTheSmallestWithTheMostHits) {
  // Times from a model, then node made 4 % faster on every sample where
  // per-query is predicted ahead by less than 6 %: the fit cannot know that
  // (its features did not change), so a margin that keeps node there scores
  // more hits.
  const AutoCostFeatures coef = {1.0, 2.0, 0.5, 0.0, 1.0, 0.5, 0.2, 0.0, 0.0, 0.3};
  std::vector<AutoCostSample> samples = model_samples(coef, 300, 5);
  int nudged = 0;
  for (AutoCostSample& s : samples)
    if (s.per_query_us < s.node_us && s.per_query_us > 0.94 * s.node_us) {
      s.node_us = s.per_query_us * 0.96;
      ++nudged;
    }
  ASSERT_GT(nudged, 5);
  const AutoCostModel m = fit_auto_cost_model(samples);
  EXPECT_GT(m.margin, 0) << "the nudged samples want node kept where per-query is predicted ahead by little";
  const int hits = auto_cost_hits(m, samples);
  AutoCostModel other = m;
  for (int i = 0; i <= 10; ++i) {
    other.margin = i / 100.0;
    const int h = auto_cost_hits(other, samples);
    EXPECT_LE(h, hits) << "margin " << other.margin << " scores more than the chosen " << m.margin;
    if (other.margin < m.margin) EXPECT_LT(h, hits) << "a smaller margin with as many hits: " << other.margin;
  }
}

TEST(AutoCostFit, ShapeMarginsAreThePairWithTheMostHitsThenTheLowestTime) {
  // Every pair runs within the slack of the best plan except where noted.
  std::vector<AutoCostSample> samples = model_samples({1, 2, 0.5, 0, 1, 0.5, 0.2, 0, 0, 0.3}, 6, 3);
  for (AutoCostSample& s : samples) s.shape_us.assign(kShapeMarginPairs, std::min(s.per_query_us, s.node_us));
  // Smaller-tiles margins below 0.05 are 10 % slow on two samples, and so is
  // a wider-units margin of 0.2 on one: the most hits are at 0.05.. for
  // tiles and below 0.2 for widths.
  for (size_t pair = 0; pair < kShapeMarginPairs; ++pair) {
    const auto [tiles, wide] = shape_margin_pair(pair);
    if (tiles < 0.05) samples[0].shape_us[pair] *= 1.10, samples[1].shape_us[pair] *= 1.10;
    if (wide >= 0.2) samples[2].shape_us[pair] *= 1.10;
    // Within the slack, a pair 2 % faster on one sample: the lower geomean.
    if (tiles == 0.15 && wide == 0.025) samples[3].shape_us[pair] *= 0.98;
  }
  const ShapeMargins m = choose_shape_margins(samples);
  EXPECT_EQ(m.smaller_tiles, 0.15);
  EXPECT_EQ(m.wider_units, 0.025);
  EXPECT_EQ(m.hits, 6);
  EXPECT_LT(m.geomean, 1.0);
  const ShapeMargins worst = score_shape_margins(samples, shape_margin_index(0, 0.2));
  EXPECT_EQ(worst.hits, 3);
  EXPECT_GT(worst.geomean, 1.0);
  // Without the faster pair every pair of the most hits ties: the one nearest
  // the defaults (0.10, 0.05) wins.
  samples[3].shape_us[shape_margin_index(0.15, 0.025)] /= 0.98;
  const ShapeMargins tie = choose_shape_margins(samples);
  EXPECT_EQ(tie.smaller_tiles, AutoCostModel{}.smaller_tiles_margin);
  EXPECT_EQ(tie.wider_units, AutoCostModel{}.wider_units_margin);
  // The pair index and the margins map both ways; a margin off the steps has no index.
  for (size_t pair = 0; pair < kShapeMarginPairs; ++pair)
    EXPECT_EQ(shape_margin_index(shape_margin_pair(pair).first, shape_margin_pair(pair).second), pair);
  EXPECT_EQ(shape_margin_index(0.12, 0.05), kShapeMarginPairs);
  EXPECT_THROW(score_shape_margins(samples, kShapeMarginPairs), Error);
  // Every sample needs one time per pair.
  samples[4].shape_us.pop_back();
  const std::string e = test_support::error_text([&] { choose_shape_margins(samples); });
  EXPECT_NE(e.find("samples[4]"), std::string::npos) << e;
  EXPECT_NE(e.find("expected " + std::to_string(kShapeMarginPairs)), std::string::npos) << e;
}

TEST(AutoCostFit, RefusesBadSamples) {
  EXPECT_THROW(fit_auto_cost_model({}), Error);
  std::vector<AutoCostSample> samples = model_samples({1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 4, 1);
  samples[2].node_us = 0;
  const auto fit_error = [&] { return test_support::error_text([&] { fit_auto_cost_model(samples); }); };
  EXPECT_NE(fit_error().find("samples[2]"), std::string::npos) << fit_error();
  samples[2].node_us = 1;
  samples[3].per_query[4] = NAN;
  EXPECT_NE(fit_error().find("samples[3] (sample 3): feature partial_mb"), std::string::npos) << fit_error();
}

TEST(AutoCostFit, SamplesRoundTripThroughJsonAndErrorsNameTheField) {
  AutoCostSamples d;
  d.device = "GPU X";
  d.commit = "abc";
  d.date = "2026-11-26";
  d.command = "treeattn calibrate --auto";
  d.samples = model_samples({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 3, 2);
  d.samples[1].auto_us = 12.5;  // optional: only where auto's plan was timed
  d.samples[2].shape_us.assign(kShapeMarginPairs, 3.25);  // optional likewise
  d.samples[2].shape_us[7] = 4.5;
  const AutoCostSamples back = parse_auto_cost_samples(to_json(d));
  EXPECT_EQ(back.samples[0].auto_us, 0);
  EXPECT_EQ(back.samples[1].auto_us, 12.5);
  EXPECT_TRUE(back.samples[1].shape_us.empty());
  EXPECT_EQ(back.samples[2].shape_us, d.samples[2].shape_us);
  EXPECT_EQ(back.device, d.device);
  EXPECT_EQ(back.command, d.command);
  ASSERT_EQ(back.samples.size(), d.samples.size());
  for (size_t i = 0; i < d.samples.size(); ++i) {
    EXPECT_EQ(back.samples[i].config, d.samples[i].config);
    EXPECT_EQ(back.samples[i].group, d.samples[i].group);
    EXPECT_EQ(back.samples[i].node_us, d.samples[i].node_us);
    EXPECT_EQ(back.samples[i].per_query, d.samples[i].per_query);
    EXPECT_EQ(back.samples[i].node, d.samples[i].node);
  }
  const auto error_of = [](const std::string& text) {
    return test_support::error_text([&] { parse_auto_cost_samples(text); });
  };
  const std::string head = R"({"format": "treeattn-auto-cost-samples/1", "samples": [)";
  const std::string features =
      R"({"const": 1, "launches": 1, "kv_mb": 1, "unique_kv_mb": 1, "partial_mb": 0, "max_unit_kt": 1, "kctas": 1, "ksegments": 1, "padded_gflop": 1, "wave_kt": 1})";
  const std::string good = R"({"config": "c", "per_query_us": 2, "node_us": 1, "per_query": )" + features +
                           R"(, "node": )" + features + "}";
  EXPECT_EQ(parse_auto_cost_samples(head + good + "]}").samples.size(), 1u);
  EXPECT_NE(error_of(R"({"format": "x", "samples": []})").find("format"), std::string::npos);
  EXPECT_NE(error_of(head + "{}]}").find("samples[0].config"), std::string::npos);
  std::string bad_auto = good;
  bad_auto.replace(bad_auto.find(R"("node_us": 1)"), 12, R"("node_us": 1, "auto_us": 0)");
  EXPECT_NE(error_of(head + bad_auto + "]}").find("samples[0].auto_us = 0"), std::string::npos) << error_of(head + bad_auto + "]}");
  std::string short_shape = good;
  short_shape.replace(short_shape.find(R"("node_us": 1)"), 12, R"("node_us": 1, "shape_us": [1, 2])");
  EXPECT_NE(error_of(head + short_shape + "]}").find("samples[0].shape_us is not an array of"), std::string::npos)
      << error_of(head + short_shape + "]}");
  std::string bad_shape = good;
  std::string times = "[";
  for (size_t k = 0; k < kShapeMarginPairs; ++k) times += k == 5 ? "\"x\", " : "1, ";
  times.replace(times.size() - 2, 2, "]");
  bad_shape.replace(bad_shape.find(R"("node_us": 1)"), 12, R"("node_us": 1, "shape_us": )" + times);
  EXPECT_NE(error_of(head + bad_shape + "]}").find("samples[0].shape_us[5] = \"x\""), std::string::npos)
      << error_of(head + bad_shape + "]}");
  EXPECT_NE(error_of(head + good + R"(, {"config": "d", "per_query_us": -1}]})").find("samples[1].per_query_us"),
            std::string::npos);
  std::string bad_feature = good;
  bad_feature.replace(bad_feature.find(R"("kv_mb": 1)"), 10, R"("kv_mb": "x")");
  EXPECT_NE(error_of(head + bad_feature + "]}").find("samples[0].per_query.kv_mb"), std::string::npos)
      << error_of(head + bad_feature + "]}");
  std::string extra = good;
  extra.replace(extra.find(R"("const": 1)"), 10, R"("const": 1, "bogus": 2)");
  EXPECT_NE(error_of(head + extra + "]}").find("samples[0].per_query.bogus"), std::string::npos);
  EXPECT_NE(error_of("[").find("parse error"), std::string::npos);
}

}  // namespace
}  // namespace treeattn
