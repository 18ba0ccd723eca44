#include "cohort/util/Error.h"

#include <sstream>

namespace cohort::detail {

void internal_assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << "internal error (a bug in cohort): " << msg << " [" << cond << " at " << file << ":" << line << "]";
  throw std::logic_error(os.str());
}

}  // namespace cohort::detail
