// Content digests of the image store (host/image/): the `Digest` value type of the OCI image spec
// ("sha256:<64 lowercase hex>", descriptor.md "Digests") and SHA-256 digests
// (streamed through vm::Sha256, OpenSSL's EVP).
#pragma once

#include <string>
#include <string_view>

#include "host/lib/base.hpp"
#include "host/vm/sha256.hpp"

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

/// The Digest of everything fed to `h` (vm::Sha256, libcrypto EVP: update() any number of times,
/// then this; as vm::Sha256::hex(), the first call ends `h` and later calls return the same).
/// Aborts if libcrypto could not make its context (out of memory).
Digest sha256_digest(vm::Sha256& h);

/// The SHA-256 digest of `bytes`.
Digest sha256_of(std::string_view bytes);

}  // namespace nes::image
