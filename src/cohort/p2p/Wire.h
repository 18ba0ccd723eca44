// Little-endian encoding of the swarm's message bodies: a writer that appends fixed-width integers,
// doubles, strings and raw bytes, and a reader that checks every read against the end, so a short or
// malformed body from a peer is an error with a reason, never a read past the buffer.
//
//   p2p::Writer w;  w.u64(round).f64(weight).bytes(data, n);
//   p2p::Reader r(body);  const auto round = r.u64();  if (!r.ok()) return "truncated";
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace cohort::p2p {

class Writer {
 public:
  Writer() = default;
  // Appends after what `start` holds: room a frame's header will take, say (p2p::Transport::send).
  explicit Writer(std::vector<uint8_t> start) : out_(std::move(start)) {}
  Writer& u8(uint8_t v) { return raw(&v, 1); }
  Writer& u64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
    return raw(b, 8);
  }
  Writer& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  Writer& f64(double v) {
    uint64_t u;
    std::memcpy(&u, &v, 8);
    return u64(u);
  }
  Writer& str(const std::string& s) {
    u64(s.size());
    return raw(s.data(), s.size());
  }
  Writer& raw(const void* p, size_t n) {
    const auto* c = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), c, c + n);
    return *this;
  }
  std::vector<uint8_t>& out() { return out_; }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  explicit Reader(const std::vector<uint8_t>& v) : Reader(v.data(), v.size()) {}
  // A reader reads its bytes in place: a temporary would be gone before the first read.
  explicit Reader(std::vector<uint8_t>&&) = delete;
  bool ok() const { return ok_; }
  size_t left() const { return ok_ ? static_cast<size_t>(end_ - p_) : 0; }
  uint8_t u8() {
    uint8_t v = 0;
    raw(&v, 1);
    return v;
  }
  uint64_t u64() {
    uint8_t b[8] = {};
    raw(b, 8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
    return v;
  }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  double f64() {
    const uint64_t u = u64();
    double v;
    std::memcpy(&v, &u, 8);
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    if (!ok_ || n > left()) return fail<std::string>();
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  // A view of the next n bytes (nullptr when fewer are left).
  const uint8_t* take(size_t n) {
    if (!ok_ || n > left()) return fail<const uint8_t*>();
    const uint8_t* at = p_;
    p_ += n;
    return at;
  }
  void raw(void* out, size_t n) {
    if (const uint8_t* at = take(n)) std::memcpy(out, at, n);
  }

 private:
  template <typename T>
  T fail() {
    ok_ = false;
    return T{};
  }
  const uint8_t* p_;
  const uint8_t* end_;
  bool ok_ = true;
};

}  // namespace cohort::p2p
