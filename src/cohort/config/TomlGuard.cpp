#include "cohort/config/TomlGuard.h"

#include <algorithm>
#include <cstddef>

#include "cohort/util/Error.h"

namespace cohort::config {

// Note [toml++ 3.3 and non-ASCII text]
// Debian's toml++ 3.3.0 asks whether a non-ASCII character is whitespace with a function that reaches
// __builtin_unreachable for most of them (Latin-1, Greek, Cyrillic, kana...: marzer/tomlplusplus#190 and
// #295), which is undefined behaviour; the config fuzzer found it. It asks outside strings and comments,
// where TOML allows no non-ASCII character at all, and in a multi-line basic string ("""...""") after a
// backslash. So the text is scanned first and those places are refused, naming the line and column,
// before toml++ sees them. Only the second kind is valid TOML, and only a line continued with a
// backslash that goes on with a non-ASCII character.
void refuse_what_toml_cannot_read(std::string_view text, const std::string& source) {
  size_t i = text.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;  // toml++ skips a UTF-8 byte order mark
  int line = 1, column = 1;
  auto refuse = [&](const std::string& what, const std::string& hint) {
    throw ConfigError(source + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " + what, hint);
  };
  auto at = [&](size_t k) { return k < text.size() ? static_cast<unsigned char>(text[k]) : 0u; };
  auto quotes_at = [&](size_t k, char q) {
    size_t n = 0;
    while (k + n < text.size() && text[k + n] == q) ++n;
    return n;
  };
  enum class In { kToml, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral } in = In::kToml;
  // The last significant character outside strings: a quote opens a string only where TOML allows one
  // (a key, a value, an array element). Elsewhere (`+'...`) toml++ reads it as part of a bad token and
  // may scan on over non-ASCII bytes, so for us it opens nothing and what follows must be ASCII.
  unsigned char prev = '\n';
  auto may_open_string = [&] {
    return prev == '\n' || prev == '=' || prev == '[' || prev == ',' || prev == '{' || prev == '.';
  };
  while (i < text.size()) {
    const unsigned char c = at(i);
    size_t step = 1;
    switch (in) {
      case In::kToml:
        if (c >= 0x80)
          refuse("non-ASCII character outside a quoted string or comment",
                 "TOML allows non-ASCII text only inside quoted strings and comments");
        if (c == '#') in = In::kComment;
        if ((c == '"' || c == '\'') && !may_open_string()) {
          prev = c;
          break;
        }
        if (c != ' ' && c != '\t' && c != '\r' && c != '#' && c != '"' && c != '\'') prev = c;
        if (c == '"' || c == '\'') {
          const size_t n = quotes_at(i, static_cast<char>(c));
          const bool multi = n >= 3;
          in = c == '"' ? (multi ? In::kMultiBasic : In::kBasic) : (multi ? In::kMultiLiteral : In::kLiteral);
          step = multi ? 3 : 1;
        }
        break;
      case In::kComment:
        if (c == '\n') in = In::kToml, prev = '\n';
        break;
      case In::kBasic:
        if (c == '\\') step = 2;  // an escape: the next byte never ends the string
        if (c == '"' || c == '\n') in = In::kToml, prev = c;
        break;
      case In::kLiteral:
        if (c == '\'' || c == '\n') in = In::kToml, prev = c;
        break;
      case In::kMultiBasic:
        if (c == '\\') {
          // toml++ tests what follows a backslash for whitespace, and after a line-ending backslash the
          // first character that is not whitespace: either must be ASCII.
          size_t k = i + 1;
          if (at(k) == ' ' || at(k) == '\t' || at(k) == '\r' || at(k) == '\n')
            while (at(k) == ' ' || at(k) == '\t' || at(k) == '\r' || at(k) == '\n') ++k;
          if (at(k) >= 0x80) {
            for (; i < k; ++i) {  // point at the character
              if (text[i] == '\n')
                line += 1, column = 1;
              else
                ++column;
            }
            refuse(
                "non-ASCII character right after a backslash in a multi-line string, which the TOML "
                "library (toml++ 3.3) cannot read safely",
                "begin the continued line with an ASCII character, or write it as \\uXXXX");
          }
          step = k == i + 1 ? 2 : k - i;  // an escape pair, or the backslash and the whitespace after it
        } else if (c == '"' && quotes_at(i, '"') >= 3) {
          in = In::kToml;
          prev = '"';
          step = quotes_at(i, '"');  // """ and up to two quotes of content before it
        }
        break;
      case In::kMultiLiteral:
        if (c == '\'' && quotes_at(i, '\'') >= 3) {
          in = In::kToml;
          prev = '\'';
          step = quotes_at(i, '\'');
        }
        break;
    }
    for (size_t end = std::min(i + step, text.size()); i < end; ++i) {
      const auto b = static_cast<unsigned char>(text[i]);
      if (b == '\n')
        line += 1, column = 1;
      else if ((b & 0xC0) != 0x80)
        ++column;  // columns count characters, as toml++'s do
    }
  }
}

}  // namespace cohort::config
