#include "host/vm/sha256.hpp"

#include <openssl/evp.h>

#include <fmt/format.h>

namespace nes::vm {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = nullptr;
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::update(std::string_view bytes) {
  if (ctx_ && !ended_) EVP_DigestUpdate(ctx_, bytes.data(), bytes.size());
}

std::string Sha256::hex() {
  // EVP_DigestFinal_ex once only: a finished context is not finished again.
  if (ended_ || !ctx_) return hex_;
  ended_ = true;
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (EVP_DigestFinal_ex(ctx_, md, &len) != 1) return hex_;
  for (unsigned i = 0; i < len; ++i) hex_ += fmt::format("{:02x}", md[i]);
  return hex_;
}

}  // namespace nes::vm
