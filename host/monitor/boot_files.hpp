// What must exist before a monitor starts its VMM: the initramfs (built from --rootfs DIR
// --rootfs-mode initramfs, or checked), the staging files file volumes are bound onto, and the
// VMM's command line (docs/vm.md "`neshost run`").
#pragma once

#include <string>
#include <vector>

#include "host/cli/plan.hpp"
#include "host/lib/base.hpp"

namespace nes::monitor {

/// The boot's files: the initramfs built from --rootfs (scripts/mkinitrd.sh, bounded 120 s, its
/// output on stderr) or checked to exist, and the empty files file volumes are bound onto in the
/// staging share. Errors name the flag ("--rootfs: ...", "initramfs '...' not found (...)").
host::Status prepare_boot_files(const cli::RunPlan& plan);

/// The command to start: QEMU's (its spec checked here: vm::qemu_argv) or --sandbox's; said on
/// stderr with --console.
host::Result<std::vector<std::string>> launch_argv(const cli::RunPlan& plan);

}  // namespace nes::monitor
