#include "host/vm/console.hpp"

namespace nes::vm {

std::string CrlfToLf::feed(std::string_view b) {
  std::string out;
  out.reserve(b.size() + 1);
  for (char c : b) {
    if (cr_) {
      if (c != '\n') out += '\r';  // a lone CR (e.g. a progress bar) is the workload's own byte
      cr_ = false;
    }
    if (c == '\r')
      cr_ = true;
    else
      out += c;
  }
  return out;
}

std::string CrlfToLf::finish() {
  if (!cr_) return {};
  cr_ = false;
  return "\r";
}

}  // namespace nes::vm
