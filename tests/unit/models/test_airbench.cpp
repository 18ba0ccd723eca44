// airbench94's network (names, shapes, frozen parameters, whitening and identity init), the EMA and lookahead
// with closed-form expected values, and test-time augmentation against views computed by hand.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cohort/models/Airbench.h"
#include "cohort/models/TestTimeAugmentation.h"
#include "cohort/optim/Ema.h"
#include "cohort/util/Error.h"

using namespace cohort;

namespace {

using Shape = std::vector<int64_t>;

std::shared_ptr<models::AirbenchNet> airbench(int64_t in_channels = 3, int64_t num_classes = 10,
                                              int64_t width_scale = 1) {
  return std::dynamic_pointer_cast<models::AirbenchNet>(models::make_airbench(in_channels, num_classes, width_scale));
}

Shape shape_of(const at::Tensor& t) { return t.sizes().vec(); }

}  // namespace

TEST(Airbench, ParameterNamesAndShapes) {
  torch::manual_seed(0);
  auto net = airbench();
  ASSERT_NE(net, nullptr);
  std::vector<std::pair<std::string, Shape>> expected = {{"whiten.weight", {24, 3, 2, 2}}, {"whiten.bias", {24}}};
  const std::vector<std::pair<int64_t, int64_t>> groups = {{24, 64}, {64, 256}, {256, 256}};
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    const auto [in, out] = groups[i];
    expected.push_back({p + "conv1.weight", {out, in, 3, 3}});
    expected.push_back({p + "norm1.weight", {out}});
    expected.push_back({p + "norm1.bias", {out}});
    expected.push_back({p + "conv2.weight", {out, out, 3, 3}});
    expected.push_back({p + "norm2.weight", {out}});
    expected.push_back({p + "norm2.bias", {out}});
  }
  expected.push_back({"head.weight", {10, 256}});

  const auto params = net->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  int64_t count = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(params[i].key(), expected[i].first);
    EXPECT_EQ(shape_of(params[i].value()), expected[i].second) << expected[i].first;
    count += params[i].value().numel();
  }
  // 24*12+24 + (24*64*9 + 64*64*9 + 4*64) + (64*256*9 + 256*256*9 + 4*256) + (2*256*256*9 + 4*256) + 256*10
  EXPECT_EQ(count, 1972792);

  // Each BatchNorm has running_mean, running_var, num_batches_tracked; no other buffers.
  const auto buffers = net->named_buffers();
  EXPECT_EQ(buffers.size(), 3u * 2u * 3u);
  EXPECT_NE(buffers.find("layers.2.norm2.running_var"), nullptr);

  auto wide = airbench(1, 7, 2);
  EXPECT_EQ(shape_of(wide->named_parameters()["whiten.weight"]), (Shape{8, 1, 2, 2}));
  EXPECT_EQ(shape_of(wide->named_parameters()["layers.0.conv1.weight"]), (Shape{128, 8, 3, 3}));
  EXPECT_EQ(shape_of(wide->named_parameters()["head.weight"]), (Shape{7, 512}));
}

TEST(Airbench, ForwardShapeAndErrors) {
  torch::manual_seed(0);
  auto net = airbench();
  const at::Tensor x = torch::randn({8, 3, 32, 32});
  EXPECT_EQ(shape_of(net->forward(x)), (Shape{8, 10}));
  net->eval();
  EXPECT_EQ(shape_of(net->forward(x)), (Shape{8, 10}));
  EXPECT_THROW(net->forward(torch::randn({2, 1, 32, 32})), ConfigError);
  EXPECT_THROW(net->forward(torch::randn({2, 3, 8, 8})), ConfigError);
  EXPECT_THROW(models::make_airbench(3, 10, 0), ConfigError);
}

TEST(Airbench, FrozenParametersAndBatchNormSettings) {
  auto net = airbench();
  std::set<std::string> no_grad;
  for (const auto& p : net->named_parameters())
    if (!p.value().requires_grad()) no_grad.insert(p.key());
  const auto frozen = net->frozen_parameter_names();
  EXPECT_EQ(std::set<std::string>(frozen.begin(), frozen.end()), no_grad);
  EXPECT_EQ(frozen.size(), 7u);  // whiten.weight and six BatchNorm weights
  EXPECT_TRUE(no_grad.count("whiten.weight"));
  EXPECT_FALSE(no_grad.count("whiten.bias"));
  EXPECT_FALSE(no_grad.count("layers.1.norm2.bias"));

  for (const auto& group : net->groups()) {
    for (const auto* bn : {&group->norm1, &group->norm2}) {
      EXPECT_EQ((*bn)->options.eps(), 1e-12);
      ASSERT_TRUE((*bn)->options.momentum().has_value());
      EXPECT_DOUBLE_EQ(*(*bn)->options.momentum(), 0.4);  // airbench's 0.6 in decay form
      EXPECT_TRUE(torch::equal((*bn)->weight, torch::ones_like((*bn)->weight)));
    }
  }
  // Backward leaves frozen parameters without gradients.
  net->forward(torch::randn({4, 3, 32, 32})).sum().backward();
  for (const auto& p : net->named_parameters())
    EXPECT_EQ(p.value().grad().defined(), p.value().requires_grad()) << p.key();
}

TEST(Airbench, WhiteningGivesIdentityPatchCovariance) {
  torch::manual_seed(1);
  // Correlated across channels (a random mixing) and in space (each pixel shares its right and lower
  // neighbours), with very different scales per channel.
  at::Tensor z = torch::randn({256, 3, 17, 17});
  z = z.narrow(2, 0, 16).narrow(3, 0, 16) + 0.7 * z.narrow(2, 1, 16).narrow(3, 0, 16) +
      0.5 * z.narrow(2, 0, 16).narrow(3, 1, 16);
  const at::Tensor mix = torch::tensor({{1.0, 0.0, 0.0}, {0.8, 0.3, 0.0}, {-0.5, 2.0, 4.0}});
  const at::Tensor x = torch::einsum("oc,nchw->nohw", {mix, z}).contiguous();

  auto net = airbench();
  net->init_whitening(x);
  const at::Tensor w = net->whiten()->weight;
  EXPECT_FALSE(w.requires_grad());
  EXPECT_TRUE(torch::equal(w.narrow(0, 12, 12), -w.narrow(0, 0, 12)));

  // The conv without its bias, over every 2x2 patch: second moment of the first 12 channels ~ identity (the
  // eigenvalues here are >= ~0.1, so eps 5e-4 shrinks the diagonal by < 1%).
  torch::NoGradGuard no_grad;
  const at::Tensor out = torch::conv2d(x, w.narrow(0, 0, 12));  // [N, 12, 15, 15]
  const at::Tensor flat = out.permute({0, 2, 3, 1}).reshape({-1, 12}).to(torch::kDouble);
  const at::Tensor cov = flat.t().matmul(flat) / static_cast<double>(flat.size(0));
  const at::Tensor eye = torch::eye(12, torch::kDouble);
  EXPECT_LT((cov.diagonal() - 1).abs().max().item<double>(), 0.02) << cov;
  EXPECT_LT(((cov - eye) * (1 - eye)).abs().max().item<double>(), 0.01) << cov;
  // Filters come largest eigenvalue first: filter k has norm 1 / sqrt(eigenvalue_k + eps), so the norms grow.
  const at::Tensor norms = w.narrow(0, 0, 12).flatten(1).norm(2, 1);
  EXPECT_TRUE((norms.narrow(0, 1, 11) >= norms.narrow(0, 0, 11) * (1 - 1e-5)).all().item<bool>()) << norms;
  EXPECT_THROW(net->init_whitening(torch::randn({4, 1, 8, 8})), ConfigError);
}

TEST(Airbench, DiracInitMakesFirstChannelsIdentity) {
  torch::manual_seed(2);
  auto net = airbench();
  torch::NoGradGuard no_grad;
  // Copies of the module holders share the modules; they are taken only because the accessors are const.
  torch::nn::Conv2d conv1 = net->groups()[0]->conv1, conv2 = net->groups()[0]->conv2;
  torch::nn::Conv2d next = net->groups()[1]->conv1;
  const at::Tensor x = torch::randn({2, 24, 8, 8});
  // conv1 is 24 -> 64: output channels 0..23 copy the input; the other 40 are default-initialised.
  EXPECT_TRUE(torch::allclose(conv1(x).narrow(1, 0, 24), x));
  EXPECT_GT(conv1->weight.narrow(0, 24, 40).abs().sum().item<double>(), 0.0);
  // conv2 is 64 -> 64: a pure identity.
  const at::Tensor h = torch::randn({2, 64, 8, 8});
  EXPECT_TRUE(torch::allclose(conv2(h), h));
  // Group 1's conv1 is 64 -> 256: its first 64 channels copy the input.
  EXPECT_TRUE(torch::allclose(next(h).narrow(1, 0, 64), h));
}

namespace {

// A parameter, a float buffer and an integer buffer (which the EMA must skip).
struct TinyImpl : torch::nn::Module {
  TinyImpl() {
    w = register_parameter("w", torch::tensor({1.0f, -2.0f}));
    b = register_buffer("b", torch::tensor({10.0f}));
    steps = register_buffer("steps", torch::tensor({3}, torch::kLong));
  }
  at::Tensor w, b, steps;
};
TORCH_MODULE(Tiny);

void assign(at::Tensor t, std::vector<float> values) {
  torch::NoGradGuard no_grad;
  t.copy_(torch::tensor(values));
}

void expect_values(const at::Tensor& t, std::vector<float> values) {
  EXPECT_TRUE(torch::allclose(t, torch::tensor(values), 1e-6, 1e-6)) << t;
}

}  // namespace

TEST(Ema, ClosedFormAfterTwoUpdates) {
  Tiny m;
  optim::Ema ema(*m, 0.9);  // average starts at w0 = (1, -2), b0 = 10
  assign(m->w, {3, 0});
  assign(m->b, {20});
  ema.update(*m);  // 0.9 * w0 + 0.1 * w1
  assign(m->w, {5, 4});
  assign(m->b, {0});
  ema.update(*m);  // 0.81 * w0 + 0.09 * w1 + 0.1 * w2
  const auto state = ema.state_dict();
  ASSERT_EQ(state.size(), 2u);  // the integer buffer is not averaged
  EXPECT_EQ(state[0].first, "w");
  EXPECT_EQ(state[1].first, "b");
  expect_values(state[0].second, {0.81f * 1 + 0.09f * 3 + 0.1f * 5, 0.81f * -2 + 0.09f * 0 + 0.1f * 4});
  expect_values(state[1].second, {0.81f * 10 + 0.09f * 20});
  expect_values(m->w, {5, 4});  // update leaves the module alone
  EXPECT_EQ(ema.num_updates(), 2);

  ema.swap_in(*m);
  expect_values(m->w, {0.81f * 1 + 0.09f * 3 + 0.1f * 5, 0.81f * -2 + 0.1f * 4});  // (1.58, -1.22)
  EXPECT_THROW(ema.update(*m), std::logic_error);
  ema.swap_out(*m);
  expect_values(m->w, {5, 4});
  expect_values(m->b, {0});
  EXPECT_TRUE(m->w.requires_grad());

  // Explicit decay, and the every-k form.
  ema.update(*m, 0.0);
  expect_values(ema.state_dict()[0].second, {5, 4});
  EXPECT_DOUBLE_EQ(optim::Ema::decay_every(0.9, 3), 0.9 * 0.9 * 0.9);
  EXPECT_THROW(optim::Ema(*m, 1.5), ConfigError);

  // Checkpoint round trip and errors.
  Tiny other;
  optim::Ema restored(*other, 0.9);
  restored.load_state_dict(ema.state_dict());
  restored.copy_to(*other);
  expect_values(other->w, {5, 4});
  EXPECT_THROW(restored.load_state_dict({{"w", torch::zeros({2})}}), CheckpointError);
  EXPECT_THROW(restored.load_state_dict({{"w", torch::zeros({3})}, {"b", torch::zeros({1})}}), CheckpointError);
  EXPECT_THROW(restored.load_state_dict({{"w", torch::zeros({2})}, {"b", torch::zeros({1})}, {"x", torch::zeros({1})}}),
               CheckpointError);
}

TEST(Ema, LookaheadPullsWeightsToTheAverage) {
  Tiny m;
  optim::Ema ema(*m, 0.99);  // w0 = (1, -2)
  assign(m->w, {3, 2});
  ema.lookahead(*m, 0.5);  // average = 0.5 * w0 + 0.5 * w1 = (2, 0), and the weights jump there
  expect_values(ema.state_dict()[0].second, {2, 0});
  expect_values(m->w, {2, 0});
  assign(m->w, {7, 10});   // training moves on from the average
  ema.lookahead(*m, 0.8);  // 0.8 * (2, 0) + 0.2 * (7, 10)
  expect_values(m->w, {3, 2});
  assign(m->w, {100, 100});
  ema.lookahead(*m, 1.0);  // airbench's end-of-epoch copy back
  expect_values(m->w, {3, 2});
  EXPECT_DOUBLE_EQ(optim::airbench_lookahead_decay(50, 100), std::pow(0.95, 5) * 0.125);

  // On the real network the BatchNorm statistics are averaged and the step counters are not.
  auto net = airbench();
  optim::Ema net_ema(*net, 0.9);
  std::set<std::string> names;
  for (const auto& entry : net_ema.state_dict()) names.insert(entry.first);
  EXPECT_TRUE(names.count("layers.0.norm1.running_mean"));
  EXPECT_FALSE(names.count("layers.0.norm1.num_batches_tracked"));
  EXPECT_EQ(names.size(), net->named_parameters().size() + 2u * 6u);
}

namespace {

// Sees the image only through x + mirror(x), so it is mirror-invariant by construction.
struct MirrorInvariant : models::Classifier {
  MirrorInvariant() { fc = register_module("fc", torch::nn::Linear(3 * 6 * 6, 4)); }
  at::Tensor forward_impl(at::Tensor x) override { return fc((x + x.flip({-1})).flatten(1)); }
  torch::nn::Linear fc{nullptr};
};

// An ordinary linear classifier: no symmetry at all.
struct Plain : models::Classifier {
  Plain() { fc = register_module("fc", torch::nn::Linear(3 * 6 * 6, 4)); }
  at::Tensor forward_impl(at::Tensor x) override { return fc(x.flatten(1)); }
  torch::nn::Linear fc{nullptr};
};

}  // namespace

TEST(TestTimeAugmentation, MirrorAndTranslate) {
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({5, 3, 6, 6});
  MirrorInvariant invariant;
  EXPECT_TRUE(torch::allclose(models::tta_logits(invariant, x, 1), models::tta_logits(invariant, x, 0)));

  Plain plain;
  torch::NoGradGuard no_grad;
  const at::Tensor flipped = x.flip({3});
  const at::Tensor by_hand1 = (plain.forward(x) + plain.forward(flipped)) / 2;
  EXPECT_TRUE(torch::allclose(models::tta_logits(plain, x, 1), by_hand1, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(models::tta_logits(plain, x, 0), plain.forward(x)));

  // Level 2 from views written out: a reflect-padded image (row/column -1 is row/column 1, 6 is 4), cropped
  // at the top-left ([-1, 5)) and the bottom-right ([1, 7)); weights 1/4 untranslated, 1/8 translated.
  const at::Tensor rows_up = torch::tensor({1, 0, 1, 2, 3, 4}, torch::kLong);    // indices -1..4
  const at::Tensor rows_down = torch::tensor({1, 2, 3, 4, 5, 4}, torch::kLong);  // indices 1..6
  const at::Tensor top_left = x.index_select(2, rows_up).index_select(3, rows_up);
  const at::Tensor bottom_right = x.index_select(2, rows_down).index_select(3, rows_down);
  const at::Tensor by_hand2 = 0.25 * plain.forward(x) + 0.25 * plain.forward(flipped) +
                              0.125 * plain.forward(top_left) + 0.125 * plain.forward(top_left.flip({3})) +
                              0.125 * plain.forward(bottom_right) + 0.125 * plain.forward(bottom_right.flip({3}));
  EXPECT_TRUE(torch::allclose(models::tta_logits(plain, x, 2), by_hand2, 1e-5, 1e-6));

  EXPECT_THROW(models::tta_logits(plain, x, 3), ConfigError);
  EXPECT_THROW(models::tta_logits(plain, x[0], 1), ConfigError);
}
