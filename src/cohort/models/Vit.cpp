#include "cohort/models/Vit.h"

#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "cohort/util/Error.h"

namespace cohort::models {
namespace {

namespace nn = torch::nn;

// timm's LayerNorm everywhere in a ViT uses eps 1e-6, not PyTorch's 1e-5; checkpoints are trained with it.
constexpr double kLayerNormEps = 1e-6;

// timm's trunc_normal_(std, a=-2, b=2): a normal distribution cut at absolute bounds [a, b]. At std 0.02 the
// bounds sit 100 standard deviations out, so redrawing the rare out-of-bounds values is exact and cheap.
// (The inverse-CDF method PyTorch uses maps a uniform draw of exactly -1 to -inf and then to the bound.)
void trunc_normal_(at::Tensor t, double std, double a = -2.0, double b = 2.0) {
  torch::NoGradGuard no_grad;
  t.normal_(0.0, std);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const at::Tensor outside = (t < a).logical_or_(t > b);
    if (!outside.any().item<bool>()) return;
    t.copy_(torch::where(outside, torch::empty_like(t).normal_(0.0, std), t));
  }
  t.clamp_(a, b);
}

// timm's init_weights_vit_timm for a Linear: truncated-normal weights (std 0.02), zero bias.
void init_linear(nn::Linear& linear) {
  trunc_normal_(linear->weight, 0.02);
  torch::NoGradGuard no_grad;
  linear->bias.zero_();
}

nn::LayerNorm layer_norm(int64_t dim) { return nn::LayerNorm(nn::LayerNormOptions({dim}).eps(kLayerNormEps)); }

// timm's PatchEmbed: a stride-`patch` convolution turns [B, C, H, W] into [B, (H/patch)*(W/patch), dim],
// patches in row-major order.
struct PatchEmbedImpl : nn::Module {
  PatchEmbedImpl(int64_t in_channels, int64_t dim, int64_t patch)
      : proj(register_module("proj", nn::Conv2d(nn::Conv2dOptions(in_channels, dim, patch).stride(patch)))) {}
  at::Tensor forward(const at::Tensor& x) { return proj(x).flatten(2).transpose(1, 2); }
  nn::Conv2d proj;
};
TORCH_MODULE(PatchEmbed);

// timm's Attention: one Linear makes q, k and v for all heads at once; heads are a batch dimension of the
// two matmuls, never a loop.
struct AttentionImpl : nn::Module {
  AttentionImpl(int64_t dim, int64_t heads)
      : heads(heads),
        head_dim(dim / heads),
        scale(1.0 / std::sqrt(static_cast<double>(dim / heads))),
        qkv(register_module("qkv", nn::Linear(dim, 3 * dim))),
        proj(register_module("proj", nn::Linear(dim, dim))) {}
  at::Tensor forward(const at::Tensor& x) {
    const int64_t batch = x.size(0), tokens = x.size(1), dim = x.size(2);
    // [B, N, 3*dim] -> [B, N, 3, heads, head_dim] -> [3, B, heads, N, head_dim]: timm's layout, which is
    // what fixes the meaning of the rows of a checkpoint's qkv weight.
    const auto qkv_heads = qkv(x).reshape({batch, tokens, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});
    const auto q = qkv_heads[0], k = qkv_heads[1], v = qkv_heads[2];
    const auto attn = torch::softmax(torch::matmul(q * scale, k.transpose(-2, -1)), -1);
    const auto out = torch::matmul(attn, v).transpose(1, 2).reshape({batch, tokens, dim});
    return proj(out);
  }
  int64_t heads, head_dim;
  double scale;
  nn::Linear qkv, proj;
};
TORCH_MODULE(Attention);

// timm's Mlp with exact (erf) GELU.
struct MlpImpl : nn::Module {
  MlpImpl(int64_t dim, int64_t hidden)
      : fc1(register_module("fc1", nn::Linear(dim, hidden))), fc2(register_module("fc2", nn::Linear(hidden, dim))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::gelu(fc1(x))); }
  nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

// timm's pre-norm Block: x + attn(norm1(x)), then + mlp(norm2(x)).
struct BlockImpl : nn::Module {
  BlockImpl(int64_t dim, int64_t heads, int64_t mlp_hidden)
      : norm1(register_module("norm1", layer_norm(dim))),
        attn(register_module("attn", Attention(dim, heads))),
        norm2(register_module("norm2", layer_norm(dim))),
        mlp(register_module("mlp", Mlp(dim, mlp_hidden))) {}
  at::Tensor forward(at::Tensor x) {
    x = x + attn(norm1(x));
    return x + mlp(norm2(x));
  }
  nn::LayerNorm norm1;
  Attention attn;
  nn::LayerNorm norm2;
  Mlp mlp;
};
TORCH_MODULE(Block);

// Registration order fixes named_parameters() order, and it follows timm's state_dict: a module's own
// parameters (cls_token, pos_embed) first, then patch_embed, blocks, norm, head.
class VisionTransformer : public Classifier {
 public:
  explicit VisionTransformer(const VitOptions& o) : options_(o) {
    const int64_t tokens = 1 + (o.image_size / o.patch) * (o.image_size / o.patch);
    cls_token_ = register_parameter("cls_token", torch::zeros({1, 1, o.dim}));
    pos_embed_ = register_parameter("pos_embed", torch::zeros({1, tokens, o.dim}));
    patch_embed_ = register_module("patch_embed", PatchEmbed(o.in_channels, o.dim, o.patch));
    auto blocks = register_module("blocks", nn::ModuleList());
    for (int64_t i = 0; i < o.depth; ++i) {
      blocks_.push_back(Block(o.dim, o.heads, o.dim * o.mlp_ratio));
      blocks->push_back(blocks_.back());
    }
    norm_ = register_module("norm", layer_norm(o.dim));
    head_ = register_module("head", nn::Linear(o.dim, o.num_classes));
    init_like_timm();
  }

  at::Tensor forward_impl(at::Tensor x) override {
    const auto& o = options_;
    if (x.dim() != 4 || x.size(1) != o.in_channels || x.size(2) != o.image_size || x.size(3) != o.image_size)
      throw ConfigError("ViT built for images [B, " + std::to_string(o.in_channels) + ", " +
                            std::to_string(o.image_size) + ", " + std::to_string(o.image_size) + "] got " +
                            shape_string(x),
                        "the position embedding fixes the image size: build the model with the data's "
                        "image size and channels");
    x = patch_embed_(x);
    x = torch::cat({cls_token_.expand({x.size(0), -1, -1}), x}, 1) + pos_embed_;
    for (size_t b = 0; b < blocks_.size(); ++b) x = run_unit(b, [&] { return blocks_[b](x); });
    x = norm_(x);
    // global_pool='token': the class token alone feeds the head (no pre-logits layer).
    return head_(x.select(1, 0));
  }

 protected:
  // A transformer block is a unit under either policy: blocks are the model's only repeated children.
  std::vector<std::string> unit_prefixes(const std::string&) override {
    std::vector<std::string> out;
    for (size_t b = 0; b < blocks_.size(); ++b) out.push_back("blocks." + std::to_string(b) + ".");
    return out;
  }

 private:
  static std::string shape_string(const at::Tensor& x) {
    std::string s = "[";
    for (int64_t d = 0; d < x.dim(); ++d) s += (d ? ", " : "") + std::to_string(x.size(d));
    return s + "]";
  }

  // timm 0.9's init_weights (mode ''): pos_embed trunc-normal 0.02, cls_token normal 1e-6, every Linear
  // (head included) trunc-normal 0.02 with zero bias. LayerNorms keep ones/zeros and the patch convolution
  // keeps PyTorch's default (uniform +-1/sqrt(fan_in) for weight and bias), as timm leaves them.
  void init_like_timm() {
    trunc_normal_(pos_embed_, 0.02);
    {
      torch::NoGradGuard no_grad;
      cls_token_.normal_(0.0, 1e-6);
    }
    for (auto& block : blocks_) {
      init_linear(block->attn->qkv);
      init_linear(block->attn->proj);
      init_linear(block->mlp->fc1);
      init_linear(block->mlp->fc2);
    }
    init_linear(head_);
  }

  VitOptions options_;
  at::Tensor cls_token_, pos_embed_;
  PatchEmbed patch_embed_{nullptr};
  std::vector<Block> blocks_;
  nn::LayerNorm norm_{nullptr};
  nn::Linear head_{nullptr};
};

void check_positive(const char* what, int64_t value) {
  if (value <= 0)
    throw ConfigError(std::string("ViT option ") + what + " must be positive, got " + std::to_string(value),
                      "use the defaults of VitOptions (ViT-B/32) or other positive sizes");
}

std::shared_ptr<Classifier> build_vit(const VitOptions& o, const std::string& name) {
  check_positive("image_size", o.image_size);
  check_positive("patch", o.patch);
  check_positive("dim", o.dim);
  check_positive("depth", o.depth);
  check_positive("heads", o.heads);
  check_positive("mlp_ratio", o.mlp_ratio);
  check_positive("in_channels", o.in_channels);
  check_positive("num_classes", o.num_classes);
  if (o.image_size % o.patch != 0)
    throw ConfigError(name + " needs an image size that is a multiple of its patch size " + std::to_string(o.patch) +
                          ", got image size " + std::to_string(o.image_size),
                      "resize the data to a multiple of " + std::to_string(o.patch) +
                          " (e.g. data.name=imagefolder with data.image_size=224), or pick a convolutional model "
                          "such as resnet20 for small images");
  if (o.dim % o.heads != 0)
    throw ConfigError(name + " needs a width divisible by its heads, got dim " + std::to_string(o.dim) + " and " +
                          std::to_string(o.heads) + " heads",
                      "pick heads that divide dim (ViT-B: dim 768, 12 heads)");
  return std::make_shared<VisionTransformer>(o);
}

}  // namespace

std::shared_ptr<Classifier> make_vit(const VitOptions& options) { return build_vit(options, "ViT"); }

std::shared_ptr<Classifier> make_vit_b32(int64_t in_channels, int64_t image_size, int64_t num_classes) {
  VitOptions o;  // the defaults are ViT-B/32
  o.in_channels = in_channels;
  o.image_size = image_size;
  o.num_classes = num_classes;
  return build_vit(o, "model vit_b32");
}

}  // namespace cohort::models
