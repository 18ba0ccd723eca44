// Running training metrics (loss, top-1, top-5, images/s) summed locally and reduced across ranks at
// each log interval, plus the JSON-lines writer rank 0 uses for metrics.jsonl.
//
//   cohort::record::MetricWindow w;
//   w.add(logits, labels, loss_value);
//   auto g = w.reduce(*comm);           // every rank calls it; g.loss() is the global average
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "cohort/comm/Communicator.h"

namespace cohort::record {

struct MetricSums {
  double loss_sum = 0;  // sum over samples of the per-sample loss
  double correct1 = 0;
  double correct5 = 0;
  double count = 0;
  double loss() const { return count > 0 ? loss_sum / count : 0; }
  double top1() const { return count > 0 ? correct1 / count : 0; }
  double top5() const { return count > 0 ? correct5 / count : 0; }
};

class MetricWindow {
 public:
  // `mean_loss` is the batch's mean loss; logits [B, C], labels [B].
  void add(const at::Tensor& logits, const at::Tensor& labels, double mean_loss);
  // Sums across ranks (a collective: every rank must call it at the same point).
  MetricSums reduce(comm::Communicator& comm, const std::string& what) const;
  void reset() { sums_ = MetricSums{}; }
  const MetricSums& local() const { return sums_; }

 private:
  MetricSums sums_;
};

// Appends one JSON object per line and flushes, so a crash loses at most the line being written.
class JsonLines {
 public:
  JsonLines() = default;
  explicit JsonLines(const std::filesystem::path& path);
  void write(const nlohmann::json& record);
  bool is_open() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

}  // namespace cohort::record
