#include "host/image/digest.hpp"

#include <openssl/evp.h>

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

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) std::abort();  // out of memory
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::update(std::span<const std::byte> bytes) {
  if (!ended_ && !bytes.empty()) EVP_DigestUpdate(ctx_, bytes.data(), bytes.size());
}

Digest Sha256::digest() {
  if (!ended_) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, md, &n);
    static constexpr char kHex[] = "0123456789abcdef";
    d_.hex.clear();
    for (unsigned i = 0; i < n; ++i) {
      d_.hex += kHex[md[i] >> 4];
      d_.hex += kHex[md[i] & 15];
    }
    ended_ = true;
  }
  return d_;
}

Digest sha256_of(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.digest();
}

}  // namespace nes::image
