// `neshost pull`'s core: a reference -> its manifest at the registry (a manifest list or index:
// the one for the wanted platform) -> its config and layers streamed into the store's verified
// ingest (several at once, each at most once even when another pull writes the same blob) ->
// the manifest blob -> the ref in index.json, last: until then nothing names what was written,
// and an interrupted pull leaves only complete, verified blobs, which the next pull reuses.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "host/image/manifest.hpp"
#include "host/image/reference.hpp"
#include "host/image/registry.hpp"
#include "host/image/store.hpp"

namespace nes::image {

/// What happens to one blob of an image (config or layer), for progress output.
enum class BlobState {
  present,      // already in the store: not downloaded
  waiting,      // another writer (another pull) has it in flight: waiting for it
  downloading,  // bytes arriving (`done` of `size`)
  complete,     // verified and in the store
};

/// One progress event: blob `index` (0 the config, then the layers in order) changed.
struct BlobEvent {
  std::size_t index = 0;
  Digest digest;
  std::uint64_t size = 0, done = 0;
  BlobState state = BlobState::downloading;
  bool is_config = false;
};

/// How to pull.
struct PullOptions {
  std::string platform = "linux/amd64";  // picked from a manifest list / index
  TlsConfig tls;
  std::optional<Credential> credential;  // basic auth / the token realm's credentials
  unsigned parallel = 3;                 // blobs downloading at once (docker's default)
  const std::atomic<bool>* cancel = nullptr;  // true: stop (the error says "interrupted")
  /// Called once the manifest is known, with every blob (all in state present or downloading).
  std::function<void(const std::vector<BlobEvent>& blobs)> on_plan;
  /// Called on every change of a blob (bytes: at most every 64 KiB or so, as they arrive).
  std::function<void(const BlobEvent&)> on_blob;
};

/// What a pull did.
struct PullResult {
  Digest resolved;          // the digest REF named at the registry (an index's when it is one)
  Descriptor manifest;      // the image manifest the ref now names in the store
  std::string ref_name;     // the ref's name in index.json (Reference::str())
  std::size_t blobs_fetched = 0, blobs_present = 0;
  std::uint64_t bytes_fetched = 0;
};

/// Pulls `ref` into `store`. Errors name the registry and the reason (manifest or blob, 401 after
/// auth, 404, 5xx, TLS, refused, digest or size mismatch, no manifest for the platform,
/// interrupted); on any error the store's refs are unchanged and only verified blobs were added.
Result<PullResult> pull(Store& store, const Reference& ref, const PullOptions& opt);

}  // namespace nes::image
