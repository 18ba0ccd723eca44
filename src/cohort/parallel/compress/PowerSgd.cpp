#include "cohort/parallel/compress/PowerSgd.h"

#include <ATen/CPUGeneratorImpl.h>

#include <iostream>

#include "cohort/util/Error.h"
#include "cohort/util/Rng.h"

namespace cohort::parallel::compress {
namespace {

// Orthonormal columns spanning the same space, in place. Householder QR (not Gram-Schmidt) so that a
// zero or rank-deficient column yields zeros or an arbitrary orthonormal direction, never NaN; it is
// deterministic, so every rank, holding the same all-reduced P, gets the same bits.
void orthogonalize(at::Tensor& p) { p.copy_(std::get<0>(at::linalg_qr(p, "reduced"))); }

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

std::vector<MatrixPlan> plan_matrices(const std::vector<std::vector<int64_t>>& shapes, const PowerSgdOptions& o) {
  std::vector<MatrixPlan> out;
  for (const auto& shape : shapes) {
    MatrixPlan p;
    p.n = shape.empty() ? 1 : shape[0];
    int64_t numel = 1;
    for (auto d : shape) numel *= d;
    p.m = p.n == 0 ? 0 : numel / p.n;
    p.r = std::min({p.n, p.m, o.rank});
    // PyTorch's _should_compress: a vector is n x 1 and never pays.
    p.compress =
        p.r > 0 && static_cast<double>((p.n + p.m) * p.r) * o.min_compression_rate < static_cast<double>(p.n * p.m);
    out.push_back(p);
  }
  return out;
}

int64_t compressed_numel(const std::vector<MatrixPlan>& plan) {
  int64_t n = 0;
  for (const auto& p : plan) n += p.compress ? (p.n + p.m) * p.r : p.n * p.m;
  return n;
}

PowerSgdHook::PowerSgdHook(PowerSgdOptions options) : options_(options) {
  if (options_.rank < 1)
    throw ConfigError("powersgd.rank must be at least 1, got " + std::to_string(options_.rank),
                      "use powersgd.rank=1 (PyTorch's default) to 4");
}

void PowerSgdHook::attach(const std::vector<parallel::ddp::GradBucket>& buckets, comm::Communicator&) {
  buckets_.clear();
  for (const auto& b : buckets) {
    BucketState st;
    st.names = b.names;
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& g : b.grads) shapes.push_back(g.sizes().vec());
    st.plan = plan_matrices(shapes, options_);
    st.error = at::zeros_like(b.buffer);
    int64_t q_numel = 0;
    for (const auto& p : st.plan)
      if (p.compress) q_numel += p.m * p.r;
    st.q_flat = at::zeros({q_numel}, b.buffer.options());
    int64_t offset = 0;
    for (const auto& p : st.plan) {
      if (!p.compress) continue;
      st.q.push_back(st.q_flat.narrow(0, offset, p.m * p.r).view({p.m, p.r}));
      offset += p.m * p.r;
    }
    buckets_.push_back(std::move(st));
  }
}

void PowerSgdHook::init_q(size_t bucket, BucketState& st) {
  // Seeded by (seed, bucket, step), never by rank: every rank draws the same Q.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(util::mix_seed(options_.seed, bucket, iter_));
  for (auto& q : st.q) {
    q.copy_(at::randn(q.sizes(), gen, q.options().device(at::kCPU)));
    orthogonalize(q);
  }
  st.q_valid = true;
}

comm::HandlePtr PowerSgdHook::run(comm::Communicator& comm, parallel::ddp::GradBucket& bucket) {
  COHORT_ASSERT(bucket.index < buckets_.size(), "PowerSgdHook::run before attach");
  auto& st = buckets_[bucket.index];
  const std::string what = "gradient bucket " + std::to_string(bucket.index);
  const auto world = comm.size();
  auto buffer = bucket.buffer;
  if (iter_ < options_.start_iter || buffer.scalar_type() != at::kFloat || st.q.empty()) {
    // See Note [Where gradients are divided by world size].
    buffer.div_(world);
    bucket.wire_bytes = bytes_of(buffer);
    return comm.all_reduce(buffer, comm::ReduceOp::kSum, what);
  }

  // The residual of last step joins this step's gradient; `input` is what this rank wanted to send.
  at::Tensor input;
  if (options_.error_feedback) {
    buffer.add_(st.error);
    input = buffer.clone();
  }
  if (!st.q_valid || !options_.warm_start) init_q(bucket.index, st);

  std::vector<at::Tensor> matrices, rest;
  for (size_t k = 0; k < st.plan.size(); ++k) {
    if (st.plan[k].compress)
      matrices.push_back(bucket.grads[k].view({st.plan[k].n, st.plan[k].m}));
    else
      rest.push_back(bucket.grads[k].view(-1));
  }
  // The uncompressed gradients travel in one flat all-reduce; the P factors in another.
  at::Tensor rest_flat = rest.empty() ? at::Tensor() : at::cat(rest);
  int64_t p_numel = 0;
  for (const auto& p : st.plan)
    if (p.compress) p_numel += p.n * p.r;
  auto p_flat = at::empty({p_numel}, buffer.options());
  std::vector<at::Tensor> ps;
  int64_t offset = 0;
  for (size_t i = 0, k = 0; k < st.plan.size(); ++k) {
    if (!st.plan[k].compress) continue;
    ps.push_back(p_flat.narrow(0, offset, st.plan[k].n * st.plan[k].r).view({st.plan[k].n, st.plan[k].r}));
    offset += st.plan[k].n * st.plan[k].r;
    at::matmul_out(ps.back(), matrices[i], st.q[i]);
    ++i;
  }
  comm::HandlePtr rest_handle;
  if (rest_flat.defined()) {
    rest_flat.div_(world);  // See Note [Where gradients are divided by world size].
    rest_handle = comm.all_reduce(rest_flat, comm::ReduceOp::kSum, what + " (uncompressed part)");
  }
  auto p_handle = comm.all_reduce(p_flat, comm::ReduceOp::kSum, what + " (PowerSGD P)");
  bucket.wire_bytes = bytes_of(rest_flat) + bytes_of(p_flat) + bytes_of(st.q_flat);

  // The Q stage needs the reduced P, so it runs when the reducer waits on this bucket, after backward.
  // Every rank waits on buckets in the same order, so the Q all-reduces pair up too.
  return comm::deferred(
      [this, &comm, &st, what, world, buffer, input, matrices, rest, rest_flat, p_handle, ps, rest_handle]() mutable {
        p_handle->wait();
        for (size_t i = 0; i < ps.size(); ++i) {
          orthogonalize(ps[i]);
          at::matmul_out(st.q[i], matrices[i].t(), ps[i]);
        }
        comm.all_reduce(st.q_flat, comm::ReduceOp::kSum, what + " (PowerSGD Q)")->wait();
        st.q_flat.div_(world);
        // M ~ P Q^T: the projection of the average gradient onto P's columns, the same on every rank.
        for (size_t i = 0; i < ps.size(); ++i) at::matmul_out(matrices[i], ps[i], st.q[i].t());
        if (rest_handle) {
          rest_handle->wait();
          int64_t off = 0;
          for (auto& t : rest) {
            t.copy_(rest_flat.narrow(0, off, t.numel()));
            off += t.numel();
          }
        }
        if (options_.error_feedback) at::sub_out(st.error, input, buffer);
        // Warm start keeps the averaged Q for next step; without it, a fresh Q is drawn each step.
        st.q_valid = options_.warm_start;
      });
}

parallel::ddp::HookState PowerSgdHook::state_dict(comm::Communicator& comm) {
  parallel::ddp::HookState out;
  out.emplace_back("powersgd.iteration", at::full({1}, iter_, at::kLong));
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto& st = buckets_[b];
    out.emplace_back("powersgd.q_valid." + std::to_string(b), at::full({1}, int64_t{st.q_valid}, at::kLong));
    for (size_t i = 0, k = 0; k < st.plan.size(); ++k)
      if (st.plan[k].compress) out.emplace_back("powersgd.q." + st.names[k], st.q[i++].clone());
    if (!options_.error_feedback) continue;
    // Each rank's residual is its own: gather them all so rank 0 can save them.
    const int64_t n = st.error.numel();
    auto all = at::empty({comm.size() * n}, st.error.options());
    comm.all_gather(all, st.error, "PowerSGD residuals for the checkpoint")->wait();
    int64_t offset = 0;
    for (size_t k = 0; k < st.plan.size(); ++k) {
      const int64_t numel = st.plan[k].n * st.plan[k].m;
      for (int r = 0; r < comm.size(); ++r)
        out.emplace_back("powersgd.error.rank" + std::to_string(r) + "." + st.names[k],
                         all.narrow(0, r * n + offset, numel).clone());
      offset += numel;
    }
  }
  return out;
}

void PowerSgdHook::load_state_dict(const parallel::ddp::HookState& state, comm::Communicator& comm) {
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  auto take = [&](const std::string& key) -> at::Tensor {
    auto it = by_name.find(key);
    return it == by_name.end() ? at::Tensor() : it->second;
  };
  auto it = take("powersgd.iteration");
  if (!it.defined()) return;  // saved without PowerSGD: start afresh
  iter_ = it.item<int64_t>();
  bool errors_dropped = false;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto& st = buckets_[b];
    auto valid = take("powersgd.q_valid." + std::to_string(b));
    st.q_valid = valid.defined() && valid.item<int64_t>() != 0;
    int64_t offset = 0;
    for (size_t i = 0, k = 0; k < st.plan.size(); ++k) {
      const int64_t numel = st.plan[k].n * st.plan[k].m;
      if (st.plan[k].compress) {
        auto q = take("powersgd.q." + st.names[k]);
        if (!q.defined() || q.sizes() != st.q[i].sizes())
          throw CheckpointError("the checkpoint's PowerSGD state has no Q of shape " + c10::str(st.q[i].sizes()) +
                                    " for '" + st.names[k] + "'",
                                "resume with the powersgd.rank and model the run was saved with");
        st.q[i++].copy_(q);
      }
      auto e = take("powersgd.error.rank" + std::to_string(comm.rank()) + "." + st.names[k]);
      auto slot = st.error.narrow(0, offset, numel);
      if (e.defined() && e.numel() == numel)
        slot.copy_(e.view(-1));
      else {
        slot.zero_();
        errors_dropped = errors_dropped || options_.error_feedback;
      }
      offset += numel;
    }
  }
  if (errors_dropped && comm.rank() == 0)
    std::cerr << "cohort: note: the checkpoint has no PowerSGD residual for some ranks (saved at another world "
                 "size, or without error feedback); they start from zero\n";
}

}  // namespace cohort::parallel::compress
