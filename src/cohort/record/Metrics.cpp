#include "cohort/record/Metrics.h"

#include <fstream>

#include "cohort/util/Error.h"

namespace cohort::record {

void MetricWindow::add(const at::Tensor& logits, const at::Tensor& labels, double mean_loss) {
  const int64_t n = labels.size(0);
  const int64_t k = std::min<int64_t>(5, logits.size(1));
  auto top = std::get<1>(logits.detach().topk(k, /*dim=*/1));
  auto hits = top.eq(labels.view({-1, 1}));
  sums_.correct1 += hits.select(1, 0).sum().item<double>();
  sums_.correct5 += hits.any(1).sum().item<double>();
  sums_.loss_sum += mean_loss * static_cast<double>(n);
  sums_.count += static_cast<double>(n);
}

MetricSums MetricWindow::reduce(comm::Communicator& comm, const std::string& what) const {
  auto t = at::tensor({sums_.loss_sum, sums_.correct1, sums_.correct5, sums_.count}, at::kDouble);
  if (comm.size() > 1) comm.all_reduce(t, comm::ReduceOp::kSum, what)->wait();
  auto* p = t.data_ptr<double>();
  return MetricSums{p[0], p[1], p[2], p[3]};
}

JsonLines::JsonLines(const std::filesystem::path& path) : out_(path, std::ios::app) {
  if (!out_) throw Error("cannot open " + path.string() + " for writing", "check run.dir is writable");
}

void JsonLines::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace cohort::record
