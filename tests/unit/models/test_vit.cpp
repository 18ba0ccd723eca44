// ViT: timm's vit_base_patch32_224 names, shapes and size; a tiny ViT's forward and errors; and numerical
// parity of a tiny ViT with an independent float64 reference written in Python from PyTorch primitives.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cohort/models/Vit.h"
#include "cohort/util/Error.h"

using namespace cohort;

namespace {

using Shape = std::vector<int64_t>;

models::VitOptions tiny_options() {
  models::VitOptions o;
  o.image_size = 64;
  o.patch = 16;  // a 4 x 4 grid, so the patch order and position embedding are exercised
  o.dim = 64;
  o.depth = 2;
  o.heads = 4;
  o.mlp_ratio = 4;
  o.in_channels = 3;
  o.num_classes = 10;
  return o;
}

// The reference forward: no nn modules, no F.conv2d / F.layer_norm / F.gelu / F.softmax, one head at a
// time, float64. The patch embedding is a matmul over explicitly cut patches, so it checks the conv too.
constexpr const char* kReferenceScript = R"PY(
import math, sys, torch
d, patch, heads, depth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
T = {}
for line in open(d + '/index.txt'):
    name, *shape = line.split()
    raw = open(d + '/' + name + '.bin', 'rb').read()
    T[name] = torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape([int(s) for s in shape]).double()

def lin(x, p): return x @ T[p + '.weight'].t() + T[p + '.bias']
def ln(x, p):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-6) * T[p + '.weight'] + T[p + '.bias']
def gelu(x): return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))

x = T['input']
B, C, H, W = x.shape
D = T['cls_token'].shape[-1]
hd = D // heads
patches = x.reshape(B, C, H // patch, patch, W // patch, patch).permute(0, 2, 4, 1, 3, 5).reshape(B, -1, C * patch * patch)
x = patches @ T['patch_embed.proj.weight'].reshape(D, -1).t() + T['patch_embed.proj.bias']
x = torch.cat([T['cls_token'].expand(B, 1, D), x], 1) + T['pos_embed']
for i in range(depth):
    b = 'blocks.%d.' % i
    qkv = lin(ln(x, b + 'norm1'), b + 'attn.qkv')  # features ordered (q|k|v, head, head_dim)
    outs = []
    for h in range(heads):
        q, k, v = (qkv[:, :, s * D + h * hd: s * D + (h + 1) * hd] for s in range(3))
        a = (q @ k.transpose(1, 2)) / math.sqrt(hd)
        a = torch.exp(a - a.max(-1, keepdim=True).values)
        outs.append((a / a.sum(-1, keepdim=True)) @ v)
    x = x + lin(torch.cat(outs, -1), b + 'attn.proj')
    x = x + lin(gelu(lin(ln(x, b + 'norm2'), b + 'mlp.fc1')), b + 'mlp.fc2')
logits = lin(ln(x, 'norm')[:, 0], 'head')
for value in logits.flatten().tolist():
    print(repr(value))
)PY";

void write_tensor(const std::filesystem::path& dir, std::ofstream& index, const std::string& name,
                  const at::Tensor& t) {
  const at::Tensor c = t.detach().to(torch::kFloat32).contiguous();
  index << name;
  for (int64_t s : c.sizes()) index << ' ' << s;
  index << '\n';
  std::ofstream out(dir / (name + ".bin"), std::ios::binary);
  out.write(reinterpret_cast<const char*>(c.data_ptr<float>()),
            static_cast<std::streamsize>(c.numel() * sizeof(float)));
  ASSERT_TRUE(out.good()) << "writing " << name;
}

// Runs `command` and returns (exit status, stdout+stderr).
std::pair<int, std::string> run(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  return {pclose(pipe), output};
}

}  // namespace

TEST(Vit, B32HasTimmNamesShapesAndSize) {
  auto net = models::make_vit_b32(3, 224, 1000);
  std::vector<std::pair<std::string, Shape>> expected = {{"cls_token", {1, 1, 768}},
                                                         {"pos_embed", {1, 1 + 7 * 7, 768}},
                                                         {"patch_embed.proj.weight", {768, 3, 32, 32}},
                                                         {"patch_embed.proj.bias", {768}}};
  for (int i = 0; i < 12; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".";
    const std::vector<std::pair<std::string, Shape>> block = {
        {"norm1.weight", {768}},          {"norm1.bias", {768}},
        {"attn.qkv.weight", {2304, 768}}, {"attn.qkv.bias", {2304}},
        {"attn.proj.weight", {768, 768}}, {"attn.proj.bias", {768}},
        {"norm2.weight", {768}},          {"norm2.bias", {768}},
        {"mlp.fc1.weight", {3072, 768}},  {"mlp.fc1.bias", {3072}},
        {"mlp.fc2.weight", {768, 3072}},  {"mlp.fc2.bias", {768}}};
    for (const auto& [n, s] : block) expected.emplace_back(b + n, s);
  }
  expected.insert(expected.end(),
                  {{"norm.weight", {768}}, {"norm.bias", {768}}, {"head.weight", {1000, 768}}, {"head.bias", {1000}}});

  const auto params = net->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  int64_t count = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(params[i].key(), expected[i].first) << "entry " << i;
    EXPECT_EQ(params[i].value().sizes().vec(), expected[i].second) << expected[i].first;
    count += params[i].value().numel();
  }
  EXPECT_EQ(count, 88224232);                  // timm's vit_base_patch32_224
  EXPECT_EQ(net->named_buffers().size(), 0u);  // the state_dict is exactly these parameters

  // timm 0.9's initialization (see Vit.cpp): trunc-normal 0.02 Linears with zero bias, cls_token normal
  // 1e-6, LayerNorm ones/zeros.
  const auto& p = params;
  const auto std_of = [&](const std::string& name) { return p[name].std().item<double>(); };
  EXPECT_NEAR(std_of("blocks.0.attn.qkv.weight"), 0.02, 5e-4);
  EXPECT_NEAR(std_of("head.weight"), 0.02, 5e-4);
  EXPECT_NEAR(std_of("pos_embed"), 0.02, 1e-3);
  EXPECT_LT(std_of("cls_token"), 1e-5);
  EXPECT_LT(p["blocks.11.mlp.fc2.weight"].abs().max().item<double>(), 2.0);
  EXPECT_EQ(p["blocks.3.mlp.fc1.bias"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(p["head.bias"].abs().max().item<double>(), 0.0);
  EXPECT_TRUE(p["norm.weight"].eq(1).all().item<bool>());
  EXPECT_EQ(p["blocks.5.norm2.bias"].abs().max().item<double>(), 0.0);
}

TEST(Vit, TinyForwardBackwardAndErrors) {
  auto net = models::make_vit(tiny_options());
  auto out = net->forward(torch::randn({2, 3, 64, 64}));
  EXPECT_EQ(out.sizes().vec(), (Shape{2, 10}));
  out.sum().backward();
  for (const auto& p : net->named_parameters())
    EXPECT_TRUE(p.value().grad().defined() && p.value().grad().abs().sum().item<double>() > 0) << p.key();

  // Images the position embedding was not built for.
  EXPECT_THROW(net->forward(torch::randn({2, 3, 32, 32})), ConfigError);

  try {
    models::make_vit_b32(1, 28, 10);
    FAIL() << "image size 28 must be refused";
  } catch (const ConfigError& e) {
    const std::string text = e.describe();
    EXPECT_NE(text.find("vit_b32"), std::string::npos) << text;
    EXPECT_NE(text.find("multiple of"), std::string::npos) << text;
    EXPECT_NE(text.find("28"), std::string::npos) << text;
    EXPECT_NE(text.find("resize"), std::string::npos) << text;
  }
  auto bad_heads = tiny_options();
  bad_heads.heads = 5;
  EXPECT_THROW(models::make_vit(bad_heads), ConfigError);
}

TEST(Vit, MatchesIndependentPythonReference) {
  if (run("timeout 60 /usr/bin/python3 -c 'import torch'").first != 0) {
    GTEST_SKIP() << "/usr/bin/python3 cannot import torch, so the reference forward cannot run";
  }

  const auto o = tiny_options();
  torch::manual_seed(1234);
  auto net = models::make_vit(o);
  // Random values everywhere (the initialization has zero biases, unit norms and a near-zero cls_token,
  // which would hide mistakes in those terms).
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.normal_(0.0, 0.3);
  }
  net->eval();
  const at::Tensor input = torch::randn({2, o.in_channels, o.image_size, o.image_size});
  at::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = net->forward(input);
  }

  const auto dir = std::filesystem::temp_directory_path() / ("cohort_vit_parity_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  {
    std::ofstream index(dir / "index.txt");
    for (const auto& p : net->named_parameters()) write_tensor(dir, index, p.key(), p.value());
    write_tensor(dir, index, "input", input);
    std::ofstream(dir / "reference.py") << kReferenceScript;
  }
  const auto [status, output] =
      run("timeout 60 /usr/bin/python3 " + (dir / "reference.py").string() + " " + dir.string() + " " +
          std::to_string(o.patch) + " " + std::to_string(o.heads) + " " + std::to_string(o.depth));
  std::filesystem::remove_all(dir);
  ASSERT_EQ(status, 0) << output;

  std::vector<double> expected;
  std::istringstream lines(output);
  for (double v; lines >> v;) expected.push_back(v);
  ASSERT_EQ(static_cast<int64_t>(expected.size()), logits.numel()) << output;
  const at::Tensor reference = torch::tensor(expected, torch::kFloat64).reshape(logits.sizes());
  const double max_error = (logits.to(torch::kFloat64) - reference).abs().max().item<double>();
  EXPECT_LT(max_error, 1e-4) << "ours\n" << logits << "\nreference\n" << reference;
  // The logits must not be trivially small, or the comparison would say little.
  EXPECT_GT(reference.abs().max().item<double>(), 0.1);
}
