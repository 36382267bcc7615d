// Registry credentials (`neshost login`/`logout`) in docker's config.json format:
//   {"auths": {"HOST[:PORT]": {"auth": base64("USER:PASSWORD")}}, ...}
// at STATE/.auth/config.json (directory 0700, file 0600; a VM id never starts with '.', so no
// VM's directory is in the way). Docker Hub's key is docker's own, "https://index.docker.io/v1/".
// Other top-level keys and other registries' entries are kept as they are. Writes are atomic
// (a temp file renamed over the old one).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "host/image/registry.hpp"

namespace nes::image {

/// STATE/.auth/config.json.
std::filesystem::path credentials_file(const std::filesystem::path& state_dir);

/// The auths key for a registry: docker's "https://index.docker.io/v1/" for Docker Hub
/// ("docker.io", "index.docker.io", "registry-1.docker.io"), else the host as given.
std::string credential_key(std::string_view registry);

/// The credential stored for `registry`, nullopt when there is none (or no file). Errors name the
/// file and what is wrong in it (unreadable, not JSON, an auth that is not base64 of USER:PASS).
Result<std::optional<Credential>> load_credential(const std::filesystem::path& state_dir,
                                                  std::string_view registry);

/// Stores (replaces) `registry`'s credential. Errors name the file.
Status store_credential(const std::filesystem::path& state_dir, std::string_view registry, const Credential& cred);

/// Removes `registry`'s credential; false when there was none.
Result<bool> remove_credential(const std::filesystem::path& state_dir, std::string_view registry);

}  // namespace nes::image
