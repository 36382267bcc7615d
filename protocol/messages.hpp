// The lifecycle channel's messages: one C++ value type per wire message of protocol version 2
// (docs/protocol.md, wire-compatible with the reference implementation's v2).
// Both ends (nesinit/ and host/) use only these types; nothing else defines the wire.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "protocol/frame.hpp"

namespace nes::proto {

/// The protocol version this build speaks (`ready.protocol_version`).
inline constexpr std::uint32_t kProtocolVersion = 2;
/// Default hard cap on one line, in bytes, excluding the '\n' (docs/protocol.md "Bounds").
inline constexpr std::size_t kDefaultLineCap = 1u << 20;
/// uid/gid value refused on the wire: to set*id(2) it means "unchanged".
inline constexpr std::uint32_t kInvalidId = 4294967295u;

// ---- guest -> host -----------------------------------------------------------------------------

/// Boot features an init announces in `ready.features` (docs/protocol.md "Features"): each names
/// a descriptor field (or request) an older init would ignore, so the host refuses to send it to
/// an init that does not list it instead of having it silently dropped.
inline constexpr const char* kFeatureStdio = "stdio";          // boot.stdio (the data channel)
inline constexpr const char* kFeatureRoot = "root";            // boot.root
inline constexpr const char* kFeatureReconnect = "reconnect";  // boot.reconnect_ms > 0
inline constexpr const char* kFeatureExec = "exec";            // exec, list_processes
inline constexpr const char* kFeatureNetwork = "network";      // boot.network
inline constexpr const char* kFeatureDataResume = "data_resume";  // boot.stdio.replay_bytes > 0
inline constexpr const char* kFeatureContainer = "container";      // exec.container, exec.in
inline constexpr const char* kFeatureContainerMounts = "container_mounts";  // exec.container.mounts non-empty
inline constexpr const char* kFeatureResources = "resources";      // exec.container.resources
inline constexpr const char* kFeatureContainerStats = "container_stats";    // container_resources
inline constexpr const char* kFeatureContainerUpdate = "container_update";  // container_resources.update
// The v2 additive fields of the reference's own list, named since 0.3 (issue 44): an init that
// predates them would run the workload with other groups, another hostname, the wrong clock or
// CRNG, or power off instead of rebooting, and say nothing.
inline constexpr const char* kFeatureGroups = "groups";      // exec.groups non-empty (boot and exec)
inline constexpr const char* kFeatureMountFs = "mount_fs";   // mounts[].fs other than virtiofs
inline constexpr const char* kFeatureHostname = "hostname";  // boot.hostname
inline constexpr const char* kFeatureHalt = "halt";          // boot.on_exit.halt
inline constexpr const char* kFeatureEntropy = "entropy";    // boot.entropy
inline constexpr const char* kFeatureRealtime = "realtime";  // boot.realtime_ns
inline constexpr const char* kFeatureRootBlock = "root_block";  // boot.root.fs erofs/ext4 (a block root)
/// Every feature this build's init implements, as it announces them.
inline std::vector<std::string> all_features() {
  return {kFeatureStdio,    kFeatureRoot,    kFeatureReconnect, kFeatureExec,     kFeatureNetwork,
          kFeatureDataResume, kFeatureContainer, kFeatureGroups, kFeatureMountFs, kFeatureHostname,
          kFeatureHalt,     kFeatureEntropy, kFeatureRealtime, kFeatureContainerMounts, kFeatureResources,
          kFeatureContainerStats, kFeatureContainerUpdate, kFeatureRootBlock};
}

/// Bounds of the channel-survival fields (docs/protocol.md "Channel survival").
inline constexpr std::uint32_t kReconnectMaxMs = 3600000;                 // ms (1 hour)
inline constexpr std::uint64_t kGenerationMax = 9007199254740991ull;      // 2^53-1: exact in JSON

/// What a guest that survived a channel loss tells the host in its `ready` (additive): the
/// identity the host gave it in `boot` (informational: the endpoint decides who the peer is),
/// whether the workload was started, and whether a final event awaits its ack (it is re-sent
/// right after this `ready`). Wire names: "vm", "generation", "started", "outcome_pending".
struct Resume {
  std::string vm;
  std::uint64_t generation = 0;  // 1..kGenerationMax
  bool started = false;
  bool outcome_pending = false;
  bool operator==(const Resume&) const = default;
};

/// First line from the guest, unprompted: `{"type":"ready","protocol_version":2}`. On a redialled
/// channel (boot.reconnect_ms > 0) it carries `resume` and no `boot` follows.
struct Ready {
  std::uint32_t protocol_version = kProtocolVersion;
  std::optional<Resume> resume;
  /// The boot features this init implements (additive; kFeature* below). Absent (an init that
  /// predates the field, e.g. the reference's): the v2 base only, none of them.
  std::optional<std::vector<std::string>> features;
  bool operator==(const Ready&) const = default;
};

/// All shares are mounted; the workload is about to start.
struct Mounted {
  bool operator==(const Mounted&) const = default;
};

/// A share failed to mount; nothing was started. `err` is the errno value (0 if none).
/// `tag` and `err` are unset only when decoded from a v2 revision that sends `reason` alone;
/// this init always sets both.
struct MountFailed {
  std::optional<std::string> tag;
  std::string reason;
  std::optional<std::int32_t> err;  // wire name: "errno"
  bool operator==(const MountFailed&) const = default;
};

/// The network (boot.network) could not be configured; nothing was started. `interface` names
/// the interface (its MAC, or "lo"/"files" for what is not one), `step` what failed
/// ("find", "mtu", "up", "address", "route", "resolv.conf", "hosts", "hostname"), `reason` the
/// error, `err` its errno value (0 if none). Wire name of `err`: "errno".
struct NetworkFailed {
  std::string interface;
  std::string step;
  std::string reason;
  std::int32_t err = 0;
  bool operator==(const NetworkFailed&) const = default;
};

/// The workload's exec succeeded (learned through a CLOEXEC pipe). `pid` >= 1, in the guest;
/// unset only when decoded from a v2 revision that sends `{"type":"started"}` alone.
struct Started {
  std::optional<std::int32_t> pid;
  bool operator==(const Started&) const = default;
};

/// Why a workload could not start. Statuses follow POSIX shells: not_found 127, else 126.
enum class StartFailClass { not_found, not_executable, other };

/// exec or its set-up failed; no `workload_exited` follows. `err` is the errno value (unset,
/// and `cls` other, when decoded from a v2 revision that sends `reason` alone).
struct StartFailed {
  std::string reason;
  std::optional<std::int32_t> err;  // wire name: "errno"
  StartFailClass cls = StartFailClass::other;  // wire name: "class"
  bool operator==(const StartFailed&) const = default;
};

/// The workload was reaped. Exactly one of `exit_code` (0..255) and `signal` (1..64) is set:
/// a kill must never look like a clean run.
struct WorkloadExited {
  std::optional<std::uint8_t> exit_code;
  std::optional<std::uint8_t> signal;
  static WorkloadExited code(std::uint8_t c) { return {c, std::nullopt}; }
  static WorkloadExited killed(std::uint8_t sig) { return {std::nullopt, sig}; }
  bool operator==(const WorkloadExited&) const = default;
};

/// A host line could not be acted on; the session goes on.
struct ProtocolError {
  std::string reason;
  bool operator==(const ProtocolError&) const = default;
};

/// One process of the guest, as `processes` lists it: `pid` and `ppid` in the guest's pid
/// namespace (1 is the init), `uid` its real uid, `cmd` its command line (argv joined by spaces,
/// at most kProcessCmdMax bytes, cut at a UTF-8 boundary; `[comm]` when it has none).
struct ProcessInfo {
  std::int32_t pid = 0;
  std::int32_t ppid = 0;
  std::uint32_t uid = 0;
  std::string cmd;
  bool operator==(const ProcessInfo&) const = default;
};
inline constexpr std::size_t kProcessCmdMax = 256;
/// Most processes one `processes` lists (the rest are counted by `truncated`), so the answer
/// stays far below the line cap: 512 x ~300 bytes.
inline constexpr std::size_t kProcessesMax = 512;

/// The guest's totals beside its process list, as top's summary area shows them: from the init's
/// /proc/meminfo and /proc/stat (all CPUs, since boot). Each 0..2^53-1 (JSON's exact integers).
/// Additive: an init that predates it sends none. What `neshost stats` and the shim's Stats report.
struct GuestTotals {
  std::uint64_t mem_total = 0;        // bytes: MemTotal
  std::uint64_t mem_available = 0;    // bytes: MemAvailable
  std::uint64_t cpu_user_usec = 0;    // µs: user + nice
  std::uint64_t cpu_system_usec = 0;  // µs: system + irq + softirq
  bool operator==(const GuestTotals&) const = default;
};

/// The answer to `list_processes`: the guest's user-space processes (kernel threads left out),
/// by pid, at most kProcessesMax; `truncated` = how many more there were; `totals` the guest's.
struct Processes {
  std::vector<ProcessInfo> processes;
  std::uint32_t truncated = 0;
  std::optional<GuestTotals> totals;
  bool operator==(const Processes&) const = default;
};

/// A process `exec` asked for is running (its exec succeeded). `proc` the host's number for it
/// (1..65535), `pid` its pid in the guest (>= 1).
struct ExecStarted {
  std::uint16_t proc = 0;
  std::int32_t pid = 0;
  bool operator==(const ExecStarted&) const = default;
};

/// The process `exec` asked for did not start; nothing of it runs and no `exec_exited` follows.
/// Fields as start_failed's (statuses: not_found 127, else 126).
struct ExecFailed {
  std::uint16_t proc = 0;
  std::string reason;
  std::optional<std::int32_t> err;  // wire name: "errno"
  StartFailClass cls = StartFailClass::other;  // wire name: "class"
  bool operator==(const ExecFailed&) const = default;
};

/// A process `exec` started was reaped: exactly one of `exit_code` (0..255) and `signal` (1..64),
/// as workload_exited. Sent once, after its output streams' eof frames (or its drain window).
struct ExecExited {
  std::uint16_t proc = 0;
  std::optional<std::uint8_t> exit_code;
  std::optional<std::uint8_t> signal;
  bool operator==(const ExecExited&) const = default;
};

/// The init's account of one output stream, once it is over for the init (additive;
/// docs/protocol.md "output_end"): process `proc`'s `stream` (stdout or stderr) had `sent`
/// payload bytes framed onto the data channel in all, and `unsent` more it gave up unframed
/// (thrown away after the channel closed, or still held or in the pipe when it gave the stream
/// up). Sent exactly once per output stream of each process with stdio: when its eof is framed
/// (`unsent` 0 unless the channel closed earlier), or when the init gives the stream up. The
/// receiver's loss, exact: `unsent` + `sent` - the bytes of that stream it received; 0 proves the
/// stream arrived whole. Counts are bytes, 0..2^53-1 (JSON's exact integers).
struct OutputEnd {
  std::uint16_t proc = 0;
  Stream stream = Stream::out;
  std::uint64_t sent = 0;
  std::uint64_t unsent = 0;
  bool operator==(const OutputEnd&) const = default;
};

/// One container's use of its cgroup (docs/protocol.md "Container resources"), as cgroup v2's
/// files say it: memory.current, memory.max (0 = "max"), memory.stat's anon and file,
/// memory.events' oom_kill; cpu.stat's usage_usec, user_usec, system_usec, nr_periods,
/// nr_throttled, throttled_usec; pids.current, pids.max (0 = "max"). Bytes, µs, counts; each
/// 0..2^53-1. What containerd's cgroups v2 Metrics carry (the shim's Stats).
struct CgroupStats {
  std::uint64_t memory_current = 0;
  std::uint64_t memory_max = 0;
  std::uint64_t memory_anon = 0;
  std::uint64_t memory_file = 0;
  std::uint64_t oom_kills = 0;
  std::uint64_t cpu_usage_usec = 0;
  std::uint64_t cpu_user_usec = 0;
  std::uint64_t cpu_system_usec = 0;
  std::uint64_t cpu_nr_periods = 0;
  std::uint64_t cpu_nr_throttled = 0;
  std::uint64_t cpu_throttled_usec = 0;
  std::uint64_t pids_current = 0;
  std::uint64_t pids_max = 0;
  bool operator==(const CgroupStats&) const = default;
};

/// `container_resources_reply`, the answer to `container_resources` (additive, features "container_stats" and
/// "container_update"): the container `exec` started as `proc`; `error` set: the update (or the
/// read) was refused or failed, its text naming the field (`memory_max: ...`), nothing changed
/// by a refused update; `stats` its cgroup's use after the update, when it could be read.
struct ContainerResourcesReply {
  std::uint16_t proc = 0;
  std::optional<std::string> error;
  std::optional<CgroupStats> stats;
  bool operator==(const ContainerResourcesReply&) const = default;
};

/// Any message the guest sends.
using GuestMessage = std::variant<Ready, Mounted, MountFailed, Started, StartFailed, WorkloadExited,
                                  ProtocolError, Processes, ExecStarted, ExecFailed, ExecExited,
                                  OutputEnd, NetworkFailed, ContainerResourcesReply>;

// ---- host -> guest -----------------------------------------------------------------------------

/// What to run. `argv` non-empty (never a shell string); `env` exactly the workload's environment
/// (see docs/protocol.md for the NESINIT_* geometry variables); `cwd` nullopt = "/".
struct Exec {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;
  std::optional<std::string> cwd;
  std::uint32_t uid = 0;
  std::uint32_t gid = 0;
  std::vector<std::uint32_t> groups;  // supplementary groups; setgroups(2) is always called
  bool operator==(const Exec&) const = default;
};

/// Share file system. virtiofs (default), 9p, tmpfs (tag is only a name), bind (tag is a guest path);
/// erofs and ext4 only for `boot.root` (a block root: tag is the disk's virtio-blk serial).
enum class FsType { virtiofs, ninep, tmpfs, bind, erofs, ext4 };

/// One share to mount, always nosuid,nodev. `at` is an absolute guest path.
struct Mount {
  std::string tag;
  std::string at;
  bool ro = false;
  FsType fs = FsType::virtiofs;
  bool operator==(const Mount&) const = default;
};

/// Longest virtio-blk serial, in bytes (VIRTIO_BLK_ID_BYTES): a block root's `tag` and `upper`.
inline constexpr std::size_t kBlockSerialMax = 20;
/// Largest `root.upper_mib` (1 TiB): a tmpfs cap, never a reservation.
inline constexpr std::uint32_t kUpperMibMax = 1u << 20;

/// A share as the root file system instead of the initramfs: the init mounts it and switches
/// root into it (its /dev, /proc, /sys, /run moved there, a fresh tmpfs on /tmp) before `mounts`,
/// whose `at` paths are then inside it. virtiofs or 9p: `tag` is the share's tag. Absent: the
/// initramfs stays the root.
/// A block root (fs erofs or ext4; feature root_block; docs/protocol.md "Block roots"): `tag` is
/// the virtio-blk serial (1..20 of [A-Za-z0-9._-]) of a read-only disk holding that file system,
/// mounted read-only as the lower layer of an overlay whose upper is a tmpfs capped at
/// `upper_mib` MiB (0: tmpfs's default, half of RAM) or, with `upper`, the ext4 file system of the
/// writable disk of that serial (a persistent layer; `upper_mib` must then be 0). `ro`: the
/// overlay is sealed read-only before the workload (--read-only).
struct Root {
  std::string tag;
  bool ro = false;
  FsType fs = FsType::virtiofs;
  std::uint32_t upper_mib = 0;       // wire name "upper_mib"; 0 = omitted
  std::optional<std::string> upper;  // wire name "upper": a scratch disk's serial
  bool operator==(const Root&) const = default;
};

/// Whether `fs` is a block root's file system (erofs, ext4).
inline bool is_block_fs(FsType fs) { return fs == FsType::erofs || fs == FsType::ext4; }

/// The output the workload should produce; the init hands it over uninterpreted.
struct Geometry {
  std::uint32_t width = 0;
  std::uint32_t height = 0;
  std::uint32_t fps = 0;
  bool hdr = false;
  bool operator==(const Geometry&) const = default;
};

/// The final act of an ordered shutdown.
enum class Halt { poweroff, reboot };

/// What the workload's exit means. `terminal`: does it end the session (not a restart policy).
/// `halt` overrides the init's configured final act for this session.
struct OnExit {
  bool terminal = true;
  std::optional<Halt> halt;
  bool operator==(const OnExit&) const = default;
};

/// How the init treats the workload's output when the host reads slower than it is written.
/// lossless: the init stops reading the pipe (the workload blocks); lossy: oldest unsent bytes
/// are dropped and counted (a `dropped` frame on the data channel, docs/protocol.md).
enum class StdioMode { lossless, lossy };

/// A pseudo-terminal for the workload, in character cells, each 1..65535 (struct winsize).
struct Terminal {
  std::uint16_t rows = 24;
  std::uint16_t cols = 80;
  bool operator==(const Terminal&) const = default;
};

/// Bounds of `boot.stdio` (docs/protocol.md "Data channel").
inline constexpr std::uint32_t kStdioBufferMin = 4096;             // bytes
inline constexpr std::uint32_t kStdioBufferMax = 64u << 20;        // bytes (64 MiB)
inline constexpr std::uint32_t kStdioBufferDefault = 1u << 20;     // bytes (1 MiB)
inline constexpr std::uint32_t kStdioDrainMaxMs = 60000;           // ms
inline constexpr std::uint32_t kStdioDrainDefaultMs = 500;         // ms
/// `boot.stdio.replay_bytes` (data channel resume, docs/protocol.md "Data channel resume"): 0
/// (off, the default) or kStdioBufferMin..kStdioBufferMax bytes per output stream.
inline constexpr std::uint32_t kReplayMax = kStdioBufferMax;

/// The workload's stdin/stdout/stderr go over the data channel (binary frames, protocol/frame.hpp)
/// instead of the console. Absent from the descriptor: the workload inherits the console.
/// Wire names: "stdin", "terminal", "mode", "buffer_bytes", "drain_ms", "replay_bytes".
struct Stdio {
  bool attach_stdin = false;             // true: host sends stdin frames; false: /dev/null
  std::optional<Terminal> terminal;      // set: a PTY (stdout and stderr are both the PTY)
  StdioMode mode = StdioMode::lossless;
  std::uint32_t buffer_bytes = kStdioBufferDefault;  // per output stream, kStdioBufferMin..Max
  std::uint32_t drain_ms = kStdioDrainDefaultMs;     // wait for output EOF after the reap, 0..Max
  /// Data channel resume (additive): bytes per output stream the init keeps after framing them
  /// until the host acknowledges them, so a redialled data channel resumes exactly where the host
  /// stands. 0: off (a lost data channel ends the output, as before). Only with reconnect_ms > 0.
  std::uint32_t replay_bytes = 0;
  bool operator==(const Stdio&) const = default;
};

/// An IPv4 or IPv6 address in network byte order: `family` 4 (bytes[0..4)) or 6 (all 16).
/// On the wire, inet_pton(3)'s text ("10.0.2.15", "fd00::2").
struct IpAddr {
  std::uint8_t family = 4;
  std::array<std::uint8_t, 16> bytes{};
  bool operator==(const IpAddr&) const = default;
};

/// An address with its prefix length (0..32 for IPv4, 0..128 for IPv6). Wire: CIDR text,
/// "10.0.2.15/24", "fd00::2/64".
struct IpPrefix {
  IpAddr addr;
  std::uint8_t len = 0;
  bool operator==(const IpPrefix&) const = default;
};

/// An Ethernet MAC address. Wire: "52:54:00:12:34:56" (hex, either case).
using MacAddr = std::array<std::uint8_t, 6>;

/// Bounds of `boot.network` (docs/protocol.md "Network").
inline constexpr std::size_t kNetMaxInterfaces = 8;
inline constexpr std::size_t kNetMaxAddresses = 16;   // per interface
inline constexpr std::size_t kNetMaxRoutes = 64;
inline constexpr std::size_t kNetMaxHosts = 256;      // extra /etc/hosts entries
inline constexpr std::size_t kNetMaxNameservers = 3;  // resolv.conf(5)'s MAXNS
inline constexpr std::size_t kNetMaxSearch = 6;       // resolv.conf(5)'s search domains
inline constexpr std::size_t kNetMaxOptions = 16;     // resolv.conf(5) options
inline constexpr std::uint32_t kNetMtuMin = 68;       // RFC 791's minimum
inline constexpr std::uint32_t kNetMtuMax = 65535;

/// One interface to configure, found by its MAC (the VMM set it; names are the guest kernel's).
/// Brought up with `mtu` (0: the driver's default) and `addresses` added. Wire names: "mac",
/// "mtu", "addresses".
struct NetInterface {
  MacAddr mac{};
  std::uint32_t mtu = 0;
  std::vector<IpPrefix> addresses;
  bool operator==(const NetInterface&) const = default;
};

/// A route: `to` (0.0.0.0/0 or ::/0 is the default route) via `via` (a gateway; unset: on-link)
/// out of the interface with `mac` (unset: the first interface). Wire names: "to", "via", "mac".
struct NetRoute {
  IpPrefix to;
  std::optional<IpAddr> via;
  std::optional<MacAddr> mac;
  bool operator==(const NetRoute&) const = default;
};

/// One extra /etc/hosts line, as docker's --add-host: `ip` and its `name`.
struct HostEntry {
  std::string name;
  IpAddr ip;
  bool operator==(const HostEntry&) const = default;
};

/// The workload's resolver (resolv.conf(5)): "nameservers", "search", "options".
struct Dns {
  std::vector<IpAddr> nameservers;
  std::vector<std::string> search;
  std::vector<std::string> options;
  bool operator==(const Dns&) const = default;
};

/// The guest's network (additive, feature "network"): the init configures it over rtnetlink
/// before the workload starts, and gives the workload /etc/resolv.conf, /etc/hosts and
/// /etc/hostname (bound over its root's files, as docker does). Absent: loopback only.
struct Network {
  std::vector<NetInterface> interfaces;
  std::vector<NetRoute> routes;
  std::optional<Dns> dns;            // unset: /etc/resolv.conf is left as the root has it
  std::vector<HostEntry> hosts;
  bool operator==(const Network&) const = default;
};

/// `boot.entropy`: bytes from the host's getrandom(2) the init mixes into the guest kernel's pool
/// (credited) before anything else; wire: 64 lowercase hex digits.
inline constexpr std::size_t kEntropyBytes = 32;
using Entropy = std::array<std::uint8_t, kEntropyBytes>;

/// The boot descriptor: exactly one per connection, host -> guest.
struct Boot {
  Exec exec;
  std::vector<Mount> mounts;
  std::optional<Root> root;  // additive: absent means the initramfs is the root
  Geometry geometry;
  OnExit on_exit;
  std::optional<std::string> hostname;
  std::optional<Stdio> stdio;  // additive; unset or null: the workload inherits the console
  /// Channel survival (additive): after `boot`, a lost channel is redialled for up to this long
  /// (ms, 0..kReconnectMaxMs) without touching the workload; 0: a loss shuts down, as before.
  std::uint32_t reconnect_ms = 0;
  /// The host's names for this session, echoed in a resumed `ready` (additive; informational).
  std::optional<std::string> vm;
  std::optional<std::uint64_t> generation;  // 1..kGenerationMax
  std::optional<Network> network;           // additive (feature "network")
  /// Warm starts (additive): every VM restored from one snapshot has the same CRNG state and the
  /// clock of the moment it was saved. `entropy`: seeds the guest's CRNG (credited, reseeded at
  /// once); `realtime_ns`: the host's CLOCK_REALTIME when it sent `boot`, ns since the epoch
  /// (0..2^63-1), set as the guest's clock when that is more than 1 s off.
  std::optional<Entropy> entropy;
  std::optional<std::uint64_t> realtime_ns;
  bool operator==(const Boot&) const = default;
};

/// SIGTERM to the workload's process group (idempotent: at most one SIGTERM ever).
struct Stop {
  bool operator==(const Stop&) const = default;
};

/// End the session: ordered shutdown. After `workload_exited` it is also the host's ack.
struct Shutdown {
  bool operator==(const Shutdown&) const = default;
};

/// Send `signal` (1..64) to the workload's process group, or (`proc` set, additive) to the
/// process group of the process `exec` started with that number.
struct Kill {
  std::uint8_t signal = 0;
  std::optional<std::uint16_t> proc;  // 1..65535
  bool operator==(const Kill&) const = default;
};

/// Longest `exec.container.root`, in bytes (PATH_MAX less room for the paths the init builds
/// under it: "/dev/pts", "/etc/resolv.conf").
inline constexpr std::size_t kContainerRootMax = 4000;

/// Bounds of `exec.container.resources` (cgroup v2's own: kernel/sched/core.c, Documentation/
/// admin-guide/cgroup-v2.rst). cpu.max's period and quota in µs, cpu.weight's range.
inline constexpr std::uint64_t kCpuPeriodMin = 1000;       // µs
inline constexpr std::uint64_t kCpuPeriodMax = 1000000;    // µs (1 s)
inline constexpr std::uint64_t kCpuQuotaMin = 1000;        // µs
inline constexpr std::uint32_t kCpuWeightMax = 10000;
inline constexpr std::uint64_t kResourceMax = 9007199254740991ull;  // 2^53-1: exact in JSON

/// A container's limits in the guest (additive, feature "resources"; docs/protocol.md
/// "Container resources"): the init gives each container a cgroup v2 of its own and writes these
/// into it, as runc writes an OCI spec's `linux.resources` on cgroup v2. Each field unset: that
/// file is left as the kernel made it (no limit). `memory_max` bytes (memory.max; 0 = "max", no
/// limit); `cpu_quota` µs per `cpu_period` µs (cpu.max; quota 0 = "max"; period
/// kCpuPeriodMin..kCpuPeriodMax, default 100000); `cpu_weight` 1..10000 (cpu.weight; runc's
/// conversion from shares is the host's); `pids_max` (pids.max; 0 = "max"). Wire names as the
/// fields'. Each value 0..2^53-1.
struct ContainerResources {
  std::optional<std::uint64_t> memory_max;
  std::optional<std::uint64_t> cpu_quota;
  std::optional<std::uint64_t> cpu_period;
  std::optional<std::uint32_t> cpu_weight;
  std::optional<std::uint64_t> pids_max;
  bool operator==(const ContainerResources&) const = default;
};

/// A container inside the VM (additive, feature "container"; docs/protocol.md "Containers"):
/// the process `exec` starts gets its own root, mount, pid (it is PID 1 there) and, with
/// `hostname`, UTS namespace, as runc gives a container; the VM's network. `root` an absolute
/// guest path of a directory (the container's rootfs, e.g. under the pod's share), 2..4000 bytes,
/// not "/"; `hostname` as boot.hostname's rules (1..253 of letters, digits, '-', '.', '_'; unset:
/// the VM's UTS namespace is shared); `readonly` its root read-only (after its mounts are made);
/// `mounts` (ContainerMount). Wire names: "root", "hostname", "readonly", "mounts", "resources"
/// (additive, feature "resources": its cgroup's limits).
/// Most `exec.container.mounts` one container takes (a kubelet's pod spec has a handful).
inline constexpr std::size_t kContainerMountsMax = 64;

/// One mount of a container (additive, `exec.container.mounts[]`; docs/protocol.md
/// "Containers"), made in its mount namespace after runc's defaults, in order, as runc makes the
/// spec's `mounts`: `fs` `bind` binds the guest path `src` (a directory or a file, e.g. a volume
/// the shim carried into the pod's share) on root + `dst` (its parents made as directories, the
/// target made as `src` is: a directory or an empty file), recursively; `tmpfs` mounts a fresh
/// tmpfs there with `data` (tmpfs options: `size=`, `mode=`, `nr_inodes=`, `uid=`, `gid=`, at
/// most 256 bytes). `ro`, `nosuid`, `nodev`, `noexec` the mount's flags; `propagation` one of
/// `private` (default), `rprivate`, `slave`, `rslave`, `shared`, `rshared`, applied to the mount
/// after it is made. `dst` absolute, no `.`/`..` component, 2..4000 bytes; `src` (bind) absolute,
/// 1..4000 bytes. Wire names: "dst", "src", "fs", "ro", "nosuid", "nodev", "noexec", "data",
/// "propagation".
struct ContainerMount {
  std::string dst;
  std::string src;
  FsType fs = FsType::bind;  // bind or tmpfs
  bool ro = false, nosuid = false, nodev = false, noexec = false;
  std::string data;
  std::string propagation;  // empty: private
  bool operator==(const ContainerMount&) const = default;
};

struct Container {
  std::string root;
  std::optional<std::string> hostname;
  bool readonly = false;
  /// Its mounts beyond runc's defaults (additive: absent or empty, none), at most
  /// kContainerMountsMax.
  std::vector<ContainerMount> mounts;
  std::optional<ContainerResources> resources;
  bool operator==(const Container&) const = default;
};

/// Start another process in the running guest, beside the workload (`ctr task exec`,
/// `kubectl exec`, `neshost exec`): `exec` as the workload's (argv, env, cwd, uid/gid/groups),
/// in its own session and process group; `stdio` its own streams on the data channel, framed
/// with process number `proc` (unset: /dev/null for all three). `proc` 1..65535, chosen by the
/// host, never reused in one session. Answered by exec_started or exec_failed; its end by
/// exec_exited. Its exit never ends the session.
/// Additive (feature "container"): `container` set: the process is a container's PID 1 (see
/// Container); `in` set (1..65535): the process joins the running container `exec` started as
/// process `in` (its root, mount, pid and UTS namespaces), as `runc exec`. At most one of the two.
struct ExecProcess {
  std::uint16_t proc = 0;
  Exec exec;
  std::optional<Stdio> stdio;
  std::optional<Container> container;
  std::optional<std::uint16_t> in;
  bool operator==(const ExecProcess&) const = default;
};

/// Ask for the guest's processes (`ctr task ps`, `neshost top`): answered by one `processes`.
/// An init that predates it skips it as an unknown type, so the host bounds its wait.
struct ListProcesses {
  bool operator==(const ListProcesses&) const = default;
};

/// A running container's cgroup (additive; docs/protocol.md "Container resources"): the
/// container `exec` started as `proc` (1..65535); `update` set (feature "container_update"):
/// its set fields are written first (a memory_max below what the container uses is refused);
/// then its use is read (feature "container_stats"). Answered by one container_resources_reply.
struct ContainerResourcesRequest {
  std::uint16_t proc = 0;
  std::optional<ContainerResources> update;
  bool operator==(const ContainerResourcesRequest&) const = default;
};

/// Any message the host sends.
using HostMessage = std::variant<Boot, Stop, Shutdown, Kill, ListProcesses, ExecProcess, ContainerResourcesRequest>;

}  // namespace nes::proto
