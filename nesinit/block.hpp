// Finding a virtio-blk disk by its serial: how a block root's disks are named on the wire
// (docs/protocol.md "Block roots"), since /dev/vdX follows the PCI probe order, not the host's list.
#pragma once

#include <string>
#include <string_view>

#include "base/result.hpp"

namespace nes::init {

/// How long find_block_device waits for a disk to appear, ms: virtio-blk probes before PID 1
/// runs, so this only covers a slow probe (a loaded host under TCG).
inline constexpr int kBlockWaitMs = 5000;

/// The device node ("/dev/NAME", devtmpfs's) of the block device whose `sys_block`/NAME/serial
/// reads `serial` (virtio-blk's, at most 20 bytes; a trailing newline ignored), polling
/// `sys_block` every few ms until it appears or `wait_ms` have been slept. Errors: ENODEV when no
/// disk has that serial by then. `sys_block` is /sys/block but in tests.
base::Result<std::string> find_block_device(std::string_view serial, int wait_ms = kBlockWaitMs,
                                            const char* sys_block = "/sys/block");

}  // namespace nes::init
