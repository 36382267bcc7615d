// The writable layer over an image's block root (docs/images.md "The writable layer", issue 47):
// `--storage-opt` (docker's and podman's flag: `--storage-opt size=10G` caps a container's
// writable layer) parsed, and the per-VM persistent layer, a sparse ext4 file made on the host
// with mke2fs, attached as the guest's overlay upper (the descriptor's `root.upper`).
//
// By default the upper is a tmpfs in the guest (capped by `size=`, empty at every boot and every
// restore). `--storage-opt persistent=true` asks for docker's container layer instead: a disk
// file in the VM's state directory, kept with the VM's state across its runs, removed with it
// (`neshost rm`, `--rm`); `size=` is then the disk's size.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string_view>

#include "host/image/digest.hpp"

namespace nes::image {

/// The writable layer's size bounds (bytes): below the floor an ext4 with its journal does not fit
/// (mke2fs's own minimum is larger for a journal); the ceiling is ext4's with 4 KiB blocks.
inline constexpr std::uint64_t kMinUpperBytes = 16ull << 20;
inline constexpr std::uint64_t kMaxUpperBytes = 16ull << 40;
/// The persistent layer's size when `size=` is not given: sparse, so it costs what is written.
inline constexpr std::uint64_t kDefaultUpperDiskBytes = 10ull << 30;

/// What the `--storage-opt` flags asked for.
struct StorageOpts {
  std::optional<std::uint64_t> size;  // size=N: bytes (the upper's cap)
  bool persistent = false;            // persistent=true: a disk in the VM's state dir, not a tmpfs
  bool operator==(const StorageOpts&) const = default;
};

/// Applies one `--storage-opt KEY=VALUE` to `opts` (repeatable; a later key wins, as docker's map).
/// Keys: `size` (docker's units.RAMInBytes: a number with an optional b, k, m, g, t, p suffix, any
/// case, an optional trailing "b"/"ib", binary multiples: 10G = 10 GiB; within kMinUpperBytes ..
/// kMaxUpperBytes), `persistent` (true/false/1/0). Errors name the option and the key: "--storage-opt
/// 'size=10Q': size: not a size (a number with an optional k, m, g, t suffix)", "unknown key 'x'
/// (size, persistent)".
Status apply_storage_opt(std::string_view opt, StorageOpts& opts);

/// Makes the persistent writable layer at `path`, a sparse file of `bytes` holding an empty ext4
/// (mke2fs -t ext4 -E root_owner=0:0; a journal: the guest writes it and a VM may be killed),
/// into a temp beside it renamed into place, so a half-made disk is never taken for one. A file
/// already at `path` is the VM's layer from an earlier run and is kept as it is (Ok, false);
/// made now: Ok, true. Errors name the path or mke2fs (with its last words), bytes out of bounds.
Result<bool> ensure_upper_disk(const std::filesystem::path& path, std::uint64_t bytes);

}  // namespace nes::image
