#include "host/image/digest.hpp"

#include <cstdlib>

#include <fmt/format.h>

namespace nes::image {

namespace {
bool is_lower_hex(std::string_view s) {
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}
}  // namespace

Result<Digest> Digest::parse(std::string_view text) {
  constexpr std::string_view kAlgo = "sha256:";
  if (text.substr(0, kAlgo.size()) != kAlgo || text.size() != kAlgo.size() + 64 ||
      !is_lower_hex(text.substr(kAlgo.size())))
    return Error{fmt::format("digest '{}': expected sha256:<64 lowercase hex digits>", text.substr(0, 200))};
  return Digest{std::string(text.substr(kAlgo.size()))};
}

Result<Digest> Digest::from_hex(std::string_view hex) {
  if (hex.size() != 64 || !is_lower_hex(hex))
    return Error{fmt::format("digest '{}': expected 64 lowercase hex digits", hex.substr(0, 200))};
  return Digest{std::string(hex)};
}

Digest sha256_digest(vm::Sha256& h) {
  if (!h.ok()) std::abort();  // out of memory
  return Digest{h.hex()};
}

Digest sha256_of(std::string_view bytes) {
  vm::Sha256 h;
  h.update(bytes);
  return sha256_digest(h);
}

}  // namespace nes::image
