// Shared by the protocol tests: sample messages with edge values, a tiny JSON tree for building
// (and breaking) wire lines independently of the codec under test, and result helpers.
#pragma once

#include <arpa/inet.h>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "protocol/protocol.hpp"

namespace nes::proto::test {

// ---- results ----------------------------------------------------------------------------------

/// The DecodeError reason, or "" when the line did not fail.
template <class Decoded>
std::string error_of(const Decoded& d) {
  if (auto* e = std::get_if<DecodeError>(&d)) return e->reason;
  return "";
}

/// "ok", "unknown:<type>" or "error:<reason>", for readable CHECK failures.
template <class Decoded>
std::string summary(const Decoded& d) {
  if (auto* e = std::get_if<DecodeError>(&d)) return "error:" + e->reason;
  if (auto* u = std::get_if<UnknownMessage>(&d)) return "unknown:" + u->type;
  return "ok";
}

inline bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// ---- samples ----------------------------------------------------------------------------------

inline constexpr std::uint32_t kU32Max = std::numeric_limits<std::uint32_t>::max();
inline constexpr std::int32_t kI32Max = std::numeric_limits<std::int32_t>::max();

/// The reference's boot descriptor (docs/protocol.md), as a value.
inline Boot reference_boot() {
  Boot b;
  b.exec.argv = {"/bin/sh", "-c", "echo hi"};
  b.exec.env = {{"PATH", "/usr/bin:/bin"}};
  b.exec.uid = 0;
  b.exec.gid = 0;
  b.mounts = {Mount{"work", "/work", false, FsType::virtiofs}};
  b.geometry = Geometry{1920, 1080, 60, false};
  b.on_exit = OnExit{true, std::nullopt};
  return b;
}

/// docs/protocol.md's boot example, verbatim but on one line (it is displayed wrapped there).
inline constexpr std::string_view kReferenceBootLine =
    R"({"type":"boot",)"
    R"("exec":{"argv":["/bin/sh","-c","echo hi"],"env":{"PATH":"/usr/bin:/bin"},"cwd":null,"uid":0,"gid":0},)"
    R"("mounts":[{"tag":"work","at":"/work","ro":false}],)"
    R"("geometry":{"width":1920,"height":1080,"fps":60,"hdr":false},)"
    R"("on_exit":{"terminal":true}})";

/// A boot with every additive field set and limits at their edges.
inline Boot full_boot() {
  Boot b;
  b.exec.argv = {"/usr/bin/env", "", "with space", "quote\"back\\slash", "\xC3\xA9\xE6\x97\xA5\xF0\x9F\x98\x80"};
  b.exec.env = {{"PATH", "/bin"}, {"EMPTY", ""}, {"UNI\xC3\x89", "\xF4\x8F\xBF\xBF"}};
  b.exec.cwd = "/tmp/work dir";
  b.exec.uid = kU32Max - 1;
  b.exec.gid = 0;
  b.exec.groups = {0, 1, kU32Max - 1, kU32Max};
  b.mounts = {Mount{"work", "/work", true, FsType::virtiofs}, Mount{"nine", "/n", false, FsType::ninep},
              Mount{"scratch", "/tmp", false, FsType::tmpfs}, Mount{"/srv", "/mnt/srv", true, FsType::bind}};
  b.geometry = Geometry{kU32Max, 0, 1, true};
  b.on_exit = OnExit{false, Halt::reboot};
  b.hostname = "guest-1";
  b.stdio = Stdio{true, Terminal{1, 65535}, StdioMode::lossy, kStdioBufferMax, kStdioDrainMaxMs};
  b.root = Root{"root", true, FsType::ninep};
  return b;
}

/// `text` as an address (the test's own literals: always valid).
inline IpAddr ip(const char* text) {
  IpAddr a;
  if (inet_pton(AF_INET, text, a.bytes.data()) == 1) return a.family = 4, a;
  inet_pton(AF_INET6, text, a.bytes.data());
  return a.family = 6, a;
}

/// A boot.network with every field set, IPv4 and IPv6, edge values (MTU bounds, /0 and /128).
inline Network sample_network() {
  Network n;
  n.interfaces.push_back(NetInterface{{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}, 1500,
                                      {IpPrefix{ip("10.0.2.15"), 24}, IpPrefix{ip("fd00::15"), 64}}});
  n.interfaces.push_back(NetInterface{{0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}, kNetMtuMax, {IpPrefix{ip("::1"), 128}}});
  n.interfaces.push_back(NetInterface{{0, 0, 0, 0, 0, 1}, kNetMtuMin, {}});
  n.routes.push_back(NetRoute{IpPrefix{ip("0.0.0.0"), 0}, ip("10.0.2.2"), std::nullopt});
  n.routes.push_back(NetRoute{IpPrefix{ip("::"), 0}, ip("fd00::2"), MacAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}});
  n.routes.push_back(NetRoute{IpPrefix{ip("192.168.7.0"), 24}, std::nullopt, MacAddr{0, 0, 0, 0, 0, 1}});
  n.dns = Dns{{ip("10.0.2.3"), ip("2001:4860:4860::8888")}, {"example.com", "corp_x.internal"}, {"ndots:2", "edns0"}};
  n.hosts.push_back(HostEntry{"host.docker.internal", ip("10.0.2.2")});
  n.hosts.push_back(HostEntry{"v6-peer", ip("fe80::1")});
  return n;
}

/// Every host->guest message, including edge values.
inline std::vector<HostMessage> host_samples() {
  std::vector<HostMessage> v;
  v.emplace_back(reference_boot());
  v.emplace_back(full_boot());
  Boot minimal;
  minimal.exec.argv = {"x"};
  v.emplace_back(minimal);
  Boot halt = reference_boot();
  halt.on_exit.halt = Halt::poweroff;
  halt.exec.cwd = "/";
  v.emplace_back(halt);
  Boot pipes = reference_boot();
  pipes.stdio = Stdio{};  // every field at its default: still written out in full
  v.emplace_back(pipes);
  Boot tty = reference_boot();
  tty.stdio = Stdio{false, Terminal{65535, 1}, StdioMode::lossless, kStdioBufferMin, 0};
  v.emplace_back(tty);
  v.emplace_back(Stop{});
  v.emplace_back(Shutdown{});
  v.emplace_back(Kill{1});
  v.emplace_back(Kill{9});
  v.emplace_back(Kill{64});
  v.emplace_back(ListProcesses{});
  v.emplace_back(ContainerResourcesRequest{3, std::nullopt});
  v.emplace_back(ContainerResourcesRequest{65535, ContainerResources{0, 1000, 1000000, 10000, 9007199254740991ull}});
  v.emplace_back(Kill{9, 1});
  v.emplace_back(Kill{64, 65535});
  Boot net = reference_boot();
  net.network = sample_network();
  v.emplace_back(net);
  Boot warm = full_boot();  // a warm start's fields, at their edges
  warm.entropy.emplace();
  for (std::size_t i = 0; i < kEntropyBytes; ++i) (*warm.entropy)[i] = static_cast<std::uint8_t>(i * 37 + 5);
  warm.realtime_ns = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  v.emplace_back(warm);
  Boot net_empty = reference_boot();
  net_empty.network = Network{};  // loopback only, but said: the files are still written
  v.emplace_back(net_empty);
  ExecProcess ex;
  ex.proc = 1;
  ex.exec = full_boot().exec;
  v.emplace_back(ex);
  ex.proc = 65535;
  ex.stdio = Stdio{true, Terminal{24, 80}, StdioMode::lossy, kStdioBufferMax, kStdioDrainMaxMs};
  v.emplace_back(ex);
  return v;
}

/// Every guest->host message, including edge values.
inline std::vector<GuestMessage> guest_samples() {
  std::vector<GuestMessage> v;
  v.emplace_back(Ready{});
  v.emplace_back(Ready{0});
  v.emplace_back(Ready{kU32Max});
  v.emplace_back(Mounted{});
  v.emplace_back(MountFailed{"work", "mount(2): No such device", 19});
  v.emplace_back(MountFailed{"", "", 0});
  v.emplace_back(MountFailed{"t", "r", kI32Max});
  v.emplace_back(Started{1});
  v.emplace_back(Started{kI32Max});
  v.emplace_back(StartFailed{"execve(2): No such file or directory", 2, StartFailClass::not_found});
  v.emplace_back(StartFailed{"Permission denied", 13, StartFailClass::not_executable});
  v.emplace_back(StartFailed{"setgroups(2) failed", 1, StartFailClass::other});
  v.emplace_back(WorkloadExited::code(0));
  v.emplace_back(WorkloadExited::code(3));
  v.emplace_back(WorkloadExited::code(255));
  v.emplace_back(WorkloadExited::killed(1));
  v.emplace_back(WorkloadExited::killed(9));
  v.emplace_back(WorkloadExited::killed(64));
  v.emplace_back(ProtocolError{"boot.exec.uid: expected unsigned 32-bit integer, got -1"});
  v.emplace_back(Processes{});
  v.emplace_back(Processes{{{1, 0, 0, "/sbin/init"}, {kI32Max, kI32Max, kU32Max, "sh -c 'x \"y\"' \xc3\xa9"}}, 0});
  v.emplace_back(Processes{{{7, 1, 1000, "[kworker]"}}, kU32Max});
  v.emplace_back(Processes{{{1, 0, 0, "/init"}}, 0, GuestTotals{268435456, 0, 120000, 9007199254740991ull}});
  v.emplace_back(ExecStarted{1, 1});
  v.emplace_back(ExecStarted{65535, kI32Max});
  v.emplace_back(ExecFailed{2, "exec sh: No such file or directory", 2, StartFailClass::not_found});
  v.emplace_back(ExecFailed{3, "", std::nullopt, StartFailClass::other});
  v.emplace_back(ExecExited{1, 0, std::nullopt});
  v.emplace_back(ExecExited{65535, std::nullopt, 64});
  v.emplace_back(OutputEnd{0, Stream::out, 0, 1});
  v.emplace_back(OutputEnd{65535, Stream::err, kGenerationMax, kGenerationMax});
  v.emplace_back(Ready{kProtocolVersion, std::nullopt, all_features()});
  v.emplace_back(Ready{kProtocolVersion, std::nullopt, std::vector<std::string>{}});
  v.emplace_back(NetworkFailed{"52:54:00:12:34:56", "find", "no link with MAC 52:54:00:12:34:56 within 5000 ms", 19});
  v.emplace_back(NetworkFailed{"", "", "", 0});
  v.emplace_back(ContainerResourcesReply{1, std::nullopt, CgroupStats{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}});
  v.emplace_back(ContainerResourcesReply{65535, "memory_max: refused", std::nullopt});
  return v;
}

// ---- a tiny JSON tree (independent of the codec under test) ---------------------------------

/// A JSON value for building test lines. Numbers are kept as raw tokens so out-of-range and
/// malformed numbers can be written. Objects keep key order and allow duplicate keys.
struct J {
  struct Null {};
  struct Num { std::string raw; };
  struct Str { std::string s; };
  struct Raw { std::string text; };  // spliced verbatim (for malformed lines)
  using Arr = std::vector<J>;
  using Obj = std::vector<std::pair<std::string, J>>;
  std::variant<Null, bool, Num, Str, Raw, Arr, Obj> v;

  static J null() { return J{Null{}}; }
  static J b(bool x) { return J{x}; }
  static J n(std::string raw) { return J{Num{std::move(raw)}}; }
  static J n(long long x) { return J{Num{std::to_string(x)}}; }
  static J s(std::string x) { return J{Str{std::move(x)}}; }
  static J raw(std::string text) { return J{Raw{std::move(text)}}; }
  static J arr(Arr a) { return J{std::move(a)}; }
  static J obj(Obj o) { return J{std::move(o)}; }

  /// One segment of a location: an object key or an array index.
  struct Seg {
    std::string key;
    std::size_t index = 0;
    bool is_index = false;
    Seg(const char* k) : key(k) {}
    Seg(std::string k) : key(std::move(k)) {}
    Seg(std::size_t i) : index(i), is_index(true) {}
    Seg(int i) : index(static_cast<std::size_t>(i)), is_index(true) {}
  };
  using Loc = std::vector<Seg>;

  /// The value at loc (nullptr if absent).
  J* at(const Loc& loc) {
    J* cur = this;
    for (const Seg& s : loc) {
      if (s.is_index) {
        auto* a = std::get_if<Arr>(&cur->v);
        if (!a || s.index >= a->size()) return nullptr;
        cur = &(*a)[s.index];
      } else {
        auto* o = std::get_if<Obj>(&cur->v);
        if (!o) return nullptr;
        J* found = nullptr;
        for (auto& [k, x] : *o)
          if (k == s.key) { found = &x; break; }
        if (!found) return nullptr;
        cur = found;
      }
    }
    return cur;
  }

  /// Removes the object member at loc (the last segment must be a key). Returns false if absent.
  bool remove(const Loc& loc) {
    Loc parent(loc.begin(), loc.end() - 1);
    J* p = at(parent);
    if (!p) return false;
    auto* o = std::get_if<Obj>(&p->v);
    if (!o) return false;
    for (auto it = o->begin(); it != o->end(); ++it)
      if (it->first == loc.back().key) { o->erase(it); return true; }
    return false;
  }

  static void quote(std::string& out, std::string_view s) {
    static const char* hex = "0123456789abcdef";
    out += '"';
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') { out += '\\'; out += static_cast<char>(c); }
      else if (c < 0x20) { out += "\\u00"; out += hex[c >> 4]; out += hex[c & 15]; }
      else out += static_cast<char>(c);
    }
    out += '"';
  }

  void dump(std::string& out) const {
    std::visit([&](const auto& x) {
      using T = std::decay_t<decltype(x)>;
      if constexpr (std::is_same_v<T, Null>) out += "null";
      else if constexpr (std::is_same_v<T, bool>) out += x ? "true" : "false";
      else if constexpr (std::is_same_v<T, Num>) out += x.raw;
      else if constexpr (std::is_same_v<T, Str>) quote(out, x.s);
      else if constexpr (std::is_same_v<T, Raw>) out += x.text;
      else if constexpr (std::is_same_v<T, Arr>) {
        out += '[';
        for (std::size_t i = 0; i < x.size(); ++i) { if (i) out += ','; x[i].dump(out); }
        out += ']';
      } else {
        out += '{';
        for (std::size_t i = 0; i < x.size(); ++i) {
          if (i) out += ',';
          quote(out, x[i].first);
          out += ':';
          x[i].second.dump(out);
        }
        out += '}';
      }
    }, v);
  }
  std::string dump() const { std::string s; dump(s); return s; }
};

/// The reference's boot line as a tree, with every additive field added (all valid).
inline J boot_tree() {
  return J::obj({
      {"type", J::s("boot")},
      {"exec", J::obj({{"argv", J::arr({J::s("/bin/sh"), J::s("-c"), J::s("echo hi")})},
                       {"env", J::obj({{"PATH", J::s("/usr/bin:/bin")}})},
                       {"cwd", J::s("/tmp")},
                       {"uid", J::n(1000)},
                       {"gid", J::n(1000)},
                       {"groups", J::arr({J::n(10), J::n(20)})}})},
      {"mounts", J::arr({J::obj({{"tag", J::s("work")}, {"at", J::s("/work")}, {"ro", J::b(false)},
                                 {"fs", J::s("virtiofs")}})})},
      {"geometry", J::obj({{"width", J::n(1920)}, {"height", J::n(1080)}, {"fps", J::n(60)},
                           {"hdr", J::b(false)}})},
      {"on_exit", J::obj({{"terminal", J::b(true)}, {"halt", J::s("poweroff")}})},
      {"hostname", J::s("vm")},
      {"stdio", J::obj({{"stdin", J::b(true)},
                        {"terminal", J::obj({{"rows", J::n(24)}, {"cols", J::n(80)}})},
                        {"mode", J::s("lossy")},
                        {"buffer_bytes", J::n(65536)},
                        {"drain_ms", J::n(500)}})},
      {"root", J::obj({{"tag", J::s("nes.root")}, {"ro", J::b(false)}, {"fs", J::s("virtiofs")}})},
      {"entropy", J::s("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")},
      {"realtime_ns", J::n(1765000000123456789)},
  });
}

}  // namespace nes::proto::test
