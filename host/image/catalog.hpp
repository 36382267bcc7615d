// The store's images as `neshost images`, `rmi`, `tag`, `image inspect` and `run` see them: each
// ref resolved to its manifest and config, matched by name or image ID as docker matches them,
// and which VMs use an image (their image.json, written by `run IMAGE`).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/image/manifest.hpp"
#include "host/image/reference.hpp"
#include "host/image/store.hpp"

namespace nes::image {

/// The file in a VM's state dir naming the image it runs (`run IMAGE`): JSON {"ref": NAME,
/// "config": "sha256:…"}. `rmi` refuses an image named by one.
inline constexpr std::string_view kVmImageFile = "image.json";

/// One ref of the store, resolved.
struct ImageEntry {
  std::string ref_name;              // index.json's name
  std::optional<Reference> ref;      // parsed; nullopt for an untagged image (named by digest)
  Descriptor manifest_desc;          // the manifest (for an index: the platform's)
  Manifest manifest;
  Digest config_digest;              // docker's IMAGE ID
  ImageConfig config;
  std::uint64_t size = 0;            // config + layer blob bytes (compressed, as stored)
  std::string error;                 // not "" when the ref could not be resolved (the rest empty)
};

/// Every ref of `store`, resolved for `platform`.
Result<std::vector<ImageEntry>> list_images(const Store& store, std::string_view platform = "linux/amd64");

/// The entries `text` names, docker's order of tries: a reference (normalised: `busybox` is
/// docker.io/library/busybox:latest), then a full or short image ID (`sha256:HEX`, `HEX`, a
/// prefix of at least 4 hex digits of the config digest), then a manifest digest. Empty: none.
/// `by_id` says whether it matched as an ID (every ref of that image) rather than as a name.
std::vector<const ImageEntry*> match_images(const std::vector<ImageEntry>& all, std::string_view text,
                                            bool* by_id = nullptr);

/// The VMs under `state` whose image.json names image config `config`, sorted.
std::vector<std::string> vms_using(const std::filesystem::path& state, const Digest& config);

/// Every image config any VM under `state` uses (their roots are kept by GC).
std::vector<Digest> configs_in_use(const std::filesystem::path& state);

}  // namespace nes::image
