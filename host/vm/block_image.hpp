// A root file system image file (EROFS or ext4) a VM boots from as a read-only virtio-blk disk
// (docs/vm.md "Block devices"): which file system it holds, read from its superblock.
#pragma once

#include <filesystem>

#include "host/lib/base.hpp"
#include "protocol/messages.hpp"

namespace nes::vm {

/// The file system of the image file at `path`, from its superblock's magic at byte 1024:
/// EROFS_SUPER_MAGIC_V1 0xE0F5E1E2 (le32 at 1024) or EXT4's 0xEF53 (le16 at 1024+0x38):
/// proto::FsType::erofs or ::ext4. Errors name the path: open(2)'s errno (missing, unreadable),
/// not a regular file, too short, or neither file system.
host::Result<proto::FsType> probe_block_fs(const std::filesystem::path& path);

}  // namespace nes::vm
