// Images per second of cohort's ImageNet train pipeline without torch: read the file, decode (DCT-scaled,
// only the crop's rows), RandomResizedCrop(224), flip, normalize into a float CHW buffer. Generates N
// ImageNet-sized JPEGs (about 500x375, quality 90, smooth gradients plus waves and noise, so the entropy
// decoder has realistic work), then times 1 and 2 threads, each doing its share of the files. Prints JSON;
// bench/input_pipeline.py runs it next to bench/peer_torchvision_pipeline.py on the same files.
// Usage: input_pipeline [--images N] [--repeats R] [--keep DIR | --dir DIR]
//   --keep DIR  write the generated files to DIR and leave them there (for the torchvision peer)
//   --dir DIR   time the .jpg files already in DIR instead of generating any
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

// jpeglib.h needs size_t and FILE declared before it.
#include <jpeglib.h>

#include "cohort/data/ImageTransforms.h"
#include "cohort/util/Error.h"
#include "cohort/util/Rng.h"
// The test images are encoded by the same helper the tests use.
#include "support/JpegFiles.h"

namespace fs = std::filesystem;
using namespace cohort;

namespace {

// A photo-like test image: two-colour gradient, a few waves and per-pixel noise, with an ImageNet size.
std::vector<uint8_t> make_image(uint64_t seed, int& w, int& h) {
  util::Rng rng(seed);
  const int sizes[][2] = {{500, 375}, {500, 375}, {500, 333}, {375, 500}, {500, 400}, {469, 375}};
  const auto& s = sizes[rng.uniform_int(6)];
  w = s[0];
  h = s[1];
  double a[3], b[3], fx[3], fy[3], amp[3];
  for (int c = 0; c < 3; ++c) {
    a[c] = 255 * rng.uniform();
    b[c] = 255 * rng.uniform();
    fx[c] = 0.01 + 0.2 * rng.uniform();
    fy[c] = 0.01 + 0.2 * rng.uniform();
    amp[c] = 10 + 40 * rng.uniform();
  }
  const double noise = 18 + 22 * rng.uniform();
  std::vector<uint8_t> p(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const double t = (x + y) / double(w + h);
      for (int c = 0; c < 3; ++c) {
        const double v = a[c] + (b[c] - a[c]) * t + amp[c] * std::sin(x * fx[c] + 3 * std::sin(y * fy[c])) +
                         noise * (rng.uniform() - 0.5) * 2;
        p[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return p;
}

void read_file(const fs::path& path, std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw DataError("cannot open " + path.string());
  std::fseek(f, 0, SEEK_END);
  const long n = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  bytes.resize(static_cast<size_t>(n));
  const size_t got = std::fread(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  if (got != bytes.size()) throw DataError("short read of " + path.string());
}

// One pass over all files with `threads` threads, thread t taking files t, t + threads, ...
double run_pass(const std::vector<fs::path>& files, int threads, uint64_t epoch, double& checksum) {
  std::vector<double> sums(threads, 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      data::TransformOptions o;
      std::vector<uint8_t> bytes;
      std::vector<float> out(3 * 224 * 224);
      for (size_t i = t; i < files.size(); i += threads) {
        read_file(files[i], bytes);
        data::train_transform(bytes.data(), bytes.size(), util::mix_seed(0, epoch, i), o, out.data());
        sums[t] += out[i % out.size()];
      }
    });
  }
  for (auto& th : pool) th.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (double s : sums) checksum += s;
  return files.size() / seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string json_list(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

int main(int argc, char** argv) {
  int images = 256, repeats = 3;
  std::string keep, existing;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--images" && i + 1 < argc) {
      images = std::atoi(argv[++i]);
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else if (a == "--keep" && i + 1 < argc) {
      keep = argv[++i];
    } else if (a == "--dir" && i + 1 < argc) {
      existing = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--images N] [--repeats R] [--keep DIR | --dir DIR]\n", argv[0]);
      return 2;
    }
  }
  if (images <= 0 || repeats <= 0) {
    std::fprintf(stderr, "--images and --repeats must be positive\n");
    return 2;
  }
  try {
    const bool generate = existing.empty();
    const fs::path dir = !generate ? fs::path(existing)
                         : keep.empty()
                             ? fs::temp_directory_path() / ("cohort_input_pipeline_" + std::to_string(getpid()))
                             : fs::path(keep);
    std::vector<fs::path> files;
    size_t total_bytes = 0;
    if (!generate) {
      for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() == ".jpg") {
          files.push_back(e.path());
          total_bytes += fs::file_size(e.path());
        }
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) throw DataError("no .jpg files in " + dir.string());
      images = static_cast<int>(files.size());
    } else {
      fs::create_directories(dir);
    }
    for (int i = 0; generate && i < images; ++i) {
      int w = 0, h = 0;
      const std::vector<uint8_t> pixels = make_image(util::mix_seed(2024, i), w, h);
      const std::vector<uint8_t> jpg = cohort::testing::encode_jpeg(pixels, w, h);
      char name[32];
      std::snprintf(name, sizeof(name), "img_%05d.jpg", i);
      files.push_back(dir / name);
      std::ofstream(files.back(), std::ios::binary)
          .write(reinterpret_cast<const char*>(jpg.data()), static_cast<std::streamsize>(jpg.size()));
      total_bytes += jpg.size();
    }
    double checksum = 0;
    run_pass(files, 1, 0, checksum);  // warm-up: page cache, thread-local decoders
    std::vector<double> runs[2];
    for (int r = 0; r < repeats; ++r) {
      for (int t = 1; t <= 2; ++t) runs[t - 1].push_back(run_pass(files, t, 1 + r, checksum));
    }
    std::printf(
        "{\"cohort\": {\"threads_1\": %.2f, \"threads_2\": %.2f}, \"runs\": {\"threads_1\": %s, \"threads_2\": %s}, "
        "\"images\": %d, \"mean_file_bytes\": %zu, \"dir\": \"%s\", \"checksum\": %.6g}\n",
        median(runs[0]), median(runs[1]), json_list(runs[0]).c_str(), json_list(runs[1]).c_str(), images,
        total_bytes / images, dir.c_str(), checksum);
    if (generate && keep.empty()) fs::remove_all(dir);
  } catch (const cohort::Error& e) {
    std::fprintf(stderr, "input_pipeline: %s\n", e.describe().c_str());
    return 1;
  }
  return 0;
}
