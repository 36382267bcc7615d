// The `neshost` CLI's seams: a subcommand table filled at static-initialisation time (each
// host/cli/*.cpp command file registers its own), the flag parser (host/cli/flags.hpp), and serve_vm(), the
// one-VM loop that `serve` (and a VMM runner such as `run`) builds on. Usage errors exit 125 (as
// docker's own flag errors) and name the flag.
#pragma once

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "host/cli/flags.hpp"
#include "host/lib/endpoint.hpp"
#include "host/lib/host.hpp"
#include "host/lib/base.hpp"
#include "host/lib/session.hpp"
#include "protocol/messages.hpp"

namespace nes::cli {

/// Exit status for a usage error (an unknown flag, a bad value, flags that exclude each other, what
/// the flags ask of this host), the same for every command and given before anything starts: 125,
/// docker's status for its own flag errors (docker/cli's FlagErrorFunc; `docker run`'s bad values).
inline constexpr int kExitUsage = 125;

/// One subcommand: `neshost NAME ...`. `main` returns the process exit status.
struct Subcommand {
  std::string_view name;
  std::string_view summary;  // one line for `neshost --help`
  int (*main)(const Args& args);
};

/// Adds a subcommand; use from a namespace-scope object in the subcommand's own .cpp:
///   static const nes::cli::Registrar reg{{"run", "boot a QEMU microVM and serve it", run_main}};
/// The file must be a source of the `neshost` executable (host/meson.build `neshost_sources`).
struct Registrar {
  explicit Registrar(Subcommand s);
};
/// All registered subcommands, sorted by name.
std::vector<Subcommand> subcommands();

/// Print "neshost CMD: MESSAGE" and a hint to stderr; returns kExitUsage.
int usage_error(std::string_view cmd, std::string_view message);

/// A private directory for one run's sockets and generated initramfs (`neshost run`, `neshost
/// snapshot create`), removed on every path that unwinds. Under $TMPDIR (default /tmp), not the
/// state dir: the socket path must fit sun_path. `path` is empty if mkdtemp failed (errno says
/// why); clearing it keeps the directory.
struct RuntimeDir {
  std::filesystem::path path;
  RuntimeDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t == '/' ? t : "/tmp") + "/neshost-XXXXXX";
    if (::mkdtemp(tmpl.data())) path = tmpl;
  }
  /// An existing one, made by the monitor a replacement takes over from (vmm.json's runtime_dir).
  explicit RuntimeDir(std::filesystem::path existing) : path(std::move(existing)) {}
  ~RuntimeDir() { remove_now(); }
  /// Removes it (idempotent).
  void remove_now() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  RuntimeDir(const RuntimeDir&) = delete;
  RuntimeDir& operator=(const RuntimeDir&) = delete;
};

/// Where snapshot NAME lives (neshost snapshot, run --snapshot): STATE/.snapshots/NAME (a VM id
/// never starts with '.', so no VM's directory is in the way).
std::filesystem::path snapshot_path(const std::filesystem::path& state_dir, std::string_view name);

/// Read a boot descriptor from a JSON file: a `boot` message (docs/protocol.md), with or without its
/// `"type":"boot"` key. At most 1 MiB. Errors name the file and the field.
host::Result<proto::Boot> load_descriptor(const std::filesystem::path& file);

/// Everything serve_vm() needs for one VM.
struct ServeConfig {
  host::SessionConfig session;
  host::ListenSpec listen;
  std::filesystem::path state_dir;
  std::optional<std::uint32_t> cid;  // vsock: the guest's CID (required for vsock:PORT)
};

/// How the program embedding serve_vm() manages the VMM. Defaults (as `neshost serve`): there is
/// no VMM process; the VM counts as started once listening and as exited once its channel is gone
/// after the outcome, and destroy only logs.
struct ServeEmbedder {
  /// Called once the endpoint is up (on the io_context thread). Start the VMM here and call
  /// host.vm_started(vm); later call host.vm_exited(vm) when it exits. Default: vm_started now.
  std::function<void(host::Host& host, const std::string& vm)> on_listening;
  /// Embedder hooks (destroy: kill the VMM; remove: delete its resources).
  host::Hooks hooks;
  /// true (serve): no VMM, so the guest's channel closing (or never opening) after the outcome
  /// means the VM is gone. A real VMM runner sets false and reports vm_exited itself.
  bool channel_is_vm = true;
  /// Each event is also passed here (after it is printed).
  std::function<void(host::Host& host, const host::Event& ev)> on_event;
  /// Run on this io_context instead of a private one (a VMM runner posts QEMU's exit to it).
  boost::asio::io_context* io = nullptr;
  /// Print one line per event on stdout (serve). `run` keeps stdout for the workload's output.
  bool print_events = true;
  /// Workload stdio (descriptors with `stdio`): callbacks and the built-in log (HostOptions).
  host::StdioHooks stdio;
  host::WorkloadLogOptions workload_log;
  /// Called before a SIGINT/SIGTERM's ordered shutdown (run: a paused VM is resumed first, so
  /// its guest can shut down in order).
  std::function<void()> before_shutdown;
  /// Called with the Host once it exists (before listening), e.g. to keep a pointer for hooks.
  std::function<void(host::Host& host)> on_host;
};

/// Serve one VM until its session finishes; prints one line per event to stdout; SIGINT/SIGTERM
/// ask the guest to shut down (after the outcome, while output is owed: cut it, Host::shutdown;
/// a further one gives up). Returns the outcome's exit status (the protocol/status.hpp table),
/// 125 when its output was lost (host::reported_status) or there is no durable outcome.
int serve_vm(const ServeConfig& cfg, ServeEmbedder embedder = {});

/// Before a command reads or reaches VM `vm`: if it is orphaned (its monitor gone, no outcome, its
/// VMM alive: host::VmState::orphaned()), a replacement monitor is started and awaited
/// (host/monitor/adopt.hpp ensure_monitor, at most 15 s), and one line on stderr says so
/// ("neshost CMD: VM web: its monitor was gone; adopted by a new monitor (pid 123)"). Errors are
/// said the same way and otherwise ignored: the command then reports the VM as it finds it.
void adopt_orphan(std::string_view cmd, const std::filesystem::path& state, std::string_view vm);

/// `neshost run`'s default state directory: $NESHOST_STATE, else /var/lib/neshost as root, else
/// $XDG_STATE_HOME/neshost, else ~/.local/state/neshost.
std::filesystem::path default_state_dir();

}  // namespace nes::cli
