// `stdin.spool`: how a `-i` workload's stdin from a FIFO (containerd's stdin) survives a
// SIGKILLed monitor without a byte lost. The monitor never read(2)s the FIFO: it splice(2)s it
// into this file, so the bytes leave the FIFO and land in the file in one system call (the kernel
// consumes from the pipe exactly what it wrote: a monitor killed at any instant leaves every byte
// it took from the FIFO in the file, whose size is the count). It then sends the file's bytes to
// the guest. A replacement sends again what lies between the guest's stdin position and the
// file's end, then goes on splicing the FIFO. The file stays small: holes are punched
// (fallocate(2) FALLOC_FL_PUNCH_HOLE) behind the newest kKeep bytes, which is far more than the
// guest can hold unacknowledged (proto::kStdinWindow) plus what the host queues
// (HostConfig::stdin_cap) plus one chunk (docs/host.md "Re-adoption").
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "host/lib/base.hpp"

namespace nes::host {

/// The spool's file name in a VM's state directory.
inline constexpr char kStdinSpoolFile[] = "stdin.spool";

/// One VM's stdin spool: the file, its size (bytes taken from the FIFO in all) and the first byte
/// still held. Move-only (owns the fd).
class StdinSpool {
 public:
  /// Bytes kept behind the file's end; holes are punched below, in kPunchStep steps.
  static constexpr std::uint64_t kKeep = 4u << 20;
  static constexpr std::uint64_t kPunchStep = 1u << 20;

  /// Opens `<state_dir>/<vm>/stdin.spool`: `fresh` creates or truncates it (the monitor that
  /// starts the VM) and checks its filesystem can punch holes (EOPNOTSUPP: the file could not be
  /// bounded: an error); else it must exist and is taken as it is (a replacement). Errors name
  /// the file.
  static Result<StdinSpool> open(const std::filesystem::path& state_dir, std::string_view vm, bool fresh);

  /// Bytes taken from the FIFO in all, by every monitor of this generation: the file's size.
  std::uint64_t size() const { return size_; }
  /// The first byte still held: what lies below was punched out (0 until the file passes kKeep).
  std::uint64_t held_from() const { return held_from_; }

  /// What one take() did: `bytes` moved from the FIFO to the file's end; `eof` the FIFO has no
  /// writer left; neither: nothing to take now (EAGAIN; wait for the FIFO to be readable).
  /// `warning`: set once if punching failed (the bytes are kept; the file grows from then on).
  struct Take {
    std::size_t bytes = 0;
    bool eof = false;
    std::string warning;
  };
  /// Moves at most `max` bytes from `fifo` (a pipe or FIFO, read without blocking) to the end of
  /// the file (splice(2)), then punches what fell behind kKeep. Errors (EIO, ENOSPC on the file,
  /// not a pipe: nothing was taken) name the file.
  Result<Take> take(int fifo, std::size_t max);
  /// Reads up to `n` bytes at `offset` (held_from() <= offset < size()) into `buf`; returns the
  /// count. Errors name the file.
  Result<std::size_t> read_at(std::uint64_t offset, char* buf, std::size_t n) const;

 private:
  Fd fd_;
  std::uint64_t size_ = 0, held_from_ = 0;
  bool punch_failed_ = false;
  std::filesystem::path path_;
};

}  // namespace nes::host
