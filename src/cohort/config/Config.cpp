// Over 450 lines on purpose: about half is fields(), the declarative table of every key with its help,
// choices and check (one place to read them all, and what --help and docs/cli.md print); the rest parses
// values, TOML files and overrides against it. What combinations are refused is Validate.cpp's.
#include "cohort/config/Config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include "cohort/config/TomlGuard.h"
#include "cohort/util/Error.h"

namespace cohort::config {
namespace {

// A constraint on a value: returns an empty string when fine, otherwise what is wrong.
template <class V>
using Check = std::function<std::string(const V&)>;

template <class V>
Check<V> positive() {
  return [](const V& v) { return v > 0 ? std::string() : std::string("must be > 0"); };
}
template <class V>
Check<V> non_negative() {
  return [](const V& v) { return v >= 0 ? std::string() : std::string("must be >= 0"); };
}
Check<double> in_range(double lo, double hi) {
  return [lo, hi](const double& v) {
    return (v >= lo && v <= hi) ? std::string() : "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  };
}

struct Field {
  KeyInfo info;
  std::function<void(TrainConfig&, const std::string&)> set;
  std::function<nlohmann::json(const TrainConfig&)> get;
  std::function<void(const TrainConfig&)> check;
};

[[noreturn]] void bad_value(const std::string& key, const std::string& value, const std::string& why,
                            const std::string& hint) {
  throw ConfigError("config key '" + key + "': bad value '" + value + "': " + why, hint);
}

std::string trim(std::string s) {
  auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

template <class V>
V parse_value(const std::string& key, const std::string& text);

template <>
int64_t parse_value<int64_t>(const std::string& key, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) bad_value(key, text, "expected an integer", key + "=128");
  return v;
}
template <>
uint64_t parse_value<uint64_t>(const std::string& key, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  if (!text.empty() && text[0] == '-') bad_value(key, text, "expected a non-negative integer", key + "=0");
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE)
    bad_value(key, text, "expected a non-negative integer", key + "=0");
  return v;
}
template <>
double parse_value<double>(const std::string& key, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    bad_value(key, text, "expected a finite number", key + "=0.1");
  return v;
}
template <>
bool parse_value<bool>(const std::string& key, const std::string& text) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "true" || t == "1" || t == "yes" || t == "on") return true;
  if (t == "false" || t == "0" || t == "no" || t == "off") return false;
  bad_value(key, text, "expected true or false", key + "=true");
}
template <>
std::string parse_value<std::string>(const std::string&, const std::string& text) {
  return text;
}

template <class V>
std::string type_name() {
  if constexpr (std::is_same_v<V, bool>)
    return "bool";
  else if constexpr (std::is_integral_v<V>)
    return "int";
  else if constexpr (std::is_floating_point_v<V>)
    return "float";
  else
    return "string";
}

template <class V>
std::string to_text(const V& v) {
  if constexpr (std::is_same_v<V, bool>)
    return v ? "true" : "false";
  else if constexpr (std::is_same_v<V, std::string>)
    return v;
  else {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

template <class S, class V>
Field field(std::string key, S TrainConfig::*section, V S::*member, std::string help,
            std::vector<std::string> choices = {}, Check<V> check = {}) {
  Field f;
  const TrainConfig defaults;
  f.info = KeyInfo{key, type_name<V>(), to_text((defaults.*section).*member), std::move(help), choices};
  f.set = [key, section, member, choices, check](TrainConfig& cfg, const std::string& text) {
    V v = parse_value<V>(key, text);
    if constexpr (std::is_same_v<V, std::string>) {
      if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end()) {
        std::string all;
        for (const auto& c : choices) all += (all.empty() ? "" : ", ") + c;
        bad_value(key, text, "must be one of: " + all, key + "=" + choices.front());
      }
    }
    if (check) {
      if (auto why = check(v); !why.empty()) bad_value(key, text, why, "see `cohort train --help`");
    }
    (cfg.*section).*member = std::move(v);
  };
  f.get = [section, member](const TrainConfig& cfg) { return nlohmann::json((cfg.*section).*member); };
  return f;
}

// A switch that may also be left to cohort: "auto", or any spelling of a bool, stored as auto|true|false.
template <class Section>
Field auto_bool_field(std::string key, Section TrainConfig::*section, std::string Section::*member, std::string help) {
  Field f;
  f.info = KeyInfo{key, "string", TrainConfig{}.*section.*member, std::move(help), {"auto", "true", "false"}};
  f.set = [key, section, member](TrainConfig& cfg, const std::string& text) {
    std::string v = text;
    std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
    if (v != "auto") {
      try {
        v = parse_value<bool>(key, text) ? "true" : "false";
      } catch (const ConfigError&) {
        bad_value(key, text, "expected auto, true or false", key + "=auto");
      }
    }
    cfg.*section.*member = v;
  };
  f.get = [section, member](const TrainConfig& cfg) { return nlohmann::json(cfg.*section.*member); };
  return f;
}

const std::vector<Field>& fields() {
  using T = TrainConfig;
  static const std::vector<Field> all = {
      field("model.name", &T::model, &ModelConfig::name,
            "architecture: CIFAR-style 6n+2 ResNets (resnet8..32), torchvision's ImageNet ResNets (resnet18/34/50; "
            "torchvision's parameter names), ViT-B/32 (vit_b32; timm's names), airbench94 (airbench), or an MLP",
            {"resnet8", "resnet14", "resnet20", "resnet32", "resnet18", "resnet34", "resnet50", "vit_b32", "airbench",
             "mlp"}),
      field("model.width", &T::model, &ModelConfig::width,
            "channels of the first stage of resnet8..32 (doubled per stage) or hidden units of the MLP; "
            "resnet18/34/50 keep torchvision's widths",
            {}, positive<int64_t>()),
      field("model.num_classes", &T::model, &ModelConfig::num_classes, "classes of the output layer", {},
            positive<int64_t>()),
      field("model.pretrained", &T::model, &ModelConfig::pretrained,
            "initial weights from a .safetensors file (torchvision / timm names), checked name by name and "
            "shape by shape; a classifier head of another class count is replaced (fine-tuning)"),
      field("data.name", &T::data, &DataConfig::name,
            "dataset: fashion-mnist or mnist (IDX files), cifar10 (the binary .bin batches), imagefolder "
            "(data.root/train/<class>/*.JPEG and data.root/val/<class>/*.JPEG, classes sorted by name)",
            {"fashion-mnist", "mnist", "cifar10", "imagefolder"}),
      field("data.root", &T::data, &DataConfig::root, "directory holding the dataset files"),
      field("data.batch_size", &T::data, &DataConfig::batch_size,
            "batch size per worker; the global batch is this x world size", {}, positive<int64_t>()),
      field("data.augment", &T::data, &DataConfig::augment,
            "random crop with zero padding + horizontal flip on training images"),
      field("data.crop_padding", &T::data, &DataConfig::crop_padding,
            "padding of the random crop, pixels (0: no crop, flips only; the 3-epoch default job is more accurate "
            "without crops)",
            {}, non_negative<int64_t>()),
      field("data.flip", &T::data, &DataConfig::flip,
            "horizontal flips of training images: random (p = 0.5 each time) or alternating (airbench: a fixed "
            "random half flipped in even epochs, the other half in odd ones; in-memory datasets)",
            {"random", "alternating"}),
      field("data.image_size", &T::data, &DataConfig::image_size,
            "pixels of the images the model sees (0: the dataset's own, 224 for imagefolder); imagefolder: "
            "the RandomResizedCrop size and the validation center crop after resizing the shorter side to "
            "image_size x 256 / 224; other datasets: a bilinear resize",
            {}, non_negative<int64_t>()),
      field("data.workers", &T::data, &DataConfig::workers,
            "imagefolder: decoding threads per worker (0: cores / local workers)", {}, non_negative<int64_t>()),
      field("data.prefetch", &T::data, &DataConfig::prefetch,
            "imagefolder: batches decoded ahead of training, per worker", {}, positive<int64_t>()),
      field("data.on_bad_file", &T::data, &DataConfig::on_bad_file,
            "imagefolder: a corrupt or non-JPEG file is skipped and named in the log (skip), or an error (fail)",
            {"skip", "fail"}),
      field("data.device_resident", &T::data, &DataConfig::device_resident,
            "keep the whole in-memory dataset (fashion-mnist, mnist, cifar10) on the training device and "
            "gather, augment and normalize batches there: no pixels copied per step; the host path's numbers "
            "(up to float rounding when a GPU also resizes, data.image_size)"),
      field("data.train_limit", &T::data, &DataConfig::train_limit, "use only the first N training images (0: all)", {},
            non_negative<int64_t>()),
      field("data.test_limit", &T::data, &DataConfig::test_limit, "use only the first N test images (0: all)", {},
            non_negative<int64_t>()),
      field("train.epochs", &T::train, &TrainLoopConfig::epochs, "passes over the training set", {},
            positive<int64_t>()),
      field("train.max_steps", &T::train, &TrainLoopConfig::max_steps,
            "stop after this many optimizer steps (0: no limit); the schedule still spans train.epochs", {},
            non_negative<int64_t>()),
      field("train.seed", &T::train, &TrainLoopConfig::seed, "seed of initialization, shuffling and augmentation"),
      field("train.lookahead", &T::train, &TrainLoopConfig::lookahead,
            "airbench's lookahead: every 5 steps pull the weights to their moving average (decay 0.95^5 x "
            "progress^3), and end on the average"),
      field("train.whiten_bias_epochs", &T::train, &TrainLoopConfig::whiten_bias_epochs,
            "airbench: train the whitening layer's bias for this many epochs, then freeze it (0: never freeze)", {},
            non_negative<int64_t>()),
      field("train.grad_accum_steps", &T::train, &TrainLoopConfig::grad_accum_steps,
            "micro-batches per optimizer step; gradients sync only on the last one", {}, positive<int64_t>()),
      field("train.threads", &T::train, &TrainLoopConfig::threads,
            "intra-op threads per worker (0: cores / local workers, or OMP_NUM_THREADS if set)", {},
            non_negative<int64_t>()),
      field("train.retain_memory", &T::train, &TrainLoopConfig::retain_memory,
            "keep freed memory in the process for reuse (glibc malloc thresholds raised; ~10% faster steps)"),
      field("train.resume", &T::train, &TrainLoopConfig::resume,
            "run directory (or checkpoints directory) to resume from; same as --resume"),
      field("train.device", &T::train, &TrainLoopConfig::device,
            "where the model trains: cuda (GPU local_rank), cpu, or auto (cuda when LibTorch sees a GPU)",
            {"auto", "cpu", "cuda"}),
      auto_bool_field("train.channels_last", &T::train, &TrainLoopConfig::channels_last,
                      "conv nets: keep weights and images in channels-last (NHWC) memory format; auto: on for "
                      "convolutional models on CPU and on GPUs with tensor cores"),
      field("train.cudnn_benchmark", &T::train, &TrainLoopConfig::cudnn_benchmark,
            "cuda: let cuDNN time its convolution algorithms for each shape and keep the fastest"),
      field("optim.name", &T::optim, &OptimConfig::name,
            "optimizer: sgd (momentum, Nesterov) or adamw (decoupled weight decay, torch.optim.AdamW)",
            {"sgd", "adamw"}),
      field("optim.lr", &T::optim, &OptimConfig::lr, "peak learning rate", {}, positive<double>()),
      field("optim.momentum", &T::optim, &OptimConfig::momentum, "SGD momentum", {}, in_range(0, 1)),
      field("optim.nesterov", &T::optim, &OptimConfig::nesterov, "Nesterov momentum"),
      field("optim.weight_decay", &T::optim, &OptimConfig::weight_decay, "L2 weight decay", {}, non_negative<double>()),
      field("optim.decay_norm_and_bias", &T::optim, &OptimConfig::decay_norm_and_bias,
            "also decay batch-norm weights and all biases (off: as the ResNet training recipes do)"),
      field("optim.scale_lr", &T::optim, &OptimConfig::scale_lr,
            "linear scaling rule: lr x global batch / optim.base_batch"),
      field("optim.base_batch", &T::optim, &OptimConfig::base_batch, "reference batch of the scaling rule", {},
            positive<int64_t>()),
      field("optim.beta1", &T::optim, &OptimConfig::beta1, "adamw: first-moment decay", {}, in_range(0, 1)),
      field("optim.beta2", &T::optim, &OptimConfig::beta2, "adamw: second-moment decay", {}, in_range(0, 1)),
      field("optim.eps", &T::optim, &OptimConfig::eps, "adamw: denominator epsilon", {}, positive<double>()),
      field("optim.in_backward", &T::optim, &OptimConfig::in_backward,
            "step each gradient bucket's parameters (ddp) or each unit's slice (zero1, zero2, fsdp) as soon as "
            "its reduction ends, while backward goes on (PyTorch DDP's fused optimizer); not with clip_grad_norm "
            "or fp16 loss scaling"),
      auto_bool_field("optim.foreach", &T::optim, &OptimConfig::foreach,
                      "multi-tensor updates: one call per operation per parameter group (torch.optim's foreach); "
                      "auto: on for parameters on CUDA, off on CPU (docs/optimizer.md)"),
      field("optim.clip_grad_norm", &T::optim, &OptimConfig::clip_grad_norm,
            "clip gradients to this global L2 norm, computed across all shards (0: no clipping)", {},
            non_negative<double>()),
      field("optim.norm_lr_scale", &T::optim, &OptimConfig::norm_lr_scale,
            "learning rate x this (and weight decay / this) for parameters named *norm* (airbench: 64)", {},
            positive<double>()),
      field("sched.name", &T::sched, &SchedConfig::name, "learning-rate schedule",
            {"onecycle", "cosine", "step", "constant"}),
      field("sched.warmup_epochs", &T::sched, &SchedConfig::warmup_epochs,
            "linear warmup (cosine, step, constant); onecycle warms up over sched.pct_start", {},
            non_negative<double>()),
      field("sched.warmup_start_factor", &T::sched, &SchedConfig::warmup_start_factor, "warmup starts at lr x this", {},
            in_range(0, 1)),
      field("sched.pct_start", &T::sched, &SchedConfig::pct_start, "onecycle: fraction spent increasing", {},
            in_range(0, 1)),
      field("sched.div_factor", &T::sched, &SchedConfig::div_factor, "onecycle: initial lr = lr / this", {},
            positive<double>()),
      field("sched.final_div_factor", &T::sched, &SchedConfig::final_div_factor,
            "onecycle: final lr = initial lr / this", {}, positive<double>()),
      field("sched.cycle_momentum", &T::sched, &SchedConfig::cycle_momentum,
            "onecycle: momentum (adamw: beta1) from sched.max_momentum down to sched.base_momentum while the lr "
            "rises and back while it falls, as PyTorch's OneCycleLR (its default; not cohort's, see "
            "docs/default-job.md); "
            "optim.momentum and optim.beta1 are then unused"),
      field("sched.base_momentum", &T::sched, &SchedConfig::base_momentum,
            "onecycle with cycle_momentum: the momentum at the peak lr", {}, in_range(0, 1)),
      field("sched.max_momentum", &T::sched, &SchedConfig::max_momentum,
            "onecycle with cycle_momentum: the momentum at the start and the end", {}, in_range(0, 1)),
      field("sched.step_epochs", &T::sched, &SchedConfig::step_epochs, "step: decay every this many epochs", {},
            positive<double>()),
      field("sched.gamma", &T::sched, &SchedConfig::gamma, "step: decay factor", {}, positive<double>()),
      field("sched.min_lr_factor", &T::sched, &SchedConfig::min_lr_factor, "cosine: final lr = lr x this", {},
            in_range(0, 1)),
      field("loss.label_smoothing", &T::loss, &LossConfig::label_smoothing, "label smoothing of the loss", {},
            in_range(0, 1)),
      field("dist.strategy", &T::dist, &DistConfig::strategy,
            "data parallelism: ddp (full replicas), zero1 (optimizer state sharded), zero2 (+ gradients "
            "sharded), fsdp (+ parameters sharded, gathered per unit), swarm (peers that join and leave, no master: "
            "swarm.*), diloco (local steps, then an outer step on the peers' averaged change: diloco.*, over the "
            "swarm)",
            {"ddp", "zero1", "zero2", "fsdp", "swarm", "diloco"}),
      field("dist.fsdp_unit", &T::dist, &DistConfig::fsdp_unit,
            "fsdp: what one gathered unit is: block (a residual or transformer block) or child (a top-level "
            "child module such as layer1)",
            {"block", "child"}),
      field("dist.backend", &T::dist, &DistConfig::backend, "collective engine", {"gloo", "nccl"}),
      field("dist.bucket_mb", &T::dist, &DistConfig::bucket_mb, "gradient bucket size, MiB", {}, positive<double>()),
      field("dist.first_bucket_mb", &T::dist, &DistConfig::first_bucket_mb,
            "first bucket's size, MiB (small, so communication starts early)", {}, positive<double>()),
      field("dist.last_bucket_mb", &T::dist, &DistConfig::last_bucket_mb,
            "last bucket's size, MiB: the first parameters, whose gradients come last (0: dist.first_bucket_mb "
            "under optim.in_backward, whose last bucket's step nothing hides; else no small last bucket)",
            {}, non_negative<double>()),
      field("dist.timeout_s", &T::dist, &DistConfig::timeout_s,
            "seconds a collective or rendezvous may wait before failing", {}, positive<double>()),
      field("dist.overlap", &T::dist, &DistConfig::overlap,
            "all-reduce buckets while backward runs (off: after backward, for comparison)"),
      field("dist.find_unused_parameters", &T::dist, &DistConfig::find_unused_parameters,
            "allow parameters that get no gradient (reduced as zeros); off: an error names them"),
      field("dist.broadcast_buffers", &T::dist, &DistConfig::broadcast_buffers,
            "batch-norm buffers follow rank 0 after every synchronized step"),
      field("dist.debug", &T::dist, &DistConfig::debug,
            "detail: before each collective the ranks compare its kind, dtype and size and name a mismatch "
            "(as TORCH_DISTRIBUTED_DEBUG=DETAIL, which also turns it on); off: no check",
            {"off", "detail"}),
      field("dist.flight_records", &T::dist, &DistConfig::flight_records,
            "how many of its last collectives each rank keeps, and writes to RUN_DIR/flight/ when one fails or "
            "on SIGUSR2, for `cohort doctor` (0: none)",
            {}, non_negative<int64_t>()),
      field("dist.slurm_requeue", &T::dist, &DistConfig::slurm_requeue,
            "under Slurm, after SIGUSR1 (a preemption warning) stopped and saved the run, rank 0 asks Slurm to "
            "requeue the job (scontrol requeue), which then resumes from the save"),
      field("dist.compress", &T::dist, &DistConfig::compress,
            "gradient compression hook: none, fp16 / bf16 (all-reduce in 16 bits) or powersgd",
            {"none", "fp16", "bf16", "powersgd"}),
      field("amp.precision", &T::amp, &AmpConfig::precision,
            "auto (bf16 where the CPU or GPU computes it natively, else fp32 on CPU and fp16-master on older "
            "GPUs, fp16 there with train.lookahead or gradient compression); fp32; bf16 (autocast); fp16 (autocast + "
            "dynamic loss scaling, as torch.cuda.amp or Apex O1); "
            "fp16-master (fp16 weights, fp32 batch norm, fp32 master weights in the optimizer, loss scaling: "
            "Apex O2)",
            {"auto", "fp32", "bf16", "fp16", "fp16-master"}),
      field("amp.init_scale", &T::amp, &AmpConfig::init_scale, "fp16: initial loss scale", {}, positive<double>()),
      field("amp.growth_interval", &T::amp, &AmpConfig::growth_interval,
            "fp16: the loss scale grows after this many steps in a row without inf/NaN gradients", {},
            positive<int64_t>()),
      field("amp.growth_factor", &T::amp, &AmpConfig::growth_factor, "fp16: loss scale x this when it grows", {},
            positive<double>()),
      field("amp.backoff_factor", &T::amp, &AmpConfig::backoff_factor,
            "fp16: loss scale x this after an overflow (the step is skipped on every rank)", {}, in_range(0, 1)),
      field("powersgd.rank", &T::powersgd, &PowerSgdConfig::rank,
            "PowerSGD matrix approximation rank (higher: more exact, more bytes)", {}, positive<int64_t>()),
      field("powersgd.start_iter", &T::powersgd, &PowerSgdConfig::start_iter,
            "plain all-reduce for this many steps before compressing (PyTorch's start_powerSGD_iter)", {},
            non_negative<int64_t>()),
      field("powersgd.min_compression_rate", &T::powersgd, &PowerSgdConfig::min_compression_rate,
            "compress a matrix only where it shrinks at least this much", {}, non_negative<double>()),
      field("powersgd.error_feedback", &T::powersgd, &PowerSgdConfig::error_feedback,
            "carry each step's compression residual into the next step"),
      field("powersgd.warm_start", &T::powersgd, &PowerSgdConfig::warm_start,
            "reuse last step's Q instead of drawing a new random one"),
      field("swarm.listen", &T::swarm, &SwarmConfig::listen,
            "swarm: HOST:PORT where the other peers reach this one (frames over TCP, the DHT over UDP, same port)"),
      field("swarm.initial_peers", &T::swarm, &SwarmConfig::initial_peers,
            "swarm: comma-separated HOST:PORT of any live peers to join through; empty for the first peer"),
      field("swarm.token", &T::swarm, &SwarmConfig::token,
            "swarm: this peer's token file (cohort swarm token --key run.key --ttl 24h --out peer.token)"),
      field("swarm.insecure", &T::swarm, &SwarmConfig::insecure,
            "swarm: no authentication, for a network you trust (Hivemind's default); off: a token is required"),
      field("swarm.target_batch_size", &T::swarm, &SwarmConfig::target_batch_size,
            "swarm: samples the peers accumulate together per optimizer step (the global batch); "
            "0: data.batch_size x swarm.partitions",
            {}, non_negative<int64_t>()),
      field("swarm.matchmaking_s", &T::swarm, &SwarmConfig::matchmaking_s,
            "swarm: seconds a round's leader waits for more ready peers (hivemind.Optimizer's matchmaking_time)", {},
            positive<double>()),
      field("swarm.averaging_timeout_s", &T::swarm, &SwarmConfig::averaging_timeout_s,
            "swarm: seconds an averaging round may take; a peer that has not sent by half of it is left out "
            "(hivemind.Optimizer's averaging_timeout)",
            {}, positive<double>()),
      field("swarm.min_group_size", &T::swarm, &SwarmConfig::min_group_size,
            "swarm: fewest ready peers that average together; fewer: each takes a local step", {}, positive<int64_t>()),
      field("swarm.group_size", &T::swarm, &SwarmConfig::group_size,
            "swarm: at most this many peers average together in a round; groups change from round to round (a "
            "two-dimensional Moshpit grid: Note [Groups on a grid] in swarm/Averager.cpp) so averages still mix across "
            "the swarm (0: every ready "
            "peer, one group; hivemind's target_group_size)",
            {}, non_negative<int64_t>()),
      field("swarm.average_state_every", &T::swarm, &SwarmConfig::average_state_every,
            "swarm with swarm.group_size: every N steps the round's group also averages the parameters, which "
            "groups smaller than the swarm would otherwise let drift apart (hivemind.Optimizer's "
            "average_state_every); diloco: every N outer rounds, its outer weights and momentum",
            {}, positive<int64_t>()),
      field("swarm.min_peers_to_start", &T::swarm, &SwarmConfig::min_peers_to_start,
            "swarm: the first step waits until this many peers (this one included) are in the swarm, at most "
            "dist.timeout_s (torchrun's minimum of --nnodes=MIN:MAX); later peers join at any time",
            {}, positive<int64_t>()),
      field("swarm.sampler", &T::swarm, &SwarmConfig::sampler,
            "swarm: random (each peer draws from the whole training set with its own seed) or partition (the "
            "shard DistributedSampler gives rank swarm.partition of swarm.partitions, one batch per step: "
            "comparisons with ddp)",
            {"random", "partition"}),
      field("swarm.partitions", &T::swarm, &SwarmConfig::partitions, "swarm.sampler=partition: the number of peers", {},
            positive<int64_t>()),
      field("swarm.partition", &T::swarm, &SwarmConfig::partition,
            "swarm.sampler=partition: this peer's shard, 0 .. swarm.partitions - 1", {}, non_negative<int64_t>()),
      field("swarm.announce_s", &T::swarm, &SwarmConfig::announce_s,
            "swarm: this peer's record goes to the peers it knows at every change and at least this often (into the "
            "DHT every twice this)",
            {}, positive<double>()),
      field("swarm.peer_ttl_s", &T::swarm, &SwarmConfig::peer_ttl_s,
            "swarm: a peer whose record is older than this is gone", {}, positive<double>()),
      field("swarm.compress", &T::swarm, &SwarmConfig::compress,
            "swarm: how gradients travel in a round: none (float32), fp16 (half the bytes; "
            "hivemind.Optimizer's grad_compression=Float16Compression()) or int8 (a scale per 1024 values, a "
            "quarter of the bytes; what it loses goes into the next step: error feedback)",
            {"none", "fp16", "int8"}),
      field("diloco.inner_steps", &T::diloco, &DilocoConfig::inner_steps,
            "diloco: local optimizer steps between two outer steps (H in the DiLoCo paper)", {}, positive<int64_t>()),
      field("diloco.outer_lr", &T::diloco, &DilocoConfig::outer_lr, "diloco: the outer Nesterov SGD's learning rate",
            {}, positive<double>()),
      field("diloco.outer_momentum", &T::diloco, &DilocoConfig::outer_momentum,
            "diloco: the outer Nesterov SGD's momentum", {}, in_range(0, 1)),
      field("diloco.compress", &T::diloco, &DilocoConfig::compress,
            "diloco: the pseudo-gradient on the wire: none, fp16, or int8 (a scale per 1024 values, error feedback)",
            {"none", "fp16", "int8"}),
      field("ckpt.every_steps", &T::ckpt, &CkptConfig::every_steps,
            "save checkpoints/last every N steps (0: at the end of every epoch)", {}, non_negative<int64_t>()),
      field("ckpt.keep_last", &T::ckpt, &CkptConfig::keep_last,
            "how many saves of checkpoints/last (step-N directories) to keep; a crash during a save leaves the "
            "previous one",
            {}, positive<int64_t>()),
      field("ckpt.save_best", &T::ckpt, &CkptConfig::save_best, "keep checkpoints/best for the best test accuracy"),
      field("ckpt.upload", &T::ckpt, &CkptConfig::upload,
            "after training, upload checkpoints/best to s3://bucket/prefix/<run name>/ (empty: no upload); "
            "credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
      field("ckpt.upload_best_every_time", &T::ckpt, &CkptConfig::upload_best_every_time,
            "also upload whenever checkpoints/best improves, not only at the end"),
      field("ckpt.s3_endpoint", &T::ckpt, &CkptConfig::s3_endpoint,
            "S3-compatible endpoint URL (empty: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or AWS itself); "
            "same as --s3-endpoint"),
      field("eval.tta", &T::eval, &EvalConfig::tta,
            "test-time augmentation: 0 none, 1 average with the flipped image, 2 also 1-pixel translations "
            "(airbench's multi-view TTA)",
            {}, non_negative<int64_t>()),
      field("eval.enabled", &T::eval, &EvalConfig::enabled, "evaluate on the test set after each epoch"),
      field("eval.batch_size", &T::eval, &EvalConfig::batch_size, "evaluation batch size per worker", {},
            positive<int64_t>()),
      field("eval.every_steps", &T::eval, &EvalConfig::every_steps,
            "also evaluate every this many steps, not only after each epoch (0: after each epoch only)", {},
            non_negative<int64_t>()),
      field("log.every_steps", &T::log, &LogConfig::every_steps,
            "steps between progress lines and metrics.jsonl records", {}, positive<int64_t>()),
      field("log.tensorboard", &T::log, &LogConfig::tensorboard,
            "write TensorBoard scalars (events.out.tfevents.*) into the run directory, from rank 0"),
      field("log.monitor_s", &T::log, &LogConfig::monitor_s,
            "seconds between resource samples (RSS, CPU, GPU through NVML) of every rank (0: no monitor)", {},
            non_negative<double>()),
      field("log.progress", &T::log, &LogConfig::progress,
            "rank 0's progress: a live bar on a terminal and plain lines otherwise (auto), or always one of them",
            {"auto", "bar", "plain", "off"}),
      field("log.mlflow", &T::log, &LogConfig::mlflow,
            "MLflow tracking server, http://HOST:PORT: rank 0 logs the config as params, the scalars TensorBoard "
            "gets, the run's files and its status there (empty: no MLflow)"),
      field("log.mlflow_experiment", &T::log, &LogConfig::mlflow_experiment,
            "MLflow experiment of the run (made when missing)"),
      field("log.mlflow_run_name", &T::log, &LogConfig::mlflow_run_name,
            "MLflow run name (empty: the run directory's name)"),
      field("log.mlflow_buffer", &T::log, &LogConfig::mlflow_buffer,
            "metrics kept while the MLflow server does not answer; newer ones are dropped and counted in "
            "summary.json",
            {}, positive<int64_t>()),
      field("log.mlflow_timeout_s", &T::log, &LogConfig::mlflow_timeout_s,
            "seconds one MLflow request may take, and the most the end of a run waits for the server", {},
            positive<double>()),
      field("run.dir", &T::run, &RunConfig::dir, "run directory (empty: runs/<timestamp>); same as --run-dir"),
  };
  return all;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Keys an earlier cohort read, with what to write instead: a user's old config gets that, not "unknown
// key"; a run directory's saved config.json (which cohort wrote, not the user) is migrated by from_json.
struct RemovedKey {
  const char* key;
  const char* instead;
  void (*migrate)(TrainConfig& cfg, const std::string& value);
};
const RemovedKey kRemovedKeys[] = {
    {"dist.grad_dtype",
     "write dist.compress=fp16 or dist.compress=bf16 instead (the same gradient hook); for dist.grad_dtype=fp32 "
     "remove the line (dist.compress=none is the default)",
     [](TrainConfig& cfg, const std::string& value) {
       if (value != "fp32") cfg.dist.compress = value;
     }},
};

const Field& find_field(const std::string& key) {
  for (const auto& removed : kRemovedKeys)
    if (key == removed.key) throw ConfigError("config key '" + key + "' was removed in cohort 0.2", removed.instead);
  const auto& all = fields();
  auto it = std::find_if(all.begin(), all.end(), [&](const Field& f) { return f.info.key == key; });
  if (it != all.end()) return *it;
  const Field* best = &all.front();
  for (const auto& f : all)
    if (edit_distance(f.info.key, key) < edit_distance(best->info.key, key)) best = &f;
  throw ConfigError("unknown config key '" + key + "'",
                    "did you mean '" + best->info.key + "'? `cohort train --help` lists every key");
}

// Flattens a TOML table into dotted keys with values as their command-line text.
void flatten(const toml::table& table, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out,
             const std::string& file) {
  for (const auto& [k, node] : table) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = node.as_table()) {
      flatten(*sub, key, out, file);
    } else if (const auto* s = node.as_string()) {
      out.emplace_back(key, s->get());
    } else if (const auto* i = node.as_integer()) {
      out.emplace_back(key, std::to_string(i->get()));
    } else if (const auto* d = node.as_floating_point()) {
      std::ostringstream os;
      os.precision(17);
      os << d->get();
      out.emplace_back(key, os.str());
    } else if (const auto* b = node.as_boolean()) {
      out.emplace_back(key, b->get() ? "true" : "false");
    } else {
      throw ConfigError(file + ": config key '" + key + "' has a value of an unsupported type",
                        "use a string, number or boolean");
    }
  }
}

}  // namespace

std::vector<KeyInfo> keys() {
  std::vector<KeyInfo> out;
  for (const auto& f : fields()) out.push_back(f.info);
  return out;
}

void set(TrainConfig& cfg, const std::string& key, const std::string& value) { find_field(key).set(cfg, value); }

void apply_override(TrainConfig& cfg, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("override '" + assignment + "' is not of the form key=value",
                      "write for example data.batch_size=64");
  set(cfg, trim(assignment.substr(0, eq)), trim(assignment.substr(eq + 1)));
}

TrainConfig load_from_string(std::string_view toml_text, const std::string& source,
                             const std::vector<std::string>& overrides, const TrainConfig& base) {
  TrainConfig cfg = base;
  refuse_what_toml_cannot_read(toml_text, source);  // See Note [toml++ 3.3 and non-ASCII text]
  toml::table table;
  try {
    table = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << source << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": not valid TOML: " << e.description();
    throw ConfigError(os.str(), "the config file is TOML: [section] headers and key = value lines");
  }
  std::vector<std::pair<std::string, std::string>> flat;
  flatten(table, "", flat, source);
  for (const auto& [k, v] : flat) {
    try {
      set(cfg, k, v);
    } catch (const ConfigError& e) {
      throw ConfigError(source + ": " + e.what(), e.hint());
    }
  }
  for (const auto& o : overrides) apply_override(cfg, o);
  validate(cfg);
  return cfg;
}

TrainConfig load(const std::optional<std::filesystem::path>& file, const std::vector<std::string>& overrides,
                 const TrainConfig& base) {
  if (!file) {
    TrainConfig cfg = base;
    for (const auto& o : overrides) apply_override(cfg, o);
    validate(cfg);
    return cfg;
  }
  if (!std::filesystem::exists(*file))
    throw ConfigError("config file '" + file->string() + "' does not exist", "check the --config path");
  std::ifstream in(*file, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad())
    throw ConfigError("config file '" + file->string() + "' cannot be read",
                      "check the --config path and its permissions");
  return load_from_string(text.str(), file->string(), overrides, base);
}

nlohmann::json to_json(const TrainConfig& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : fields()) j[f.info.key] = f.get(cfg);
  return j;
}

const std::vector<std::string>& machine_local_keys() {
  // Where things live and how many threads a machine has: a job may set them per machine.
  static const std::vector<std::string> keys = {
      "run.dir",      "train.resume",  "data.root",    "train.threads",       "data.workers", "data.prefetch",
      "log.progress", "log.monitor_s", "swarm.listen", "swarm.initial_peers", "swarm.token",  "swarm.partition"};
  return keys;
}

std::vector<std::string> differing_keys(const nlohmann::json& a, const nlohmann::json& b) {
  const auto& local = machine_local_keys();
  std::vector<std::string> out;
  auto consider = [&](const std::string& k) {
    if (std::find(local.begin(), local.end(), k) != local.end()) return;
    if (std::find(out.begin(), out.end(), k) != out.end()) return;
    if (!a.contains(k) || !b.contains(k) || a.at(k) != b.at(k)) out.push_back(k);
  };
  for (const auto& [k, v] : a.items()) consider(k);
  for (const auto& [k, v] : b.items()) consider(k);
  return out;
}

TrainConfig from_json(const nlohmann::json& j) {
  TrainConfig cfg;
  for (const auto& [k, v] : j.items()) {
    const std::string value = v.is_string() ? v.get<std::string>() : v.dump();
    auto removed = std::find_if(std::begin(kRemovedKeys), std::end(kRemovedKeys),
                                [&k = k](const RemovedKey& r) { return k == r.key; });
    if (removed != std::end(kRemovedKeys))
      removed->migrate(cfg, value);
    else
      set(cfg, k, value);
  }
  return cfg;
}

std::string help_text() {
  std::ostringstream os;
  os << "Config keys (set in a TOML file given by --config, or as key=value on the command line):\n";
  std::string section;
  for (const auto& f : fields()) {
    const auto dot = f.info.key.find('.');
    if (f.info.key.substr(0, dot) != section) {
      section = f.info.key.substr(0, dot);
      os << "\n  [" << section << "]\n";
    }
    std::string def = f.info.default_value.empty() ? "\"\"" : f.info.default_value;
    os << "  " << f.info.key << " (" << f.info.type << ", default " << def << ")\n      " << f.info.help;
    if (!f.info.choices.empty()) {
      os << "; one of:";
      for (const auto& c : f.info.choices) os << " " << c;
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace cohort::config

namespace cohort {

StrategyKind strategy_kind(const std::string& name) {
  static const std::pair<const char*, StrategyKind> kinds[] = {
      {"ddp", StrategyKind::kDdp},   {"zero1", StrategyKind::kZero1}, {"zero2", StrategyKind::kZero2},
      {"fsdp", StrategyKind::kFsdp}, {"swarm", StrategyKind::kSwarm}, {"diloco", StrategyKind::kDiloco}};
  for (const auto& [n, k] : kinds)
    if (name == n) return k;
  throw ConfigError("dist.strategy=" + name + " is not a strategy", "use ddp, zero1, zero2, fsdp, swarm or diloco");
}

}  // namespace cohort
