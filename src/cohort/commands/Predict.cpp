#include "cohort/commands/Predict.h"

#include <algorithm>
#include <iostream>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "cohort/checkpoint/Safetensors.h"
#include "cohort/checkpoint/Steps.h"
#include "cohort/comm/Rendezvous.h"
#include "cohort/data/Cifar10.h"
#include "cohort/data/FashionMnist.h"
#include "cohort/data/ImageFolder.h"
#include "cohort/data/Presets.h"
#include "cohort/models/Models.h"
#include "cohort/train/Device.h"
#include "cohort/train/Trainer.h"
#include "cohort/util/AtomicFile.h"
#include "cohort/util/Error.h"

namespace cohort::commands {
namespace fs = std::filesystem;

InputShape input_shape(const TrainConfig& cfg) {
  const auto& d = cfg.data;
  if (d.name == "fashion-mnist" || d.name == "mnist") return {1, d.image_size > 0 ? d.image_size : 28};
  if (d.name == "cifar10") return {3, d.image_size > 0 ? d.image_size : 32};
  return {3, d.image_size > 0 ? d.image_size : 224};
}

std::vector<std::string> class_names(const TrainConfig& cfg) {
  if (cfg.data.name == "mnist") return {"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"};
  if (cfg.data.name == "fashion-mnist")
    return {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"};
  if (cfg.data.name == "cifar10")
    return {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  // An image folder's classes are its sorted subfolders, as torchvision's ImageFolder (and ours) number them.
  std::vector<std::string> names;
  std::error_code ec;
  const fs::path val = fs::path(cfg.data.root) / "val";
  if (cfg.data.name == "imagefolder" && fs::is_directory(val, ec))
    for (const auto& e : fs::directory_iterator(val, ec))
      if (e.is_directory()) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return static_cast<int64_t>(names.size()) == cfg.model.num_classes ? names : std::vector<std::string>{};
}

std::vector<fs::path> list_images(const std::vector<fs::path>& paths) {
  std::vector<fs::path> files;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::recursive_directory_iterator(p, ec))
        if (e.is_regular_file() && data::is_jpeg_name(e.path())) found.push_back(e.path());
      if (found.empty())
        throw DataError(p.string() + ": a folder with no .jpg or .jpeg file in it", "pass JPEG images");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(p, ec)) {
      files.push_back(p);
    } else {
      throw DataError(p.string() + ": no such file or folder", "pass JPEG files or folders of them");
    }
  }
  return files;
}

at::Tensor preprocess_image(const TrainConfig& cfg, const fs::path& file) {
  const InputShape shape = input_shape(cfg);
  const int size = static_cast<int>(shape.image_size);
  // Exact PIL arithmetic (full-size decode), as the reference libraries' transforms run on PIL images.
  data::TransformOptions t = data::model_transform(cfg.model.name, size);
  t.dct_scaling = false;
  if (cfg.data.name != "imagefolder") t.resize_size = size;  // the small datasets: Resize(S) + CenterCrop(S)
  if (cfg.data.name == "cifar10") {
    std::copy(std::begin(data::kCifarMean), std::end(data::kCifarMean), t.mean.begin());
    std::copy(std::begin(data::kCifarStd), std::end(data::kCifarStd), t.std.begin());
  }
  const bool gray = shape.channels == 1;
  if (gray) t.mean = {0.0f, 0.0f, 0.0f}, t.std = {1.0f, 1.0f, 1.0f};  // luma below, then normalized
  auto x = torch::empty({3, size, size}, torch::kFloat32);
  try {
    const auto bytes = data::read_file_bytes(file);
    data::val_transform(bytes.data(), bytes.size(), t, x.data_ptr<float>());
  } catch (const Error& e) {
    throw DataError(file.string() + ": " + e.what(), e.hint().empty() ? "pass a JPEG image" : e.hint());
  }
  if (!gray) return x;
  // PIL's convert("L") weights (ITU-R 601 luma), in float; then the dataset's normalization (Datasets.cpp).
  const auto luma = x[0] * 0.299f + x[1] * 0.587f + x[2] * 0.114f;
  const bool mnist = cfg.data.name == "mnist";
  const float mean = mnist ? data::kMnistMean : data::kFashionMnistMean;
  const float std = mnist ? data::kMnistStd : data::kFashionMnistStd;
  return ((luma - mean) / std).unsqueeze(0);
}

namespace {

// The preprocessed images of a safetensors file: its only tensor, or the one called images, input or x.
at::Tensor read_input_tensor(const fs::path& file, const InputShape& shape) {
  auto f = checkpoint::load_safetensors(file);
  at::Tensor x;
  for (auto& [name, t] : f.tensors)
    if (f.tensors.size() == 1 || name == "images" || name == "input" || name == "x") x = t;
  const std::string want = "[N, " + std::to_string(shape.channels) + ", " + std::to_string(shape.image_size) + ", " +
                           std::to_string(shape.image_size) + "]";
  if (!x.defined())
    throw DataError(
        file.string() + ": " + std::to_string(f.tensors.size()) + " tensors and none called images, input or x",
        "save one float tensor " + want);
  if (x.dim() != 4 || x.size(0) == 0 || x.size(1) != shape.channels || x.size(2) != shape.image_size ||
      x.size(3) != shape.image_size || !x.is_floating_point())
    throw DataError(file.string() + ": the input tensor is " + std::string(c10::toString(x.scalar_type())) + " " +
                        c10::str(x.sizes()) + ", the model takes float " + want,
                    "preprocess the images to the model's input size (or set data.image_size)");
  return x.to(torch::kFloat32);
}

// This rank's rows [begin, end) of n inputs: contiguous blocks, rank 0 first, so gathering restores order.
std::pair<int64_t, int64_t> my_rows(int64_t n, int rank, int world) {
  const int64_t per = (n + world - 1) / world;
  return {std::min(n, per * rank), std::min(n, per * (rank + 1))};
}

// Every rank's logits, in input order, on rank 0 (the others get an undefined tensor). Blocks are padded
// to the same row count for the all-gather.
at::Tensor gather_rows(comm::Communicator& comm, const at::Tensor& mine, int64_t n, int64_t classes) {
  const int world = comm.size();
  const int64_t per = (n + world - 1) / world;
  auto padded = torch::zeros({per, classes}, torch::kFloat32);
  if (mine.size(0) > 0) padded.narrow(0, 0, mine.size(0)).copy_(mine);
  auto all = torch::empty({world * per, classes}, torch::kFloat32);
  comm.all_gather(all, padded, "predict logits")->wait();
  return comm.rank() == 0 ? all.narrow(0, 0, n).contiguous() : at::Tensor();
}

at::Tensor logits_of(models::Classifier& model, const std::function<at::Tensor(int64_t)>& input, int64_t begin,
                     int64_t end, int64_t batch, const c10::Device& device) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> out;
  for (int64_t i = begin; i < end; i += batch) {
    std::vector<at::Tensor> xs;
    for (int64_t j = i; j < std::min(end, i + batch); ++j) xs.push_back(input(j));
    out.push_back(model.forward(torch::stack(xs).to(device)).to(torch::kCPU, torch::kFloat32));
  }
  return out.empty() ? torch::empty({0, 0}) : torch::cat(out);
}

std::string json_lines(const at::Tensor& logits, const std::vector<fs::path>& files,
                       const std::vector<std::string>& names, int top_k) {
  const auto probs = torch::softmax(logits, 1);
  const auto [p, idx] = probs.topk(std::min<int64_t>(top_k, probs.size(1)), 1);
  std::string text;
  for (int64_t i = 0; i < p.size(0); ++i) {
    nlohmann::json top = nlohmann::json::array();
    for (int64_t k = 0; k < p.size(1); ++k) {
      const int64_t c = idx[i][k].item<int64_t>();
      nlohmann::json entry = {{"class", c}, {"probability", p[i][k].item<double>()}};
      if (c < static_cast<int64_t>(names.size())) entry["label"] = names[c];
      top.push_back(entry);
    }
    text += nlohmann::json{{"file", files[i].string()}, {"top", top}}.dump() + "\n";
  }
  return text;
}

}  // namespace

void run_predict_worker(const TrainConfig& cfg, const comm::WorldInfo& info, const PredictOptions& o) {
  at::set_num_threads(train::worker_threads(cfg, info));
  comm::World world = comm::rendezvous(info, cfg.dist.backend,
                                       std::chrono::milliseconds(static_cast<int64_t>(cfg.dist.timeout_s * 1000)));
  const c10::Device device = train::training_device(cfg.train.device, info.local_rank);
  const InputShape shape = input_shape(cfg);
  auto model = models::build(cfg.model, shape.channels, shape.image_size);
  const auto weights = checkpoint::load_model_weights(o.checkpoint);
  checkpoint::load_weights(*model, weights.tensors, weights.source);
  model->to(device);
  model->eval();

  const bool tensor_mode = !o.input.empty();
  const at::Tensor inputs = tensor_mode ? read_input_tensor(o.input, shape) : at::Tensor();
  const std::vector<fs::path> files = tensor_mode ? std::vector<fs::path>{} : list_images(o.images);
  const int64_t n = tensor_mode ? inputs.size(0) : static_cast<int64_t>(files.size());
  const auto [begin, end] = my_rows(n, info.rank, info.world_size);
  const auto input = [&](int64_t i) { return tensor_mode ? inputs[i] : preprocess_image(cfg, files[i]); };
  auto mine = logits_of(*model, input, begin, end, std::max<int64_t>(1, o.batch_size), device);
  if (mine.numel() == 0) mine = torch::empty({0, cfg.model.num_classes});
  const auto logits = gather_rows(*world.comm, mine, n, cfg.model.num_classes);

  if (info.rank == 0) {
    if (tensor_mode) {
      const fs::path out = o.out.empty() ? fs::path(o.input).replace_extension(".logits.safetensors") : o.out;
      checkpoint::save_safetensors(out, {{"logits", logits}}, {{"model", cfg.model.name}, {"weights", weights.source}});
      std::cerr << "cohort: predict: logits of " << n << " inputs written to " << out.string() << std::endl;
    } else {
      const std::string text = json_lines(logits, files, class_names(cfg), o.top_k);
      if (o.out.empty())
        std::cout << text << std::flush;
      else
        util::write_file_atomic(o.out, text);
    }
  }
  world.comm->barrier("end of predict")->wait();
}

}  // namespace cohort::commands
