// `cohort predict`: what a trained model says about new inputs. Given image files or folders, it applies
// the model's evaluation transform (data/Presets.h for JPEG-folder models; Resize + CenterCrop to the
// dataset's size and its normalization for Fashion-MNIST and CIFAR-10) and reports the top-k classes with
// their probabilities as JSON lines; given a safetensors file of already-preprocessed images, it writes
// the logits to a safetensors file. Every rank takes its share of the inputs; rank 0 writes the result.
//
//   cohort::commands::PredictOptions o;
//   o.checkpoint = "runs/x";                 // a run directory (best, else last) or a .safetensors of weights
//   o.images = {"photos/"};                  // JPEG files or folders
//   cohort::commands::run_predict_worker(cfg, cohort::comm::world_from_env(cohort::comm::current_env()), o);
//   // one line per image: {"file":"photos/a.jpg","top":[{"class":3,"label":"Dress","probability":0.91},...]}
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "cohort/comm/WorldInfo.h"
#include "cohort/config/Config.h"

namespace cohort::commands {

struct PredictOptions {
  std::filesystem::path checkpoint;
  std::vector<std::filesystem::path> images;  // files, or folders searched for .jpg/.jpeg (any case)
  std::filesystem::path input;                // or: a safetensors file with one float tensor [N, C, H, W]
  std::filesystem::path out;                  // JSON lines, or the logits' safetensors file; empty: stdout
  int top_k = 5;
  int64_t batch_size = 32;
};

// The model's input: channels and square side, as the config's dataset gives them to training.
struct InputShape {
  int64_t channels = 0;
  int64_t image_size = 0;
};
InputShape input_shape(const TrainConfig& cfg);

// Class names of the config's dataset (Fashion-MNIST's and CIFAR-10's, or the class folders of an image
// folder's val/ when it is there); empty when unknown.
std::vector<std::string> class_names(const TrainConfig& cfg);

// The JPEG files of `paths` in order: files as given, folders searched recursively and sorted. Throws
// DataError naming a path that does not exist or a folder with no JPEG in it.
std::vector<std::filesystem::path> list_images(const std::vector<std::filesystem::path>& paths);

// The model's input for one JPEG file, [C, H, W] float32, normalized. Throws DataError naming the file.
at::Tensor preprocess_image(const TrainConfig& cfg, const std::filesystem::path& file);

void run_predict_worker(const TrainConfig& cfg, const comm::WorldInfo& info, const PredictOptions& options);

}  // namespace cohort::commands
