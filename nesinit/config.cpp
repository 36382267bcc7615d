#include "config.hpp"

#include <sys/stat.h>

#include <charconv>

#include "protocol/limits.hpp"

namespace nes::init {

namespace {

std::optional<std::uint32_t> parse_u32(std::string_view s) {
  if (s.empty() || s.size() > 10) return std::nullopt;
  std::uint64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return std::nullopt;
    v = v * 10 + static_cast<unsigned>(ch - '0');
  }
  if (v > 0xffffffffu) return std::nullopt;
  return static_cast<std::uint32_t>(v);
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string normalise_key(std::string_view k) {
  std::string out(k);
  for (char& ch : out)
    if (ch == '-') ch = '_';
  return out;
}

}  // namespace

base::Result<Channel> parse_channel(std::string_view s) {
  if (starts_with(s, "vsock:")) {
    std::string_view rest = s.substr(6);
    auto colon = rest.find(':');
    if (colon == std::string_view::npos)
      return base::Error{fmt::format("channel: expected vsock:CID:PORT, got '{}'", s)};
    auto cid = parse_u32(rest.substr(0, colon));
    auto port = parse_u32(rest.substr(colon + 1));
    if (!cid) return base::Error{fmt::format("channel: vsock CID is not a u32 in '{}'", s)};
    if (!port) return base::Error{fmt::format("channel: vsock port is not a u32 in '{}'", s)};
    return Channel{VsockAddr{*cid, *port}};
  }
  if (starts_with(s, "virtio-port:")) {
    std::string_view name = s.substr(12);
    if (name.empty() || name.size() > 64 || name.find('/') != std::string_view::npos ||
        name.find('\0') != std::string_view::npos)
      return base::Error{fmt::format("channel: virtio-port NAME must be 1..64 bytes without '/', got '{}'", name)};
    return Channel{VirtioPortAddr{std::string(name)}};
  }
  if (starts_with(s, "unix:")) {
    std::string_view path = s.substr(5);
    if (path.empty() || path.size() > proto::kUnixPathMax || path.find('\0') != std::string_view::npos)
      return base::Error{fmt::format("channel: unix PATH must be 1..{} bytes (sun_path), got {} bytes",
                                     proto::kUnixPathMax, path.size())};
    return Channel{UnixAddr{std::string(path)}};
  }
  return base::Error{fmt::format("channel: expected vsock:CID:PORT, virtio-port:NAME or "
                                 "unix:PATH, got '{}'", s)};
}

std::string to_string(const Channel& c) {
  if (auto* v = std::get_if<VsockAddr>(&c)) return fmt::format("vsock:{}:{}", v->cid, v->port);
  if (auto* p = std::get_if<VirtioPortAddr>(&c)) return "virtio-port:" + p->name;
  return "unix:" + std::get<UnixAddr>(c).path;
}

base::Status apply_key(Config& c, std::string_view key_in, std::string_view value) {
  const std::string key = normalise_key(key_in);
  auto ms = [&](std::uint32_t& field) -> base::Status {
    auto v = parse_u32(value);
    if (!v) return base::Error{fmt::format("{}: expected milliseconds as a u32, got '{}'", key, value)};
    field = *v;
    return base::Ok{};
  };
  if (key == "channel") {
    auto p = parse_channel(value);
    if (!p) return p.error();
    c.channel = *p;
    return base::Ok{};
  }
  if (key == "data_channel" || key == "data") {
    auto p = parse_channel(value);
    if (!p) return base::Error{"data_" + p.error().message};
    c.data_channel = *p;
    return base::Ok{};
  }
  if (key == "grace_ms") return ms(c.grace_ms);
  if (key == "ack_timeout_ms") return ms(c.ack_timeout_ms);
  if (key == "boot_timeout_ms") return ms(c.boot_timeout_ms);
  if (key == "connect_timeout_ms") return ms(c.connect_timeout_ms);
  if (key == "own_netns") {
    if (value == "1" || value == "yes" || value == "true") c.own_netns = true;
    else if (value == "0" || value == "no" || value == "false") c.own_netns = false;
    else return base::Error{fmt::format("own_netns: expected 1 or 0, got '{}'", value)};
    return base::Ok{};
  }
  if (key == "halt") {
    if (value == "poweroff") c.halt = proto::Halt::poweroff;
    else if (value == "reboot") c.halt = proto::Halt::reboot;
    else return base::Error{fmt::format("halt: expected poweroff or reboot, got '{}'", value)};
    return base::Ok{};
  }
  if (key == "modules") {
    std::vector<std::string> names;
    for (std::size_t at = 0; at <= value.size();) {  // every piece, the empty ones too
      auto comma = value.find(',', at);
      if (comma == std::string_view::npos) comma = value.size();
      std::string_view n = value.substr(at, comma - at);
      at = comma + 1;
      bool ok = !n.empty() && n.size() <= 64;
      for (char ch : n)
        ok = ok && ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-');
      if (!ok) return base::Error{fmt::format("modules: '{}' is not a module name (1..64 of A-Z a-z 0-9 _ -)", n)};
      if (names.size() == Config::kMaxModules)
        return base::Error{fmt::format("modules: more than {} names", Config::kMaxModules)};
      names.emplace_back(n);
    }
    c.modules = std::move(names);
    return base::Ok{};
  }
  if (key == "log") {
    if (value == "quiet") c.log = LogLevel::quiet;
    else if (value == "info") c.log = LogLevel::info;
    else if (value == "debug") c.log = LogLevel::debug;
    else return base::Error{fmt::format("log: expected quiet, info or debug, got '{}'", value)};
    return base::Ok{};
  }
  return base::Error{fmt::format("unknown key '{}'", key_in)};
}

std::vector<std::string> split_cmdline(std::string_view s) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false, quoted = false;
  for (char ch : s) {
    if (ch == '"') {
      quoted = !quoted;
      in_word = true;
      continue;
    }
    if (!quoted && (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\0')) {
      if (in_word) words.push_back(std::move(cur));
      cur.clear();
      in_word = false;
      continue;
    }
    cur += ch;
    in_word = true;
  }
  if (in_word) words.push_back(std::move(cur));
  return words;
}

void apply_cmdline(Config& c, std::string_view cmdline, std::vector<std::string>& notes) {
  for (const std::string& w : split_cmdline(cmdline)) {
    std::string_view word = w;
    if (!starts_with(word, "nesinit.")) continue;
    word.remove_prefix(8);
    auto eq = word.find('=');
    if (eq == std::string_view::npos) {
      notes.push_back(fmt::format("kernel command line: 'nesinit.{}' has no value; ignored", word));
      continue;
    }
    if (auto r = apply_key(c, word.substr(0, eq), word.substr(eq + 1)); !r)
      notes.push_back("kernel command line: " + r.error().message + "; ignored");
  }
}

ParsedArgv apply_argv(Config& c, const std::vector<std::string_view>& args) {
  ParsedArgv r;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (a == "--help" || a == "-h") { r.command = Command::help; continue; }
    if (a == "--version" || a == "-V") { r.command = Command::version; continue; }
    if (a == "--self-check") { r.command = Command::self_check; continue; }
    if (!starts_with(a, "--")) {
      r.problems.push_back(fmt::format("argument '{}': not a flag; ignored", a));
      continue;
    }
    std::string_view body = a.substr(2);
    std::string_view key, value;
    auto eq = body.find('=');
    if (eq != std::string_view::npos) {
      key = body.substr(0, eq);
      value = body.substr(eq + 1);
    } else {
      key = body;
      if (i + 1 >= args.size()) {
        r.problems.push_back(fmt::format("flag '{}': missing value", a));
        continue;
      }
      value = args[++i];
    }
    if (auto k = apply_key(c, key, value); !k) r.problems.push_back(fmt::format("flag '{}': {}", a, k.error().message));
  }
  return r;
}

std::string_view to_string(Mode m) {
  switch (m) {
    case Mode::guest: return "guest";
    case Mode::sandbox: return "sandbox";
    case Mode::not_pid1: return "not-pid-1";
  }
  return "not-pid-1";
}

Mode decide_mode(pid_t pid, std::optional<std::uint64_t> pidns_inode) {
  if (pid != 1) return Mode::not_pid1;
  if (pidns_inode && *pidns_inode == kInitialPidNsInode) return Mode::guest;
  return Mode::sandbox;
}

std::optional<std::uint64_t> ns_inode(const char* which) {
  char path[64];
  auto res = fmt::format_to_n(path, sizeof path - 1, "/proc/self/ns/{}", which);
  *res.out = '\0';
  struct stat st {};
  if (::stat(path, &st) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(st.st_ino);
}

base::Status finalize_for_mode(Config& c, Mode m) {
  if (m == Mode::guest) {
    if (!c.channel) c.channel = kDefaultVsock;
    if (!c.data_channel) c.data_channel = default_data_channel(*c.channel, m);
    return base::Ok{};
  }
  if (!c.channel) return base::Error{"channel: required outside a real guest (e.g. --channel=unix:PATH)"};
  if (std::holds_alternative<VsockAddr>(*c.channel))
    return base::Error{"channel: vsock is dialled only by a real guest (PID 1 of the initial pid namespace)"};
  if (c.data_channel && std::holds_alternative<VsockAddr>(*c.data_channel))
    return base::Error{"data_channel: vsock is dialled only by a real guest (PID 1 of the initial pid namespace)"};
  return base::Ok{};
}

std::optional<Channel> default_data_channel(const Channel& control, Mode m) {
  if (m != Mode::guest) return std::nullopt;
  if (auto* v = std::get_if<VsockAddr>(&control)) return Channel{VsockAddr{v->cid, proto::kDataVsockPort}};
  if (auto* p = std::get_if<VirtioPortAddr>(&control); p && p->name == proto::kLifecyclePortName)
    return Channel{VirtioPortAddr{proto::kDataPortName}};
  return std::nullopt;
}

std::string_view usage() {
  return "usage: nesinit [--channel=vsock:CID:PORT|virtio-port:NAME|unix:PATH] [--grace-ms=MS]\n"
         "               [--data-channel=ADDR (the workload's stdio; same forms)]\n"
         "               [--ack-timeout-ms=MS] [--boot-timeout-ms=MS] [--connect-timeout-ms=MS]\n"
         "               [--halt=poweroff|reboot] [--log=quiet|info|debug]\n"
         "       nesinit --help | --version | --self-check\n"
         "Defaults: grace 10000 ms, ack timeout 3000 ms, boot timeout 30000 ms, connect timeout\n"
         "10000 ms, halt poweroff, log info; channel vsock:2:7000 in a real guest only; data channel\n"
         "vsock:CID:7001 beside vsock, virtio-port:nes.1 beside virtio-port:nes.0, in a real guest only.\n"
         "PID 1 for microVMs: runs one workload described by the host over the lifecycle channel.\n"
         "As PID 1 of a real VM, kernel command line keys nesinit.KEY=VALUE apply first (flags win);\n"
         "as PID 1 of a pid namespace (sandbox), --channel is required and may not be vsock.\n"
         "Not as PID 1, only --help, --version and --self-check run; anything else exits 2.\n";
}

}  // namespace nes::init
