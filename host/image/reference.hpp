// Image references as docker spells and normalises them (github.com/distribution/reference:
// ParseNormalizedNamed): `debian` is docker.io/library/debian:latest, `localhost:5000/a/b@sha256:…`
// keeps its registry, a first component with a '.' or ':' (or `localhost`) is a registry.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "host/image/digest.hpp"

namespace nes::image {

/// A normalised image reference.
struct Reference {
  std::string registry;    // "docker.io" (normalised from index.docker.io), "localhost:5000"
  std::string repository;  // "library/debian"
  std::string tag;         // "latest" when neither tag nor digest was given; "" with a digest alone
  std::optional<Digest> digest;

  /// The registry's API host: "registry-1.docker.io" for docker.io, else `registry` itself.
  std::string api_host() const;
  /// The full normalised form: "docker.io/library/debian:latest", "reg:5000/a@sha256:…",
  /// "reg/a:t@sha256:…". The store names its refs with it (index.json's ref.name annotation).
  std::string str() const;
  /// docker's short form: "debian:latest" (docker.io and library/ left out), as `images` shows it.
  std::string familiar() const;
  /// The repository as `images` shows it: "debian", "localhost:5000/a/b".
  std::string familiar_name() const;
  bool operator==(const Reference&) const = default;
};

/// Parses and normalises `text` by docker's rules. Errors name the reference and the part:
/// "invalid reference format: repository name must be lowercase: 'Debian'", "… tag '…'".
Result<Reference> parse_reference(std::string_view text);

}  // namespace nes::image
