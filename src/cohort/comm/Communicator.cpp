#include "cohort/comm/Communicator.h"

namespace cohort {
namespace {

class ThenHandle : public Handle {
 public:
  ThenHandle(HandlePtr inner, std::function<void()> fn) : inner_(std::move(inner)), fn_(std::move(fn)) {}
  void wait() override {
    if (done_) return;
    if (inner_) inner_->wait();
    if (fn_) fn_();
    done_ = true;
  }
  bool is_completed() override { return done_; }

 private:
  HandlePtr inner_;
  std::function<void()> fn_;
  bool done_ = false;
};

}  // namespace

HandlePtr then(HandlePtr inner, std::function<void()> fn) {
  return std::make_shared<ThenHandle>(std::move(inner), std::move(fn));
}

HandlePtr deferred(std::function<void()> fn) { return std::make_shared<ThenHandle>(nullptr, std::move(fn)); }

}  // namespace cohort
