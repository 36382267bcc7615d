// Configuration of the init (kernel command line `nesinit.*` keys, then argv `--` flags, which
// win), the channel address, and the mode decision (guest / sandbox / not PID 1).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/result.hpp"
#include "log.hpp"
#include "protocol/channels.hpp"
#include "protocol/messages.hpp"
#include "protocol/status.hpp"

namespace nes::init {

/// `vsock:CID:PORT`: dial out to the host over AF_VSOCK (guest mode only).
struct VsockAddr {
  std::uint32_t cid = 2;
  std::uint32_t port = proto::kLifecycleVsockPort;
  bool operator==(const VsockAddr&) const = default;
};
/// `virtio-port:NAME`: a virtio-serial port found by name in /sys/class/virtio-ports/*/name.
struct VirtioPortAddr {
  std::string name;
  bool operator==(const VirtioPortAddr&) const = default;
};
/// `unix:PATH`: a Unix stream socket the host listens on (tests, namespace sandboxes).
struct UnixAddr {
  std::string path;
  bool operator==(const UnixAddr&) const = default;
};
using Channel = std::variant<VsockAddr, VirtioPortAddr, UnixAddr>;

/// The production default (docs/protocol.md "Transport"): the host is CID 2, port 7000
/// (proto::kLifecycleVsockPort).
inline constexpr VsockAddr kDefaultVsock{2, proto::kLifecycleVsockPort};

/// Parse `vsock:CID:PORT` (u32 decimal each), `virtio-port:NAME` (1..64 bytes, no '/'), or
/// `unix:PATH` (1..107 bytes: sun_path is 108 bytes with its NUL; docs/facts.md). An error names
/// the field (`channel: ...`) and what was expected.
base::Result<Channel> parse_channel(std::string_view s);
/// The canonical spelling of a channel (inverse of parse_channel).
std::string to_string(const Channel& c);

/// Everything the init can be configured with. Times in milliseconds.
struct Config {
  std::optional<Channel> channel;          // required in sandbox mode; guest default kDefaultVsock
  std::optional<Channel> data_channel;     // the workload's stdio (boot.stdio); see data_channel_for
  std::uint32_t grace_ms = 10000;          // SIGTERM -> SIGKILL, for the workload and for the rest
  std::uint32_t ack_timeout_ms = 3000;     // outcome sent -> power off without the host's ack
  std::uint32_t boot_timeout_ms = 30000;   // ready sent -> no boot -> ordered shutdown
  std::uint32_t connect_timeout_ms = 10000;  // dialling the channel, all retries together
  proto::Halt halt = proto::Halt::poweroff;  // final act; the descriptor's on_exit.halt wins
  LogLevel log = LogLevel::info;
  /// A sandbox's attestation that its network namespace is its own (`unshare --net`), so it may
  /// configure boot.network there; a guest's is always its own. Key `own_netns` (1/0).
  bool own_netns = false;
  /// `modules=NAME,...`: load only these modules and what they depend on (their groups,
  /// /etc/nesinit/modules.d/NAME, written by nesinit-mkinitrd), e.g. no vsock when the channel is
  /// a virtio port; unset: the whole list (/etc/nesinit/modules). Names: 1..64 of [A-Za-z0-9_-],
  /// at most kMaxModules.
  std::optional<std::vector<std::string>> modules;
  static constexpr std::size_t kMaxModules = 32;
  bool operator==(const Config&) const = default;
};

/// Set one key (`channel`, `data_channel` (alias `data`, as in `nesinit.data=`), `grace_ms`, `ack_timeout_ms`, `boot_timeout_ms`, `connect_timeout_ms`,
/// `halt`, `log`, `own_netns`, `modules` (comma-separated); '-' and '_' are the same). An error names the key and what was expected; then
/// `c` is unchanged. Times: decimal u32 milliseconds.
base::Status apply_key(Config& c, std::string_view key, std::string_view value);

/// Split a kernel command line into words the way the kernel does: whitespace separates, double
/// quotes group (and are removed).
std::vector<std::string> split_cmdline(std::string_view cmdline);

/// Apply every `nesinit.KEY=VALUE` word of a kernel command line. Other words are not ours and are
/// skipped silently; a bad `nesinit.*` key or value is appended to `notes` and skipped (never
/// fatal: PID 1 exiting panics the kernel).
void apply_cmdline(Config& c, std::string_view cmdline, std::vector<std::string>& notes);

/// What argv asks for.
enum class Command { run, help, version, self_check };

/// What argv said: the command, and every problem found (unknown flags, bare words, bad values),
/// each a sentence naming the argument. Not a Result: argv is parsed to the end and the problems
/// are collected, since as a guest's PID 1 they are warnings (the kernel hands PID 1 words that
/// are not ours) and elsewhere all of them are printed at once.
struct ParsedArgv {
  Command command = Command::run;
  std::vector<std::string> problems;
};

/// Apply argv flags (`--channel=…`, `--grace-ms=…`, also `--key value`); `args` excludes argv[0].
/// `--help`/`-h`, `--version`, `--self-check` select the command.
ParsedArgv apply_argv(Config& c, const std::vector<std::string_view>& args);

/// The three modes. guest: PID 1 of the initial pid namespace (a real VM); sandbox: PID 1
/// of another pid namespace; not_pid1: anything else.
enum class Mode { guest, sandbox, not_pid1 };
std::string_view to_string(Mode m);

/// The data channel's address when none is configured (docs/protocol.md "Data channel"): in guest
/// mode `vsock:CID:7001` beside a vsock channel and `virtio-port:nes.1` beside `virtio-port:nes.0`
/// (protocol/channels.hpp); otherwise (sandbox mode, other names) none: a stdio descriptor then
/// fails to start.
std::optional<Channel> default_data_channel(const Channel& control, Mode m);

/// The initial pid namespace's inode number (PROC_PID_INIT_INO in include/linux/proc_ns.h).
inline constexpr std::uint64_t kInitialPidNsInode = 4026531836u;
/// The initial UTS namespace's inode number (PROC_UTS_INIT_INO): sethostname there would rename
/// the machine, so a sandbox refuses it.
inline constexpr std::uint64_t kInitialUtsNsInode = 4026531838u;

/// guest iff pid == 1 and the pid namespace inode is the initial one; sandbox iff pid == 1 and the
/// inode is known and another one; not_pid1 otherwise. An unknown inode with pid 1 is `sandbox`
/// (the safe side: never reboot or sync a machine by mistake).
Mode decide_mode(pid_t pid, std::optional<std::uint64_t> pidns_inode);

/// Inode of /proc/self/ns/<which> ("pid", "uts"), or nullopt if /proc is not readable.
std::optional<std::uint64_t> ns_inode(const char* which);

/// Final checks for a mode: sandbox needs an explicit non-vsock channel; guest defaults to
/// kDefaultVsock. An error names the field (`channel: ...`).
base::Status finalize_for_mode(Config& c, Mode m);

/// Usage text for --help and errors.
std::string_view usage();

}  // namespace nes::init
