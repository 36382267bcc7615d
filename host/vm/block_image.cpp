#include "host/vm/block_image.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include <fmt/format.h>

namespace nes::vm {

host::Result<proto::FsType> probe_block_fs(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return host::errno_error(errno, path.string());
  struct stat st {};
  unsigned char sb[1024 + 0x3a] = {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  const ssize_t n = regular ? ::pread(fd, sb, sizeof sb, 0) : 0;
  const int e = errno;
  ::close(fd);
  if (!regular) return host::Error{fmt::format("{}: not a regular file", path.string()), EINVAL};
  if (n < 0) return host::errno_error(e, path.string());
  if (static_cast<std::size_t>(n) < sizeof sb)
    return host::Error{fmt::format("{}: {} bytes, too short for a file system image", path.string(), n), EINVAL};
  const std::uint32_t erofs = sb[1024] | sb[1025] << 8 | sb[1026] << 16 | static_cast<std::uint32_t>(sb[1027]) << 24;
  const std::uint32_t ext = sb[1024 + 0x38] | sb[1024 + 0x39] << 8;
  if (erofs == 0xE0F5E1E2u) return proto::FsType::erofs;
  if (ext == 0xEF53u) return proto::FsType::ext4;
  return host::Error{fmt::format("{}: neither an EROFS nor an ext4 image (no superblock magic at byte 1024)",
                                 path.string()), EINVAL};
}

}  // namespace nes::vm
