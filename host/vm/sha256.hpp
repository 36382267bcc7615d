// SHA-256 with libcrypto, as lowercase hex: a snapshot's files (host/vm/snapshot.hpp), the
// shim's names (host/shim/identity.hpp) and the image store's digests (host/image/digest.hpp).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace nes::vm {

/// An incremental SHA-256: update() with bytes any number of times, then hex() (as often as wanted).
class Sha256 {
 public:
  /// A fresh digest; ok() says whether libcrypto made its context (else update() does nothing
  /// and hex() is "").
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  bool ok() const { return ctx_ != nullptr; }
  /// Feeds `bytes` into the digest; after hex() it does nothing (the digest is ended).
  void update(std::string_view bytes);
  /// The same for raw bytes (a blob's or a layer's chunks).
  void update(std::span<const std::byte> bytes) {
    update(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  }
  /// The digest of everything fed before the first call: 64 lowercase hex digits. The first call
  /// ends the digest and keeps the result, which every later call returns ("" if !ok()).
  std::string hex();

 private:
  evp_md_ctx_st* ctx_;
  bool ended_ = false;  // hex() ran: ctx_ is finished, hex_ is the digest
  std::string hex_;
};

}  // namespace nes::vm
