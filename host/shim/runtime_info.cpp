// The shim's `-v` and `-info` (host/shim/runtime_info.hpp).
#include "host/shim/runtime_info.hpp"

#include <cstdint>

namespace nes::shim {

namespace {

/// Appends a protobuf varint.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

/// Appends field `field` of wire type 2 (length-delimited: a string or a message) holding `b`.
void bytes_field(std::string& out, unsigned field, std::string_view b) {
  varint(out, (static_cast<std::uint64_t>(field) << 3) | 2);
  varint(out, b.size());
  out.append(b);
}

std::string qualified_joined() {
  std::string s;
  for (auto q : kQualifiedAgainst) {
    if (!s.empty()) s += "; ";
    s += q;
  }
  return s;
}

}  // namespace

std::string version_text(std::string_view version) {
  std::string s = "containerd-shim-nesinit-v2:\n  Version: ";
  s += version;
  s += "\n  Qualified against:\n";
  for (auto q : kQualifiedAgainst) {
    s += "    ";
    s += q;
    s += "\n";
  }
  return s;
}

std::string runtime_info(std::string_view version) {
  std::string out, ver, entry;
  bytes_field(out, 1, "io.containerd.nesinit.v2");
  bytes_field(ver, 1, version);
  bytes_field(out, 2, ver);
  bytes_field(entry, 1, "io.nesinit.qualified-against");
  bytes_field(entry, 2, qualified_joined());
  bytes_field(out, 5, entry);
  return out;
}

}  // namespace nes::shim
