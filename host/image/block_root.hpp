// An image's root as one read-only filesystem image file (docs/images.md "Block roots", issue
// 47): the store's flattened root (roots/CONFIGHEX/rootfs, host/image/unpack.hpp) packed once per
// image config into roots/CONFIGHEX/root.erofs (Debian's `mkfs.erofs`, erofs-utils) or
// roots/CONFIGHEX/root.ext4 (`mke2fs -d`), attached to a VM as a read-only virtio-blk disk and
// shared by every VM of the image.
//
// Beside the file, roots/CONFIGHEX/root.erofs.json (or root.ext4.json) records its SHA-256 and the
// file's identity when it was hashed (st_dev, st_ino, st_size, st_mtim, st_ctim): a run whose file
// still has that identity does not hash it again; a run whose file differs in any of them hashes
// it, and refuses it when the digest differs ("changed on disk"). Ownership (numeric), modes
// (setuid included), xattrs (security.capability), hard links, devices, fifos, symlinks and
// mtimes of the flattened root are kept in the image (tests/image/block_root_test.cpp).
//
// Concurrency: a build takes roots/CONFIGHEX/root.lock (flock, exclusive; a second run of the
// same image waits, then finds the file built) and the store's shared hold (Store::hold(): GC is
// refused while it builds). The file is made as roots/CONFIGHEX/.tmp-root.* and renamed into place
// whole, so an interrupted build leaves no half image under the final name; GC (`rmi`, `image
// prune`) removes it with the image's unpacked root (the whole roots/CONFIGHEX directory).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "host/image/store.hpp"

namespace nes::image {

/// The filesystem of a block root: EROFS (read-only by design, compact metadata; the default) or
/// ext4 (mounted read-only). The guest mounts it by this name (the descriptor's `root.fs`).
enum class BlockFs { erofs, ext4 };

/// "erofs" / "ext4": the descriptor's `root.fs` value and the file's extension.
std::string_view block_fs_name(BlockFs fs);

/// One image's block root, verified.
struct BlockRoot {
  std::filesystem::path path;  // STATE/.images/roots/CONFIGHEX/root.erofs (or .ext4)
  std::string digest;          // "sha256:HEX" of the whole file
  std::uint64_t size = 0;      // the file's size in bytes (a multiple of 4096)
  BlockFs fs = BlockFs::erofs;
};

/// The block root of the image whose config digest is `config_digest` ("sha256:HEX" or the 64 hex
/// digits alone), in filesystem `fs`: built from the store's unpacked root (unpack_image() must
/// have run: "image sha256:…: not unpacked" otherwise) the first time, then reused. A cached file
/// is verified as verify_block_root() does (not rehashed when its identity is unchanged); a cached
/// file that changed on disk is refused, never rebuilt over (remove it, or `neshost rmi` the image,
/// to build it again). A file without its record (a crash between rename and record) is rebuilt.
/// Errors name the file or the tool: mkfs.erofs / mke2fs missing ("install erofs-utils") or
/// failing (with the last lines of its stderr), a full disk, the store busy with GC.
Result<BlockRoot> ensure_block_root(const Store& store, std::string_view config_digest, BlockFs fs = BlockFs::erofs);

/// Checks `root` against its record (see the file comment) just before a boot: the file's identity
/// unchanged is Ok at once; changed, the file is hashed again and must still be root.digest (the
/// record is then updated to the new identity, e.g. after a copy of the store or a `touch`).
/// Errors name the file: "block root PATH: changed on disk (sha256:… expected, sha256:… found)",
/// missing or unreadable (with errno), no record.
Status verify_block_root(const BlockRoot& root);

}  // namespace nes::image
