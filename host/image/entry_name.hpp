// Archive entry names made relative and clean, shared by the layer unpacker (host/image/unpack.cpp)
// and `neshost load` (host/image/load.cpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace nes::image {

/// `raw`'s '/'-separated components joined by single '/'s, with empty and "." ones dropped
/// ("./a//b/" -> "a/b", "/" -> ""). A ".." drops the component before it (nothing above the root)
/// if `dotdot_pops`, else the name is refused: std::nullopt. Never fails otherwise.
inline std::optional<std::string> clean_entry_name(std::string_view raw, bool dotdot_pops) {
  std::string out;
  size_t i = 0;
  while (i <= raw.size()) {
    size_t j = raw.find('/', i);
    if (j == std::string_view::npos) j = raw.size();
    std::string_view c = raw.substr(i, j - i);
    if (c == "..") {
      if (!dotdot_pops) return std::nullopt;
      auto s = out.rfind('/');
      out = s == std::string::npos ? std::string() : out.substr(0, s);
    } else if (!c.empty() && c != ".") {
      if (!out.empty()) out += '/';
      out += c;
    }
    i = j + 1;
  }
  return out;
}

}  // namespace nes::image
