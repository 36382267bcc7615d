// Unpacking image layers into a root directory (docs/images.md "Unpacking"): libarchive reads
// each layer (tar, tar+gzip, tar+zstd: detected from the bytes), and every filesystem change is
// made relative to the root's descriptor, each entry's parent resolved by the kernel with
// openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS): no string check alone decides where a write
// lands. Whiteouts (`.wh.NAME`) and opaque directories (`.wh..wh..opq`) are applied as the OCI
// image spec (layer.md) says; hard links, symlinks, devices, fifos, xattrs (security.capability
// included), ownership (numeric ids), modes and mtimes are kept.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "host/image/manifest.hpp"
#include "host/image/store.hpp"

namespace nes::image {

/// Counts of one unpack.
struct UnpackStats {
  std::uint64_t entries = 0;    // tar entries applied (whiteouts included)
  std::uint64_t bytes = 0;      // file content bytes written
  std::uint64_t whiteouts = 0;  // .wh. and opaque markers applied
};

/// Applies one layer read from `layer_fd` onto the directory `root_fd`. The compressed bytes read
/// are hashed and must be `layer.digest`, `layer.size` bytes (the store checked them at ingest;
/// this catches a store altered since). Errors name the layer and the entry: an entry whose name
/// is absolute or has a `..` component, whose parent (or hard-link target) leaves the root
/// through a symlink, a truncated or corrupt archive. `stats` gets the counts.
Status apply_layer(int root_fd, int layer_fd, const Descriptor& layer, UnpackStats& stats);

/// The image's root, flattened (every layer applied in order into one directory), cached in the
/// store as roots/CONFIGHEX/rootfs (Store::root_path): unpacked once into roots/.tmp-* and renamed
/// into place whole, so a failed or interrupted unpack leaves nothing, and two unpacks of one image
/// at once both end with the one root. Returns its path (at once when cached).
Result<std::filesystem::path> unpack_image(Store& store, const Manifest& manifest, UnpackStats* stats = nullptr);

/// The manifest named by ref `name` in `store`, for `platform` when the ref names an index.
/// Errors: "no such image: NAME" (err ENOENT), the documents' own errors.
Result<Manifest> resolve_manifest(const Store& store, std::string_view name, std::string_view platform = "linux/amd64",
                                  Descriptor* manifest_desc = nullptr);

}  // namespace nes::image
