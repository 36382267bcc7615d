// Content digests of the image store (host/image/): the `Digest` value type of the OCI image spec
// ("sha256:<64 lowercase hex>", descriptor.md "Digests") and a streaming SHA-256 on OpenSSL's EVP.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "host/lib/base.hpp"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace nes::image {

using host::Error;
using host::Ok;
using host::Result;
using host::Status;

/// A content digest: algorithm "sha256" and 64 lowercase hex digits (the only algorithm the store
/// takes; sha512 and others are refused by parse(), naming the digest).
struct Digest {
  std::string hex;  // 64 lowercase hex digits

  /// "sha256:<hex>" -> Digest. Errors name the text: "digest 'x': expected sha256:<64 hex digits>".
  static Result<Digest> parse(std::string_view text);
  /// From 64 hex digits alone (a blob's file name); errors as parse().
  static Result<Digest> from_hex(std::string_view hex);
  /// "sha256:<hex>".
  std::string str() const { return "sha256:" + hex; }
  /// The first 12 hex digits (docker's short IMAGE ID).
  std::string short_id() const { return hex.substr(0, 12); }
  bool operator==(const Digest&) const = default;
  auto operator<=>(const Digest&) const = default;
};

/// An incremental SHA-256 (libcrypto EVP): update() any number of times, then digest().
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  /// Feeds bytes (a no-op after digest()).
  void update(std::span<const std::byte> bytes);
  void update(std::string_view bytes) { update(std::as_bytes(std::span(bytes.data(), bytes.size()))); }
  /// The digest of everything fed before the first call (later calls return the same).
  Digest digest();

 private:
  evp_md_ctx_st* ctx_;
  bool ended_ = false;
  Digest d_;
};

/// The SHA-256 digest of `bytes`.
Digest sha256_of(std::string_view bytes);

}  // namespace nes::image
