// Force-included into the fuzz build's own copy of toml++ (see CMakeLists.txt here), before toml++.
//
// toml++ 3.3.0's debug assertions hold a wrong one: parse_key() asserts that it starts on a key character,
// but a table header without a key ("[" then a newline, kept in regressions/fuzz_config/) reaches it,
// and the parser's next line reports the error properly. Debian's libtomlplusplus.so, which cohort links,
// is built by gcc with NDEBUG, so there these assertions are compiled out (and gcc has no
// __builtin_assume for toml++ to turn them into). They are off here too, so that the fuzzer explores past
// that input; AddressSanitizer and UBSan still watch the parser.
#pragma once
#define TOML_ASSERT(expr) static_cast<void>(0)
