// libFuzzer harness: the rendezvous store's wire protocol, which the server decodes from any process that
// reaches its port, before and after the handshake. Every input goes to each decoder; they must reject bad
// input with cohort::CommError (ProtocolError) and never allocate more than the input holds.
//
// A decoded request or response must also encode back to exactly the input: the format has one encoding
// per message, so a difference means the decoder accepted bytes it did not read, or misread some.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "FuzzSupport.h"
#include "cohort/store/StoreProtocol.h"
#include "cohort/util/Error.h"

namespace store = cohort::store;

namespace {

void check_round_trip(const std::string& encoded, std::string_view input, const char* what) {
  if (encoded == input) return;
  std::fprintf(stderr, "%s: decoding %zu bytes and encoding them again gave %zu different bytes\n", what, input.size(),
               encoded.size());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = cohort::fuzz::as_text(data, size);
  try {
    check_round_trip(store::encode_request(store::decode_request(bytes)), bytes, "request");
  } catch (const cohort::CommError& e) {
    cohort::fuzz::rejected(e);
  }
  try {
    check_round_trip(store::encode_response(store::decode_response(bytes)), bytes, "response");
  } catch (const cohort::CommError& e) {
    cohort::fuzz::rejected(e);
  }
  // What the server reads from a socket: frames one after another, each under the handshake's cap first.
  try {
    std::string_view rest = bytes;
    uint32_t cap = store::kMaxHandshakeFrameBytes;
    while (auto f = store::next_frame(rest, cap)) {
      if (f->consumed < 4 || f->consumed > rest.size() || f->payload.size() != f->consumed - 4) std::abort();
      rest.remove_prefix(f->consumed);
      cap = store::kMaxFrameBytes;
    }
  } catch (const cohort::CommError& e) {
    cohort::fuzz::rejected(e);
  }
  for (auto decode :
       {+[](std::string_view b) { store::decode_hello(b); }, +[](std::string_view b) { store::decode_auth(b); },
        +[](std::string_view b) { store::decode_auth_reply(b); }}) {
    try {
      decode(bytes);
    } catch (const cohort::CommError& e) {
      cohort::fuzz::rejected(e);
    }
  }
  return 0;
}
