// The boot's files and the VMM's command line (host/monitor/boot_files.hpp).
#include "host/monitor/boot_files.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "host/monitor/say.hpp"
#include "host/vm/process.hpp"
#include "host/vm/qemu_argv.hpp"

namespace nes::monitor {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cli::RunPlan;
using cli::ServeConfig;
using cli::put_bounded;

namespace {

/// Runs scripts/mkinitrd.sh for --rootfs DIR --rootfs-mode initramfs: `rootfs` into plan.initrd,
/// with plan.nesinit as /init and the modules matching plan.kernel; its output goes to stderr.
/// Bounded (120 s).
host::Status build_initrd(const RunPlan& plan, const fs::path& rootfs) {
  const fs::path& kernel = plan.kernel;
  std::vector<std::string> argv{plan.mkinitrd.string(), "--rootfs", rootfs.string(), "--init",
                                plan.nesinit.string(), "-o", plan.initrd.string()};
  // Modules must match the kernel: Debian layout <root>/boot/vmlinuz-REL and <root>/lib/modules/REL
  // (or boot/vmlinux-REL, the decompressed kernel scripts/fetch-kernel.sh writes beside it).
  std::error_code ec;
  fs::path k = fs::canonical(kernel, ec);
  if (!ec) {
    std::string name = k.filename().string();
    if (name.starts_with("vmlinuz-") || name.starts_with("vmlinux-")) {
      fs::path mods = k.parent_path().parent_path() / "lib/modules" / name.substr(8);
      if (fs::is_directory(mods, ec)) argv.insert(argv.end(), {"--modules-dir", mods.string()});
    }
  }
  auto err = [](std::string_view b) { put_bounded(2, b, 1s); };
  vm::LaunchOptions lo;
  lo.argv = argv;
  lo.console = err;
  lo.diagnostics = err;
  auto p = vm::VmProcess::launch(std::move(lo));
  if (!p) return host::Error{"--rootfs: " + p.error().message};
  auto e = (*p)->wait_for(120s);
  if (!e) e = (*p)->terminate(1s);
  (*p)->finish_output(2s);
  if (e->code != 0) return host::Error{fmt::format("--rootfs: {} {}", argv[0], vm::describe(*e))};
  return host::Ok{};
}

}  // namespace

host::Status prepare_boot_files(const RunPlan& plan) {
  std::error_code ec;
  if (plan.initrd_from) {
    if (auto s = build_initrd(plan, *plan.initrd_from); !s) return s;
  } else if (!plan.sandbox && !fs::is_regular_file(plan.initrd, ec)) {
    return host::Error{fmt::format(
        "initramfs '{}' not found (scripts/mkinitrd.sh builds one, or pass --initrd/--rootfs)", plan.initrd.string())};
  }
  for (const auto& d : plan.daemons)
    for (const auto& b : d.binds) {
      host::Fd f{::open(b.target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
      if (!f) return host::Error{fmt::format("--volume {}: staging {}: {}", b.source.string(), b.target.string(),
                                             std::strerror(errno))};
    }
  return host::Ok{};
}

host::Result<std::vector<std::string>> launch_argv(const RunPlan& plan) {
  host::Result<std::vector<std::string>> argv = plan.qemu ? vm::qemu_argv(*plan.qemu) : plan.sandbox_argv;
  if (argv && plan.console) {
    std::string line = "neshost:";
    for (const auto& a : *argv) line += " " + a;
    say("{}\n", line);
  }
  return argv;
}

}  // namespace nes::monitor
