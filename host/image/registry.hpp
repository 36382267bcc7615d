// A registry v2 client (the OCI distribution spec's pull side) on libcurl: manifests by tag or
// digest with the OCI and Docker Accept types, blobs streamed to a caller's sink (redirects
// followed; curl drops the Authorization header on a redirect to another host, as object-store
// redirects need), bearer tokens from a 401's WWW-Authenticate (anonymous, or with basic
// credentials sent to the token realm), plain basic auth, and TLS verified against the system's
// CAs plus the registry's own (docs/images.md "Pull": /etc/containers/certs.d/HOST:PORT,
// /etc/docker/certs.d/HOST:PORT, --cert-dir). Several blobs download at once through one curl
// multi handle, bounded. Every wait is bounded (connect 30 s, < 1 B/s for 60 s is a stall), every
// body the client keeps is bounded, and every error names the registry and the reason.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "host/lib/base.hpp"

namespace nes::image {

using host::Error;
using host::Result;
using host::Status;

/// How a registry's TLS certificate is checked.
struct TlsConfig {
  /// false (`--tls-verify=false`, podman's): no certificate check, and plain HTTP when the
  /// registry does not speak TLS (docker's "insecure registry").
  bool verify = true;
  /// `--cert-dir DIR` (skopeo's): *.crt are CAs, a *.cert with its *.key a client certificate.
  /// When set, the certs.d directories are not read (as skopeo and podman do).
  std::filesystem::path cert_dir;
  /// Roots searched for HOST:PORT/ (then HOST/) when cert_dir is empty, in order.
  std::vector<std::filesystem::path> certs_d = {"/etc/containers/certs.d", "/etc/docker/certs.d"};
};

/// Basic credentials (`neshost login`; docker's config.json auths).
struct Credential {
  std::string username;
  std::string password;
};

/// A manifest (or index) as the registry served it.
struct FetchedManifest {
  std::string media_type;  // Content-Type (parameters stripped)
  std::string body;        // at most kMaxManifest bytes
  std::string digest;      // the registry's Docker-Content-Digest header (may be empty)
};

/// Largest manifest or index accepted (containerd's limit too).
inline constexpr std::size_t kMaxManifest = 4u << 20;

/// The Accept header values for manifests: OCI index/manifest, Docker list/manifest.
inline constexpr std::string_view kManifestAccept =
    "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.docker.distribution.manifest.v2+json";

/// One blob to download: its digest ("sha256:..."), its size in bytes, and where its bytes go.
/// `write` gets the body in order (an error from it ends this blob and the batch); `finish`
/// runs once the body is complete (e.g. the store's verify-and-commit). `progress` (may be
/// empty) gets (bytes so far, size) from the transfer loop's thread.
struct BlobJob {
  std::string digest;
  std::uint64_t size = 0;
  std::function<Status(std::span<const std::byte>)> write;
  std::function<Status()> finish;
  std::function<void(std::uint64_t done, std::uint64_t total)> progress;
};

/// A WWW-Authenticate challenge: its scheme ("Bearer", "Basic") and auth-params (keys lower case).
struct Challenge {
  std::string scheme;
  std::map<std::string, std::string> params;
};

/// Parses the first challenge of a WWW-Authenticate value (RFC 7235: scheme, then
/// key=value or key="quoted" pairs separated by commas). nullopt when it does not parse.
std::optional<Challenge> parse_challenge(std::string_view header);

/// A client for one registry host ("127.0.0.1:5000", "registry-1.docker.io"). Not thread-safe:
/// one thread drives it; fetch_blobs() runs its transfers concurrently on that thread.
class Registry {
 public:
  /// `host` as in a reference (HOST[:PORT]); `cred` is used for basic auth and the token realm.
  Registry(std::string host, TlsConfig tls, std::optional<Credential> cred);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  /// GET /v2/ through the auth flow: Ok when the registry answers 200 with our credentials
  /// (what `neshost login` checks). Errors name the registry and the reason.
  Status ping();

  /// GET /v2/REPO/manifests/REF (REF a tag or "sha256:..."), Accept: kManifestAccept.
  Result<FetchedManifest> get_manifest(std::string_view repo, std::string_view ref);

  /// Downloads `jobs` from REPO, at most `parallel` at once. Stops at the first failure (the
  /// transfers in flight are aborted; blobs already finished stay finished) or when `*cancel`
  /// becomes true (checked at least every 200 ms; the error then says "interrupted").
  Status fetch_blobs(std::string_view repo, std::vector<BlobJob>& jobs, unsigned parallel,
                     const std::atomic<bool>* cancel = nullptr);

  /// "https://HOST" (or http:// after an insecure fallback).
  const std::string& base_url() const { return base_; }
  const std::string& host() const { return host_; }

  struct Impl;

 private:
  std::string host_;
  std::string base_;
  std::unique_ptr<Impl> impl_;
};

/// The CA and client-certificate files that apply to `host` under `tls` (for tests and
/// docs/images.md): {CA files, client cert, client key}.
struct CertFiles {
  std::vector<std::filesystem::path> cas;
  std::filesystem::path client_cert, client_key;
};
CertFiles cert_files_for(const std::string& host, const TlsConfig& tls);

}  // namespace nes::image
