// The flags every command that talks to a registry shares (pull, login): --cert-dir DIR
// (skopeo's) and --tls-verify=BOOL (podman's), and how a registry name as typed maps to the host
// the client talks to (docker's: "docker.io" is served by registry-1.docker.io).
#pragma once

#include <string>
#include <string_view>

#include <fmt/format.h>

#include "host/cli/flags.hpp"
#include "host/image/registry.hpp"

namespace nes::cli {

/// The two TLS flags as FlagSpecs (append to a command's table).
inline constexpr FlagSpec kCertDirFlag{"cert-dir", true};
inline constexpr FlagSpec kTlsVerifyFlag{"tls-verify", true};

/// --cert-dir and --tls-verify=true|false from `p`. Errors name the flag.
inline host::Result<image::TlsConfig> registry_tls(const Parsed& p) {
  image::TlsConfig tls;
  if (auto d = p.get("cert-dir")) {
    if (d->empty()) return host::Error{"--cert-dir needs a directory"};
    tls.cert_dir = *d;
  }
  if (auto v = p.get("tls-verify")) {
    if (*v == "true" || *v == "1") tls.verify = true;
    else if (*v == "false" || *v == "0") tls.verify = false;
    else return host::Error{fmt::format("--tls-verify: '{}' is neither true nor false", *v)};
  }
  return tls;
}

/// A registry as a user types it for login/logout ("https://127.0.0.1:5000/", "docker.io") ->
/// {the name credentials are stored under, the host the API is reached at}.
inline std::pair<std::string, std::string> registry_names(std::string_view typed) {
  if (typed.starts_with("https://")) typed.remove_prefix(8);
  else if (typed.starts_with("http://")) typed.remove_prefix(7);
  while (typed.ends_with("/")) typed.remove_suffix(1);
  if (auto slash = typed.find('/'); slash != std::string_view::npos) typed = typed.substr(0, slash);  // "/v1", "/v2"
  std::string name(typed);
  if (name == "docker.io" || name == "index.docker.io" || name == "registry-1.docker.io")
    return {"docker.io", "registry-1.docker.io"};
  return {name, name};
}

}  // namespace nes::cli
