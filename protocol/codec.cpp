// Encoding (fmt) and decoding (simdjson On Demand, error codes only) of the lifecycle channel's
// lines. See docs/protocol.md for the policies (invalid UTF-8, duplicate keys, depth, NUL bytes).
//
// Decoding runs three passes over the same padded copy of the line (each one fast, the line is at
// most the LineReader's cap):
//   A. find `type` (top-level fields only, values skipped);
//   B. validate the whole line as strict JSON: one object, no trailing content, no duplicate key in
//      any object, nesting at most kMaxDepth, every string/number/literal well formed;
//   C. decode the known message, checking every field's type and range against docs/protocol.md.
// Pass B makes pass C simple (it only judges the contract) and makes unknown fields and unknown
// messages as well-formed as known ones. Built with -fno-exceptions: no simdjson exception API.
#include "codec.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include <arpa/inet.h>

#include <fmt/format.h>
#include <simdjson.h>

#include "status.hpp"

namespace nes::proto {
namespace {

namespace od = simdjson::ondemand;
using simdjson::error_code;

constexpr int kMaxDepth = kMaxJsonDepth;
/// Longest excerpt of an offending value quoted in an error reason, in bytes.
constexpr std::size_t kExcerpt = 48;

// ============================================ encoding ============================================

using Buf = fmt::memory_buffer;

void put(Buf& b, std::string_view s) { b.append(s.data(), s.data() + s.size()); }

/// Length of the well-formed UTF-8 sequence starting at s[i], or 0 if s[i] does not start one
/// (Unicode 15 Table 3-7: no overlongs, no surrogates, nothing above U+10FFFF).
std::size_t utf8_seq_len(std::string_view s, std::size_t i) {
  auto at = [&](std::size_t k) -> unsigned { return static_cast<unsigned char>(s[k]); };
  const unsigned c = at(i);
  const std::size_t left = s.size() - i;
  auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) {
    return k < left && at(i + k) >= lo && at(i + k) <= hi;
  };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c == 0xE0) return cont(1, 0xA0, 0xBF) && cont(2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xED) return cont(1, 0x80, 0x9F) && cont(2) ? 3 : 0;
  if (c == 0xF0) return cont(1, 0x90, 0xBF) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xF4) return cont(1, 0x80, 0x8F) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

/// A JSON string literal (RFC 8259 §7): `"` and `\` escaped, every control character U+0000..U+001F
/// escaped (short forms where JSON has them, else \u00XX), each byte that is not part of a
/// well-formed UTF-8 sequence replaced by U+FFFD. The output is always valid JSON and UTF-8.
void put_string(Buf& b, std::string_view s) {
  b.push_back('"');
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t n = utf8_seq_len(s, i);
      if (n == 0) {
        put(b, "\xEF\xBF\xBD");  // U+FFFD REPLACEMENT CHARACTER, one per invalid byte
        ++i;
      } else {
        put(b, s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"': put(b, "\\\""); break;
      case '\\': put(b, "\\\\"); break;
      case '\b': put(b, "\\b"); break;
      case '\f': put(b, "\\f"); break;
      case '\n': put(b, "\\n"); break;
      case '\r': put(b, "\\r"); break;
      case '\t': put(b, "\\t"); break;
      default:
        if (c < 0x20) {
          fmt::format_to(std::back_inserter(b), "\\u{:04x}", static_cast<unsigned>(c));
        } else {
          b.push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  b.push_back('"');
}

template <class Int>
void put_int(Buf& b, Int v) {
  // uint8_t would otherwise be a character to some formatters: widen explicitly.
  if constexpr (std::is_signed_v<Int>) {
    fmt::format_to(std::back_inserter(b), "{}", static_cast<long long>(v));
  } else {
    fmt::format_to(std::back_inserter(b), "{}", static_cast<unsigned long long>(v));
  }
}

void put_bool(Buf& b, bool v) { put(b, v ? "true" : "false"); }

/// `,"name":` (or without the comma for the first field of an object).
void key(Buf& b, std::string_view name, bool first = false) {
  if (!first) b.push_back(',');
  put_string(b, name);
  b.push_back(':');
}

void open(Buf& b, std::string_view type) {
  put(b, "{\"type\":");
  put_string(b, type);
}

void put_ip(Buf& b, const IpAddr& a) { put_string(b, ip_text(a)); }
void put_prefix(Buf& b, const IpPrefix& p) { put_string(b, prefix_text(p)); }
void put_mac(Buf& b, const MacAddr& m) { put_string(b, mac_text(m)); }
/// `[f(x0),f(x1),...]`.
template <class T, class F>
void put_array(Buf& b, const std::vector<T>& xs, F&& f) {
  b.push_back('[');
  for (std::size_t i = 0; i < xs.size(); ++i) {
    if (i) b.push_back(',');
    f(xs[i]);
  }
  b.push_back(']');
}

void enc(Buf& b, const Network& n) {
  b.push_back('{');
  key(b, "interfaces", true);
  put_array(b, n.interfaces, [&](const NetInterface& i) {
    b.push_back('{');
    key(b, "mac", true);
    put_mac(b, i.mac);
    if (i.mtu) {
      key(b, "mtu");
      put_int(b, i.mtu);
    }
    key(b, "addresses");
    put_array(b, i.addresses, [&](const IpPrefix& a) { put_prefix(b, a); });
    b.push_back('}');
  });
  key(b, "routes");
  put_array(b, n.routes, [&](const NetRoute& r) {
    b.push_back('{');
    key(b, "to", true);
    put_prefix(b, r.to);
    if (r.via) {
      key(b, "via");
      put_ip(b, *r.via);
    }
    if (r.mac) {
      key(b, "mac");
      put_mac(b, *r.mac);
    }
    b.push_back('}');
  });
  if (n.dns) {
    key(b, "dns");
    b.push_back('{');
    key(b, "nameservers", true);
    put_array(b, n.dns->nameservers, [&](const IpAddr& a) { put_ip(b, a); });
    key(b, "search");
    put_array(b, n.dns->search, [&](const std::string& x) { put_string(b, x); });
    key(b, "options");
    put_array(b, n.dns->options, [&](const std::string& x) { put_string(b, x); });
    b.push_back('}');
  }
  key(b, "hosts");
  put_array(b, n.hosts, [&](const HostEntry& h) {
    b.push_back('{');
    key(b, "name", true);
    put_string(b, h.name);
    key(b, "ip");
    put_ip(b, h.ip);
    b.push_back('}');
  });
  b.push_back('}');
}

// ---- one function per message: field order is the reference's, optional/additive fields last.

void enc(Buf& b, const Ready& m) {
  open(b, "ready");
  key(b, "protocol_version");
  put_int(b, m.protocol_version);
  if (m.resume) {
    key(b, "resume");
    b.push_back('{');
    key(b, "vm", true);
    put_string(b, m.resume->vm);
    key(b, "generation");
    put_int(b, m.resume->generation);
    key(b, "started");
    put_bool(b, m.resume->started);
    key(b, "outcome_pending");
    put_bool(b, m.resume->outcome_pending);
    b.push_back('}');
  }
  if (m.features) {
    key(b, "features");
    put_array(b, *m.features, [&](const std::string& f) { put_string(b, f); });
  }
}
void enc(Buf& b, const Mounted&) { open(b, "mounted"); }
void enc(Buf& b, const NetworkFailed& m) {
  open(b, "network_failed");
  key(b, "interface");
  put_string(b, m.interface);
  key(b, "step");
  put_string(b, m.step);
  key(b, "reason");
  put_string(b, m.reason);
  key(b, "errno");
  put_int(b, m.err);
}
void enc(Buf& b, const MountFailed& m) {
  open(b, "mount_failed");
  if (m.tag) {
    key(b, "tag");
    put_string(b, *m.tag);
  }
  key(b, "reason");
  put_string(b, m.reason);
  if (m.err) {
    key(b, "errno");
    put_int(b, *m.err);
  }
}
void enc(Buf& b, const Started& m) {
  open(b, "started");
  if (m.pid) {
    key(b, "pid");
    put_int(b, *m.pid);
  }
}
/// start_failed's fields (exec_failed's too): reason, errno if known, class.
void put_failure(Buf& b, const std::string& reason, const std::optional<std::int32_t>& err, StartFailClass cls) {
  key(b, "reason");
  put_string(b, reason);
  if (err) {
    key(b, "errno");
    put_int(b, *err);
  }
  key(b, "class");
  put_string(b, to_string(cls));
}
/// workload_exited's fields (exec_exited's too). Faithful: whatever is set is written; a value
/// with both or neither is refused by decode.
void put_exit(Buf& b, const std::optional<std::uint8_t>& code, const std::optional<std::uint8_t>& sig) {
  if (code) {
    key(b, "exit_code");
    put_int(b, *code);
  }
  if (sig) {
    key(b, "signal");
    put_int(b, *sig);
  }
}
void enc(Buf& b, const StartFailed& m) {
  open(b, "start_failed");
  put_failure(b, m.reason, m.err, m.cls);
}
void enc(Buf& b, const WorkloadExited& m) {
  open(b, "workload_exited");
  put_exit(b, m.exit_code, m.signal);
}
void enc(Buf& b, const ProtocolError& m) {
  open(b, "protocol_error");
  key(b, "reason");
  put_string(b, m.reason);
}
void enc(Buf& b, const Processes& m) {
  open(b, "processes");
  key(b, "processes");
  b.push_back('[');
  bool first = true;
  for (const auto& pi : m.processes) {
    if (!first) b.push_back(',');
    first = false;
    b.push_back('{');
    key(b, "pid", true);
    put_int(b, pi.pid);
    key(b, "ppid");
    put_int(b, pi.ppid);
    key(b, "uid");
    put_int(b, pi.uid);
    key(b, "cmd");
    put_string(b, pi.cmd);
    b.push_back('}');
  }
  b.push_back(']');
  if (m.truncated) {
    key(b, "truncated");
    put_int(b, m.truncated);
  }
  if (m.totals) {
    key(b, "totals");
    b.push_back('{');
    key(b, "mem_total", true);
    put_int(b, m.totals->mem_total);
    key(b, "mem_available");
    put_int(b, m.totals->mem_available);
    key(b, "cpu_user_usec");
    put_int(b, m.totals->cpu_user_usec);
    key(b, "cpu_system_usec");
    put_int(b, m.totals->cpu_system_usec);
    b.push_back('}');
  }
}

void enc(Buf& b, const ContainerResourcesReply& m) {
  open(b, "container_resources_reply");
  key(b, "proc");
  put_int(b, m.proc);
  if (m.error) {
    key(b, "error");
    put_string(b, *m.error);
  }
  if (m.stats) {
    const CgroupStats& t = *m.stats;
    key(b, "stats");
    b.push_back('{');
    const std::pair<std::string_view, std::uint64_t> f[] = {
        {"memory_current", t.memory_current}, {"memory_max", t.memory_max}, {"memory_anon", t.memory_anon},
        {"memory_file", t.memory_file}, {"oom_kills", t.oom_kills}, {"cpu_usage_usec", t.cpu_usage_usec},
        {"cpu_user_usec", t.cpu_user_usec}, {"cpu_system_usec", t.cpu_system_usec},
        {"cpu_nr_periods", t.cpu_nr_periods}, {"cpu_nr_throttled", t.cpu_nr_throttled},
        {"cpu_throttled_usec", t.cpu_throttled_usec}, {"pids_current", t.pids_current}, {"pids_max", t.pids_max}};
    bool first = true;
    for (const auto& [name, v] : f) {
      key(b, name, first);
      first = false;
      put_int(b, v);
    }
    b.push_back('}');
  }
}

void enc(Buf& b, const ExecStarted& m) {
  open(b, "exec_started");
  key(b, "proc");
  put_int(b, m.proc);
  key(b, "pid");
  put_int(b, m.pid);
}
void enc(Buf& b, const ExecFailed& m) {
  open(b, "exec_failed");
  key(b, "proc");
  put_int(b, m.proc);
  put_failure(b, m.reason, m.err, m.cls);
}
void enc(Buf& b, const ExecExited& m) {
  open(b, "exec_exited");
  key(b, "proc");
  put_int(b, m.proc);
  put_exit(b, m.exit_code, m.signal);
}
void enc(Buf& b, const OutputEnd& m) {
  open(b, "output_end");
  key(b, "proc");
  put_int(b, m.proc);
  key(b, "stream");
  put_string(b, to_string(m.stream));
  key(b, "sent");
  put_int(b, m.sent);
  key(b, "unsent");
  put_int(b, m.unsent);
}
void enc(Buf& b, const Exec& e) {
  b.push_back('{');
  key(b, "argv", true);
  b.push_back('[');
  for (std::size_t i = 0; i < e.argv.size(); ++i) {
    if (i) b.push_back(',');
    put_string(b, e.argv[i]);
  }
  b.push_back(']');
  key(b, "env");
  b.push_back('{');
  bool first = true;
  for (const auto& [k, v] : e.env) {
    key(b, k, first);
    first = false;
    put_string(b, v);
  }
  b.push_back('}');
  key(b, "cwd");
  if (e.cwd) {
    put_string(b, *e.cwd);
  } else {
    put(b, "null");  // the reference's shape: cwd is the one optional written as null
  }
  key(b, "uid");
  put_int(b, e.uid);
  key(b, "gid");
  put_int(b, e.gid);
  if (!e.groups.empty()) {  // additive: omitted when empty, so a v2 peer sees the reference shape
    key(b, "groups");
    b.push_back('[');
    for (std::size_t i = 0; i < e.groups.size(); ++i) {
      if (i) b.push_back(',');
      put_int(b, e.groups[i]);
    }
    b.push_back(']');
  }
  b.push_back('}');
}

void enc(Buf& b, const Stdio& st) {
  b.push_back('{');
  key(b, "stdin", true);
  put_bool(b, st.attach_stdin);
  key(b, "terminal");
  if (st.terminal) {
    b.push_back('{');
    key(b, "rows", true);
    put_int(b, st.terminal->rows);
    key(b, "cols");
    put_int(b, st.terminal->cols);
    b.push_back('}');
  } else {
    put(b, "null");
  }
  key(b, "mode");
  put_string(b, to_string(st.mode));
  key(b, "buffer_bytes");
  put_int(b, st.buffer_bytes);
  key(b, "drain_ms");
  put_int(b, st.drain_ms);
  if (st.replay_bytes != 0) {  // additive: written only when set
    key(b, "replay_bytes");
    put_int(b, st.replay_bytes);
  }
  b.push_back('}');
}

void enc(Buf& b, const Boot& m) {
  open(b, "boot");
  key(b, "exec");
  enc(b, m.exec);
  key(b, "mounts");
  b.push_back('[');
  for (std::size_t i = 0; i < m.mounts.size(); ++i) {
    const Mount& mt = m.mounts[i];
    if (i) b.push_back(',');
    b.push_back('{');
    key(b, "tag", true);
    put_string(b, mt.tag);
    key(b, "at");
    put_string(b, mt.at);
    key(b, "ro");
    put_bool(b, mt.ro);
    if (mt.fs != FsType::virtiofs) {  // additive: the default is omitted
      key(b, "fs");
      put_string(b, to_string(mt.fs));
    }
    b.push_back('}');
  }
  b.push_back(']');
  if (m.root) {  // additive: omitted when absent
    key(b, "root");
    b.push_back('{');
    key(b, "tag", true);
    put_string(b, m.root->tag);
    key(b, "ro");
    put_bool(b, m.root->ro);
    if (m.root->fs != FsType::virtiofs) {
      key(b, "fs");
      put_string(b, to_string(m.root->fs));
    }
    if (m.root->upper_mib) {  // additive (root_block): omitted when 0
      key(b, "upper_mib");
      put_int(b, m.root->upper_mib);
    }
    if (m.root->upper) {
      key(b, "upper");
      put_string(b, *m.root->upper);
    }
    b.push_back('}');
  }
  key(b, "geometry");
  b.push_back('{');
  key(b, "width", true);
  put_int(b, m.geometry.width);
  key(b, "height");
  put_int(b, m.geometry.height);
  key(b, "fps");
  put_int(b, m.geometry.fps);
  key(b, "hdr");
  put_bool(b, m.geometry.hdr);
  b.push_back('}');
  key(b, "on_exit");
  b.push_back('{');
  key(b, "terminal", true);
  put_bool(b, m.on_exit.terminal);
  if (m.on_exit.halt) {
    key(b, "halt");
    put_string(b, to_string(*m.on_exit.halt));
  }
  b.push_back('}');
  if (m.hostname) {
    key(b, "hostname");
    put_string(b, *m.hostname);
  }
  if (m.stdio) {  // additive: every field written, so the host's intent is explicit on the wire
    key(b, "stdio");
    enc(b, *m.stdio);
  }
  if (m.reconnect_ms) {
    key(b, "reconnect_ms");
    put_int(b, m.reconnect_ms);
  }
  if (m.vm) {
    key(b, "vm");
    put_string(b, *m.vm);
  }
  if (m.generation) {
    key(b, "generation");
    put_int(b, *m.generation);
  }
  if (m.network) {
    key(b, "network");
    enc(b, *m.network);
  }
  if (m.entropy) {
    key(b, "entropy");
    b.push_back('"');
    for (std::uint8_t x : *m.entropy) fmt::format_to(std::back_inserter(b), "{:02x}", x);
    b.push_back('"');
  }
  if (m.realtime_ns) {
    key(b, "realtime_ns");
    put_int(b, *m.realtime_ns);
  }
}
void enc(Buf& b, const Stop&) { open(b, "stop"); }
void enc(Buf& b, const Shutdown&) { open(b, "shutdown"); }
void enc(Buf& b, const Kill& m) {
  open(b, "kill");
  key(b, "signal");
  put_int(b, m.signal);
  if (m.proc) {  // additive: absent means the workload
    key(b, "proc");
    put_int(b, *m.proc);
  }
}
/// `{"memory_max":N,...}`: the set fields of `r`, in their declared order.
void enc(Buf& b, const ContainerResources& r) {
  b.push_back('{');
  bool first = true;
  auto field = [&](std::string_view name, const auto& v) {
    if (!v) return;
    key(b, name, first);
    first = false;
    put_int(b, *v);
  };
  field("memory_max", r.memory_max);
  field("cpu_quota", r.cpu_quota);
  field("cpu_period", r.cpu_period);
  field("cpu_weight", r.cpu_weight);
  field("pids_max", r.pids_max);
  b.push_back('}');
}
void enc(Buf& b, const ExecProcess& m) {
  open(b, "exec");
  key(b, "proc");
  put_int(b, m.proc);
  key(b, "exec");
  enc(b, m.exec);
  if (m.stdio) {
    key(b, "stdio");
    enc(b, *m.stdio);
  }
  if (m.container) {  // additive: absent means the VM's own root and namespaces
    key(b, "container");
    b.push_back('{');
    key(b, "root", true);
    put_string(b, m.container->root);
    if (m.container->hostname) {
      key(b, "hostname");
      put_string(b, *m.container->hostname);
    }
    if (m.container->readonly) {
      key(b, "readonly");
      put_bool(b, true);
    }
    if (!m.container->mounts.empty()) {  // additive: omitted when none
      key(b, "mounts");
      b.push_back('[');
      bool first = true;
      for (const ContainerMount& cm : m.container->mounts) {
        if (!first) b.push_back(',');
        first = false;
        b.push_back('{');
        key(b, "dst", true);
        put_string(b, cm.dst);
        key(b, "fs");
        put_string(b, to_string(cm.fs));
        if (!cm.src.empty()) key(b, "src"), put_string(b, cm.src);
        if (cm.ro) key(b, "ro"), put_bool(b, true);
        if (cm.nosuid) key(b, "nosuid"), put_bool(b, true);
        if (cm.nodev) key(b, "nodev"), put_bool(b, true);
        if (cm.noexec) key(b, "noexec"), put_bool(b, true);
        if (!cm.data.empty()) key(b, "data"), put_string(b, cm.data);
        if (!cm.propagation.empty()) key(b, "propagation"), put_string(b, cm.propagation);
        b.push_back('}');
      }
      b.push_back(']');
    }
    if (m.container->resources) {  // additive (feature "resources")
      key(b, "resources");
      enc(b, *m.container->resources);
    }
    b.push_back('}');
  }
  if (m.in) {
    key(b, "in");
    put_int(b, *m.in);
  }
}
void enc(Buf& b, const ListProcesses&) { open(b, "list_processes"); }
void enc(Buf& b, const ContainerResourcesRequest& m) {
  open(b, "container_resources");
  key(b, "proc");
  put_int(b, m.proc);
  if (m.update) {
    key(b, "update");
    enc(b, *m.update);
  }
}

template <class Variant>
std::string encode_any(const Variant& m, bool newline, const GuestEnvelope* env = nullptr) {
  Buf b;
  std::visit([&](const auto& x) { enc(b, x); }, m);
  if (env && env->generation) {  // the envelope: after the message's own fields
    key(b, "generation");
    put_int(b, *env->generation);
  }
  b.push_back('}');
  if (newline) b.push_back('\n');
  return fmt::to_string(b);
}

// ============================================ decoding ============================================

/// A field path, built only when an error is reported: `boot.exec.argv[2]`, `boot.exec.env.PATH`,
/// `boot.exec.env["A.B"]` (keys that are not plain identifiers are quoted).
struct Path {
  const Path* parent = nullptr;
  std::string_view name;  // root name or key
  std::size_t index = 0;
  enum class Kind { root, key, index } kind = Kind::root;

  Path operator/(std::string_view k) const { return Path{this, k, 0, Kind::key}; }
  Path operator[](std::size_t i) const { return Path{this, {}, i, Kind::index}; }
};

/// The first kExcerpt bytes of s, cut back to a UTF-8 character boundary.
std::string_view clip(std::string_view s) {
  if (s.size() <= kExcerpt) return s;
  std::size_t n = kExcerpt;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

/// s as a JSON string literal, clipped (with "..." after the closing quote when clipped).
std::string excerpt_json(std::string_view s) {
  Buf b;
  const bool cut = s.size() > kExcerpt;
  put_string(b, clip(s));
  if (cut) put(b, "...");
  return fmt::to_string(b);
}

bool plain_identifier(std::string_view k) {
  if (k.empty() || k.size() > kExcerpt) return false;
  return std::all_of(k.begin(), k.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

void path_to(Buf& b, const Path& p) {
  if (p.parent) path_to(b, *p.parent);
  switch (p.kind) {
    case Path::Kind::root: put(b, p.name); break;
    case Path::Kind::key:
      if (plain_identifier(p.name)) {
        if (b.size()) b.push_back('.');
        put(b, p.name);
      } else {
        b.push_back('[');
        put(b, excerpt_json(p.name));
        b.push_back(']');
      }
      break;
    case Path::Kind::index: fmt::format_to(std::back_inserter(b), "[{}]", p.index); break;
  }
}

std::string path_str(const Path& p) {
  Buf b;
  path_to(b, p);
  return fmt::to_string(b);
}

/// The first error of a decode; every helper returns false once it is set.
struct Err {
  std::string reason;
  bool fail(const Path& p, std::string_view what) {
    reason = fmt::format("{}: {}", path_str(p), what);
    return false;
  }
  bool expected(const Path& p, std::string_view expect, std::string_view got) {
    reason = fmt::format("{}: expected {}, got {}", path_str(p), expect, got);
    return false;
  }
  bool json(const Path& p, error_code e) {
    reason = fmt::format("{}: invalid JSON ({})", path_str(p), simdjson::error_message(e));
    return false;
  }
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

std::string_view type_word(od::json_type t) {
  switch (t) {
    case od::json_type::array: return "array";
    case od::json_type::object: return "object";
    case od::json_type::number: return "number";
    case od::json_type::string: return "string";
    case od::json_type::boolean: return "boolean";
    case od::json_type::null: return "null";
  }
  return "value";
}

/// What a value is, for "got ...": the token itself for scalars (clipped), else "array"/"object".
std::string describe(od::value& v) {
  od::json_type t{};
  if (v.type().get(t) != simdjson::SUCCESS) return "invalid JSON";
  if (t == od::json_type::array || t == od::json_type::object) return std::string(type_word(t));
  std::string_view tok = trim(v.raw_json_token());
  if (tok.size() <= kExcerpt) return std::string(tok);
  return std::string(clip(tok)) + "...";
}

// ---- pass B: strict JSON validation of a whole line -------------------------------------------

/// 2^1024 - 2^970, the least value a double rounds to infinity (half-way between DBL_MAX and
/// 2^1024, which rounds to even: up), as its 309 decimal digits.
constexpr std::string_view kDoubleOverflow =
    "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977"
    "587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845"
    "817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559"
    "699508093042880177904174497792";
static_assert(kDoubleOverflow.size() == 309);

/// Whether `tok` is one JSON number (RFC 8259 §6: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?)
/// whose magnitude a double holds: integers beyond 64 bits are valid (as doubles), a number that
/// would round to infinity is refused (§9 lets a parser limit the range), one that rounds to zero
/// is not. simdjson's get_double's verdict without its float parser (~14 KiB of the static init:
/// tables and a big-decimal slow path): the value's digits are compared with kDoubleOverflow's,
/// exactly. (Compared on 200 000 numbers around the limit and malformed ones, the one difference:
/// the limit itself spelled `0.1797...e309`, which simdjson lets through as DBL_MAX while it refuses
/// the same value written as an integer; here both are refused.)
bool json_number_ok(std::string_view tok) {
  std::size_t i = 0, n = tok.size();
  auto digits = [&] {
    std::size_t b = i;
    while (i < n && tok[i] >= '0' && tok[i] <= '9') ++i;
    return tok.substr(b, i - b);
  };
  if (i < n && tok[i] == '-') ++i;
  std::string_view whole = digits(), frac;
  if (whole.empty() || (whole.size() > 1 && whole[0] == '0')) return false;
  if (i < n && tok[i] == '.') {
    ++i;
    if ((frac = digits()).empty()) return false;
  }
  std::int64_t exp = 0;  // saturated: a line is at most a few MiB, so +-2^40 is "beyond any"
  if (i < n && (tok[i] == 'e' || tok[i] == 'E')) {
    ++i;
    bool neg = i < n && tok[i] == '-';
    if (i < n && (tok[i] == '-' || tok[i] == '+')) ++i;
    std::string_view e = digits();
    if (e.empty()) return false;
    for (char c : e) exp = std::min<std::int64_t>(exp * 10 + (c - '0'), std::int64_t{1} << 40);
    if (neg) exp = -exp;
  }
  if (i != n) return false;
  // The value is 0.D x 10^point, D the significant digits (no leading or trailing zeros).
  std::int64_t point = static_cast<std::int64_t>(whole.size()) + exp;
  std::string sig{whole};
  sig += frac;
  std::size_t lead = sig.find_first_not_of('0');
  if (lead == std::string::npos) return true;  // zero
  point -= static_cast<std::int64_t>(lead);
  std::string_view d = std::string_view(sig).substr(lead);
  d = d.substr(0, d.find_last_not_of('0') + 1);
  const auto top = static_cast<std::int64_t>(kDoubleOverflow.size());
  if (point != top) return point < top;
  return d.compare(kDoubleOverflow) < 0;
}


bool validate_value(od::value v, const Path& p, int depth, Err& err);

bool validate_object(od::object obj, const Path& p, int depth, Err& err) {
  std::vector<std::string_view> keys;  // views into the parser's string buffer (valid this pass)
  for (auto fr : obj) {
    od::field f;
    if (auto e = std::move(fr).get(f)) return err.json(p, e);
    std::string_view k;
    if (auto e = f.unescaped_key().get(k)) return err.json(p, e);
    keys.push_back(k);
    if (!validate_value(f.value(), p / k, depth + 1, err)) return false;
  }
  std::sort(keys.begin(), keys.end());
  auto dup = std::adjacent_find(keys.begin(), keys.end());
  if (dup != keys.end()) return err.fail(p, fmt::format("duplicate key {}", excerpt_json(*dup)));
  return true;
}

bool validate_value(od::value v, const Path& p, int depth, Err& err) {
  od::json_type t{};
  if (auto e = v.type().get(t)) return err.json(p, e);
  switch (t) {
    case od::json_type::object: {
      if (depth > kMaxDepth)
        return err.fail(p, fmt::format("nesting deeper than {} levels", kMaxDepth));
      od::object o;
      if (auto e = v.get_object().get(o)) return err.json(p, e);
      return validate_object(o, p, depth, err);
    }
    case od::json_type::array: {
      if (depth > kMaxDepth)
        return err.fail(p, fmt::format("nesting deeper than {} levels", kMaxDepth));
      od::array a;
      if (auto e = v.get_array().get(a)) return err.json(p, e);
      std::size_t i = 0;
      for (auto er : a) {
        od::value el;
        if (auto e = std::move(er).get(el)) return err.json(p, e);
        if (!validate_value(el, p[i], depth + 1, err)) return false;
        ++i;
      }
      return true;
    }
    case od::json_type::string: {
      std::string_view s;
      if (auto e = v.get_string().get(s)) return err.json(p, e);
      return true;
    }
    case od::json_type::number:
      // Checked as text, not parsed: a typed field's number is read by its own getter (pass C).
      if (!json_number_ok(trim(v.raw_json_token()))) return err.json(p, simdjson::NUMBER_ERROR);
      return true;
    case od::json_type::boolean: {
      bool b = false;
      if (auto e = v.get_bool().get(b)) return err.json(p, e);
      return true;
    }
    case od::json_type::null: {
      bool is = false;
      if (auto e = v.is_null().get(is)) return err.json(p, e);
      if (!is) return err.json(p, simdjson::N_ATOM_ERROR);
      return true;
    }
  }
  return err.json(p, simdjson::TAPE_ERROR);
}

// ---- pass C: typed fields ------------------------------------------------------------------------

bool get_int(od::value v, const Path& p, std::int64_t lo, std::int64_t hi, std::string_view expect,
             std::int64_t& out, Err& err) {
  od::json_type t{};
  if (v.type().get(t) != simdjson::SUCCESS || t != od::json_type::number)
    return err.expected(p, expect, describe(v));
  std::string got = describe(v);
  std::int64_t x = 0;
  if (v.get_int64().get(x) != simdjson::SUCCESS || x < lo || x > hi)
    return err.expected(p, expect, got);
  out = x;
  return true;
}

template <class T>
bool get_ranged(od::value v, const Path& p, std::int64_t lo, std::int64_t hi,
                std::string_view expect, T& out, Err& err) {
  std::int64_t x = 0;
  if (!get_int(v, p, lo, hi, expect, x, err)) return false;
  out = static_cast<T>(x);
  return true;
}

constexpr std::string_view kU32 = "unsigned 32-bit integer";

bool get_u32(od::value v, const Path& p, std::uint32_t& out, Err& err) {
  return get_ranged(v, p, 0, std::numeric_limits<std::uint32_t>::max(), kU32, out, err);
}

/// uid/gid: a u32 other than 4294967295 (to set*id(2) it means "unchanged").
bool get_id(od::value v, const Path& p, std::uint32_t& out, Err& err) {
  if (!get_u32(v, p, out, err)) return false;
  if (out == kInvalidId)
    return err.expected(p, "unsigned 32-bit integer other than 4294967295 (\"unchanged\" to set*id)",
                        "4294967295");
  return true;
}

bool get_bool(od::value v, const Path& p, bool& out, Err& err) {
  od::json_type t{};
  if (v.type().get(t) != simdjson::SUCCESS || t != od::json_type::boolean ||
      v.get_bool().get(out) != simdjson::SUCCESS)
    return err.expected(p, "boolean", describe(v));
  return true;
}

/// A string without NUL bytes (they cannot reach execve(2), mount(2) or sethostname(2)).
bool get_str(od::value v, const Path& p, std::string& out, Err& err) {
  od::json_type t{};
  std::string_view s;
  if (v.type().get(t) != simdjson::SUCCESS || t != od::json_type::string ||
      v.get_string().get(s) != simdjson::SUCCESS)
    return err.expected(p, "string", describe(v));
  if (auto nul = s.find('\0'); nul != std::string_view::npos)
    return err.expected(p, "string without NUL bytes", fmt::format("NUL at byte {}", nul));
  out.assign(s);
  return true;
}

template <class Enum, std::size_t N>
bool get_enum(od::value v, const Path& p, const std::array<Enum, N>& values, Enum& out, Err& err) {
  std::string expect = "one of";
  for (std::size_t i = 0; i < N; ++i)
    expect += fmt::format("{}\"{}\"", i ? ", " : " ", to_string(values[i]));
  od::json_type t{};
  std::string_view s;
  if (v.type().get(t) != simdjson::SUCCESS || t != od::json_type::string ||
      v.get_string().get(s) != simdjson::SUCCESS)
    return err.expected(p, expect, describe(v));
  for (Enum e : values) {
    if (to_string(e) == s) {
      out = e;
      return true;
    }
  }
  return err.expected(p, expect, excerpt_json(s));
}

/// Calls f(key, value) for every field of the object in `v`; `expect` names the object's shape.
template <class F>
bool each_field(od::value v, const Path& p, std::string_view expect, Err& err, F&& f) {
  od::json_type t{};
  od::object o;
  if (v.type().get(t) != simdjson::SUCCESS || t != od::json_type::object ||
      v.get_object().get(o) != simdjson::SUCCESS)
    return err.expected(p, expect, describe(v));
  for (auto fr : o) {
    od::field fl;
    std::string_view k;
    if (auto e = std::move(fr).get(fl)) return err.json(p, e);
    if (auto e = fl.unescaped_key().get(k)) return err.json(p, e);
    if (!f(k, fl.value())) return false;
  }
  return true;
}

/// Calls f(index, element) for every element of the array in `v`.
template <class F>
bool each_element(od::value v, const Path& p, std::string_view expect, Err& err, F&& f) {
  od::json_type t{};
  od::array a;
  if (v.type().get(t) != simdjson::SUCCESS || t != od::json_type::array ||
      v.get_array().get(a) != simdjson::SUCCESS)
    return err.expected(p, expect, describe(v));
  std::size_t i = 0;
  for (auto er : a) {
    od::value el;
    if (auto e = std::move(er).get(el)) return err.json(p, e);
    if (!f(i, el)) return false;
    ++i;
  }
  return true;
}

bool missing(const Path& p, std::string_view field, std::string_view expect, Err& err) {
  return err.fail(p / field, fmt::format("missing (expected {})", expect));
}

// ---- boot ----

bool dec_exec(od::value v, const Path& p, Exec& out, Err& err) {
  bool argv = false, uid = false, gid = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "argv") {
      argv = true;
      if (!each_element(fv, fp, "non-empty array of strings", err, [&](std::size_t i, od::value el) {
            return get_str(el, fp[i], out.argv.emplace_back(), err);
          }))
        return false;
      if (out.argv.empty()) return err.expected(fp, "non-empty array of strings", "[]");
      return true;
    }
    if (k == "env") {
      return each_field(fv, fp, "object of strings", err, [&](std::string_view name, od::value ev) {
        const Path ep = fp / name;
        if (name.empty() || name.find('=') != std::string_view::npos)
          return err.fail(ep, "environment variable name must be non-empty and contain no '='");
        if (name.find('\0') != std::string_view::npos)
          return err.fail(ep, "environment variable name must not contain NUL bytes");
        std::string val;
        if (!get_str(ev, ep, val, err)) return false;
        out.env.emplace(std::string(name), std::move(val));  // duplicates refused in pass B
        return true;
      });
    }
    if (k == "cwd") {
      bool is_null = false;
      if (fv.is_null().get(is_null) == simdjson::SUCCESS && is_null) {
        out.cwd.reset();
        return true;
      }
      od::json_type t{};
      if (fv.type().get(t) != simdjson::SUCCESS || t != od::json_type::string)
        return err.expected(fp, "string or null", describe(fv));
      return get_str(fv, fp, out.cwd.emplace(), err);
    }
    if (k == "uid") return uid = true, get_id(fv, fp, out.uid, err);
    if (k == "gid") return gid = true, get_id(fv, fp, out.gid, err);
    if (k == "groups") {
      return each_element(fv, fp, "array of unsigned 32-bit integers", err,
                          [&](std::size_t i, od::value el) {
                            return get_u32(el, fp[i], out.groups.emplace_back(), err);
                          });
    }
    return true;  // unknown field: ignored at v2
  });
  if (!ok) return false;
  if (!argv) return missing(p, "argv", "non-empty array of strings", err);
  if (!uid) return missing(p, "uid", kU32, err);
  if (!gid) return missing(p, "gid", kU32, err);
  return true;
}

constexpr std::array kFsTypes{FsType::virtiofs, FsType::ninep, FsType::tmpfs, FsType::bind};
constexpr std::array kHalts{Halt::poweroff, Halt::reboot};
constexpr std::array kClasses{StartFailClass::not_found, StartFailClass::not_executable,
                              StartFailClass::other};

bool dec_mount(od::value v, const Path& p, Mount& out, Err& err) {
  bool tag = false, at = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "tag") return tag = true, get_str(fv, fp, out.tag, err);
    if (k == "at") {
      at = true;
      if (!get_str(fv, fp, out.at, err)) return false;
      if (out.at.empty() || out.at.front() != '/')
        return err.expected(fp, "absolute path", excerpt_json(out.at));
      return true;
    }
    if (k == "ro") return get_bool(fv, fp, out.ro, err);
    if (k == "fs") return get_enum(fv, fp, kFsTypes, out.fs, err);
    return true;
  });
  if (!ok) return false;
  if (!tag) return missing(p, "tag", "string", err);
  if (!at) return missing(p, "at", "absolute path", err);
  return true;
}

constexpr std::array kRootFsTypes{FsType::virtiofs, FsType::ninep, FsType::erofs, FsType::ext4};

/// A virtio-blk serial: 1..kBlockSerialMax bytes of [A-Za-z0-9._-] (what QEMU's serial= takes
/// unquoted and /sys/block/*/serial shows as is).
bool valid_block_serial(std::string_view s) {
  if (s.empty() || s.size() > kBlockSerialMax) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  return true;
}

constexpr std::string_view kSerial = "virtio-blk serial of 1..20 of [A-Za-z0-9._-]";

/// boot.root: `tag` required and non-empty; a block root's (fs erofs/ext4) tag and `upper` are
/// virtio-blk serials; `upper_mib` 0..kUpperMibMax; `upper` and `upper_mib` only for a block root,
/// never both.
bool dec_root(od::value v, const Path& p, Root& out, Err& err) {
  bool tag = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "tag") {
      tag = true;
      if (!get_str(fv, fp, out.tag, err)) return false;
      if (out.tag.empty()) return err.expected(fp, "non-empty string", "\"\"");
      return true;
    }
    if (k == "ro") return get_bool(fv, fp, out.ro, err);
    if (k == "fs") return get_enum(fv, fp, kRootFsTypes, out.fs, err);
    if (k == "upper_mib") return get_ranged(fv, fp, 0, kUpperMibMax, "integer 0..1048576", out.upper_mib, err);
    if (k == "upper") {
      if (!get_str(fv, fp, out.upper.emplace(), err)) return false;
      return valid_block_serial(*out.upper) || err.expected(fp, kSerial, excerpt_json(*out.upper));
    }
    return true;
  });
  if (!ok) return false;
  if (!tag) return missing(p, "tag", "string", err);
  if (is_block_fs(out.fs)) {
    if (!valid_block_serial(out.tag)) return err.expected(p / "tag", kSerial, excerpt_json(out.tag));
    if (out.upper && out.upper_mib)
      return err.fail(p / "upper_mib", "not with upper (a scratch disk's size is its own)");
    if (out.upper && *out.upper == out.tag) return err.fail(p / "upper", "the same disk as tag");
  } else {
    if (out.upper) return err.fail(p / "upper", "only with a block root (fs erofs or ext4)");
    if (out.upper_mib) return err.fail(p / "upper_mib", "only with a block root (fs erofs or ext4)");
  }
  return true;
}

bool dec_geometry(od::value v, const Path& p, Geometry& out, Err& err) {
  bool w = false, h = false, fps = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "width") return w = true, get_u32(fv, fp, out.width, err);
    if (k == "height") return h = true, get_u32(fv, fp, out.height, err);
    if (k == "fps") return fps = true, get_u32(fv, fp, out.fps, err);
    if (k == "hdr") return get_bool(fv, fp, out.hdr, err);
    return true;
  });
  if (!ok) return false;
  if (!w) return missing(p, "width", kU32, err);
  if (!h) return missing(p, "height", kU32, err);
  if (!fps) return missing(p, "fps", kU32, err);
  return true;
}

bool dec_on_exit(od::value v, const Path& p, OnExit& out, Err& err) {
  bool terminal = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "terminal") return terminal = true, get_bool(fv, fp, out.terminal, err);
    if (k == "halt") return get_enum(fv, fp, kHalts, out.halt.emplace(), err);
    return true;
  });
  if (!ok) return false;
  if (!terminal) return missing(p, "terminal", "boolean", err);
  return true;
}

constexpr std::array kStdioModes{StdioMode::lossless, StdioMode::lossy};
constexpr std::string_view kCells = "integer 1..65535";

bool is_null(od::value& v) {
  bool n = false;
  return v.is_null().get(n) == simdjson::SUCCESS && n;
}

bool dec_terminal(od::value v, const Path& p, Terminal& out, Err& err) {
  bool rows = false, cols = false;
  bool ok = each_field(v, p, "object or null", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "rows") return rows = true, get_ranged(fv, fp, 1, 65535, kCells, out.rows, err);
    if (k == "cols") return cols = true, get_ranged(fv, fp, 1, 65535, kCells, out.cols, err);
    return true;
  });
  if (!ok) return false;
  if (!rows) return missing(p, "rows", kCells, err);
  if (!cols) return missing(p, "cols", kCells, err);
  return true;
}

/// `boot.stdio`: every field optional with its default (docs/protocol.md "Data channel").
bool dec_stdio(od::value v, const Path& p, Stdio& out, Err& err) {
  return each_field(v, p, "object or null", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "stdin") return get_bool(fv, fp, out.attach_stdin, err);
    if (k == "terminal") {
      if (is_null(fv)) return out.terminal.reset(), true;
      return dec_terminal(fv, fp, out.terminal.emplace(), err);
    }
    if (k == "mode") return get_enum(fv, fp, kStdioModes, out.mode, err);
    if (k == "buffer_bytes")
      return get_ranged(fv, fp, kStdioBufferMin, kStdioBufferMax, "integer 4096..67108864",
                        out.buffer_bytes, err);
    if (k == "drain_ms")
      return get_ranged(fv, fp, 0, kStdioDrainMaxMs, "integer 0..60000", out.drain_ms, err);
    if (k == "replay_bytes") {
      constexpr std::string_view kReplay = "integer 0 or 4096..67108864";
      std::int64_t x = 0;
      if (!get_int(fv, fp, 0, kReplayMax, kReplay, x, err)) return false;
      if (x != 0 && x < kStdioBufferMin) return err.expected(fp, kReplay, fmt::format("{}", x));
      out.replay_bytes = static_cast<std::uint32_t>(x);
      return true;
    }
    return true;
  });
}

/// Calls f(key, value) for every top-level field except `type`.
template <class F>
bool each_top_field(od::document& doc, const Path& p, Err& err, F&& f) {
  od::object o;
  if (auto e = doc.get_object().get(o)) return err.json(p, e);
  for (auto fr : o) {
    od::field fl;
    std::string_view k;
    if (auto e = std::move(fr).get(fl)) return err.json(p, e);
    if (auto e = fl.unescaped_key().get(k)) return err.json(p, e);
    if (k == "type") continue;
    if (!f(k, fl.value())) return false;
  }
  return true;
}

// ---- boot.network ----

constexpr std::string_view kIpText = "IPv4 or IPv6 address";
constexpr std::string_view kCidrText = "address/prefix (CIDR)";
constexpr std::string_view kMacText = "MAC address \"xx:xx:xx:xx:xx:xx\"";

/// `text` as an IPv4 (dotted quad) or IPv6 address (inet_pton(3)); false if it is neither.
[[gnu::noinline]] bool parse_ip(std::string_view text, IpAddr& out) {
  if (text.size() >= INET6_ADDRSTRLEN) return false;
  char t[INET6_ADDRSTRLEN] = {};
  std::memcpy(t, text.data(), text.size());
  if (::inet_pton(AF_INET, t, out.bytes.data()) == 1) return out.family = 4, true;
  if (::inet_pton(AF_INET6, t, out.bytes.data()) == 1) return out.family = 6, true;
  return false;
}

[[gnu::noinline]] bool get_ip(od::value v, const Path& p, IpAddr& out, Err& err) {
  std::string s;
  if (!get_str(v, p, s, err)) return false;
  if (!parse_ip(s, out)) return err.expected(p, kIpText, excerpt_json(s));
  return true;
}

/// "ADDR/LEN", LEN 0..32 (IPv4) or 0..128 (IPv6), decimal without sign or leading zeros.
[[gnu::noinline]] bool get_prefix(od::value v, const Path& p, IpPrefix& out, Err& err) {
  std::string s;
  if (!get_str(v, p, s, err)) return false;
  auto slash = s.find('/');
  if (slash == std::string::npos || !parse_ip(std::string_view(s).substr(0, slash), out.addr))
    return err.expected(p, kCidrText, excerpt_json(s));
  std::string_view len = std::string_view(s).substr(slash + 1);
  unsigned n = 0;
  const unsigned max = out.addr.family == 6 ? 128 : 32;
  if (len.empty() || len.size() > 3 || (len.size() > 1 && len[0] == '0'))
    return err.expected(p, kCidrText, excerpt_json(s));
  for (char c : len) {
    if (c < '0' || c > '9') return err.expected(p, kCidrText, excerpt_json(s));
    n = n * 10 + static_cast<unsigned>(c - '0');
  }
  if (n > max) return err.expected(p, fmt::format("prefix length 0..{}", max), excerpt_json(s));
  out.len = static_cast<std::uint8_t>(n);
  return true;
}

/// A hex digit's value (either case), or -1.
int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

[[gnu::noinline]] bool get_mac(od::value v, const Path& p, MacAddr& out, Err& err) {
  std::string s;
  if (!get_str(v, p, s, err)) return false;
  if (s.size() != 17) return err.expected(p, kMacText, excerpt_json(s));
  for (std::size_t i = 0; i < 6; ++i) {
    int hi = hex(s[3 * i]), lo = hex(s[3 * i + 1]);
    if (hi < 0 || lo < 0 || (i < 5 && s[3 * i + 2] != ':')) return err.expected(p, kMacText, excerpt_json(s));
    out[i] = static_cast<std::uint8_t>(hi * 16 + lo);
  }
  return true;
}

/// Each element of the array `v` through `f(path, element, out)`, at most `max` of them.
template <class T, class F>
bool get_list(od::value v, const Path& p, std::size_t max, std::string_view expect, std::vector<T>& out,
              Err& err, F&& f) {
  return each_element(v, p, expect, err, [&](std::size_t i, od::value el) {
    if (i >= max) return err.fail(p, fmt::format("more than {} elements", max));
    return f(el, p[i], out.emplace_back());
  });
}

/// A hostname or search domain: 1..253 bytes of letters, digits, '-', '.', '_' (what
/// resolv.conf(5) and hosts(5) can hold without quoting).
[[gnu::noinline]] bool get_dns_name(od::value v, const Path& p, std::string& out, Err& err) {
  if (!get_str(v, p, out, err)) return false;
  return valid_dns_name(out) || err.expected(p, "name of 1..253 letters, digits, '-', '.', '_'", excerpt_json(out));
}

[[gnu::noinline]] bool dec_interface(od::value v, const Path& p, NetInterface& out, Err& err) {
  bool mac = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "mac") return mac = true, get_mac(fv, fp, out.mac, err);
    if (k == "mtu") {
      if (!get_u32(fv, fp, out.mtu, err)) return false;
      if (out.mtu != 0 && (out.mtu < kNetMtuMin || out.mtu > kNetMtuMax))
        return err.expected(fp, "integer 0 or 68..65535", fmt::format("{}", out.mtu));
      return true;
    }
    if (k == "addresses")
      return get_list(fv, fp, kNetMaxAddresses, "array of CIDR strings", out.addresses, err,
                      [&](od::value el, const Path& ep, IpPrefix& a) { return get_prefix(el, ep, a, err); });
    return true;
  });
  if (!ok) return false;
  return mac || missing(p, "mac", kMacText, err);
}

[[gnu::noinline]] bool dec_route(od::value v, const Path& p, NetRoute& out, Err& err) {
  bool to = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "to") return to = true, get_prefix(fv, fp, out.to, err);
    if (k == "via") return get_ip(fv, fp, out.via.emplace(), err);
    if (k == "mac") return get_mac(fv, fp, out.mac.emplace(), err);
    return true;
  });
  if (!ok) return false;
  if (!to) return missing(p, "to", kCidrText, err);
  if (out.via && out.via->family != out.to.addr.family)
    return err.fail(p / "via", "address family differs from \"to\"'s");
  return true;
}

[[gnu::noinline]] bool dec_dns(od::value v, const Path& p, Dns& out, Err& err) {
  return each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "nameservers")
      return get_list(fv, fp, kNetMaxNameservers, "array of addresses", out.nameservers, err,
                      [&](od::value el, const Path& ep, IpAddr& a) { return get_ip(el, ep, a, err); });
    if (k == "search")
      return get_list(fv, fp, kNetMaxSearch, "array of domain names", out.search, err,
                      [&](od::value el, const Path& ep, std::string& d) { return get_dns_name(el, ep, d, err); });
    if (k == "options")
      return get_list(fv, fp, kNetMaxOptions, "array of resolv.conf options", out.options, err,
                      [&](od::value el, const Path& ep, std::string& o) {
                        if (!get_str(el, ep, o, err)) return false;
                        return valid_dns_option(o) || err.expected(ep, "option of 1..64 printable ASCII bytes, no spaces",
                                                  excerpt_json(o));
                      });
    return true;
  });
}

[[gnu::noinline]] bool dec_host_entry(od::value v, const Path& p, HostEntry& h, Err& err) {
  bool name = false, ip = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    if (k == "name") return name = true, get_dns_name(fv, p / k, h.name, err);
    if (k == "ip") return ip = true, get_ip(fv, p / k, h.ip, err);
    return true;
  });
  if (!ok) return false;
  if (!name) return missing(p, "name", "string", err);
  return ip || missing(p, "ip", kIpText, err);
}

[[gnu::noinline]] bool dec_network(od::value v, const Path& p, Network& out, Err& err) {
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "interfaces")
      return get_list(fv, fp, kNetMaxInterfaces, "array of objects", out.interfaces, err,
                      [&](od::value el, const Path& ep, NetInterface& i) { return dec_interface(el, ep, i, err); });
    if (k == "routes")
      return get_list(fv, fp, kNetMaxRoutes, "array of objects", out.routes, err,
                      [&](od::value el, const Path& ep, NetRoute& r) { return dec_route(el, ep, r, err); });
    if (k == "dns") {
      if (is_null(fv)) return out.dns.reset(), true;
      return dec_dns(fv, fp, out.dns.emplace(), err);
    }
    if (k == "hosts")
      return get_list(fv, fp, kNetMaxHosts, "array of objects", out.hosts, err,
                      [&](od::value el, const Path& ep, HostEntry& h) { return dec_host_entry(el, ep, h, err); });
    return true;
  });
  if (!ok) return false;
  // Every route names an interface the descriptor configures (or there is one to default to).
  for (std::size_t i = 0; i < out.routes.size(); ++i) {
    const auto& r = out.routes[i];
    if (out.interfaces.empty()) return err.fail((p / "routes")[i], "a route needs an interface: interfaces is empty");
    if (r.mac && std::none_of(out.interfaces.begin(), out.interfaces.end(),
                              [&](const NetInterface& n) { return n.mac == *r.mac; }))
      return err.fail((p / "routes")[i] / "mac", "names no interface of network.interfaces");
  }
  for (std::size_t i = 0; i < out.interfaces.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (out.interfaces[i].mac == out.interfaces[j].mac)
        return err.fail((p / "interfaces")[i] / "mac", fmt::format("same as interfaces[{}].mac", j));
  return true;
}

constexpr std::string_view kGeneration = "integer 1..9007199254740991";

/// `boot.entropy`: exactly 2 * kEntropyBytes lowercase hex digits.
bool get_entropy(od::value v, const Path& p, Entropy& out, Err& err) {
  constexpr std::string_view kExpect = "64 lowercase hex digits";
  std::string s;
  if (!get_str(v, p, s, err)) return false;
  if (s.size() != 2 * out.size()) return err.expected(p, kExpect, excerpt_json(s));
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (hex(s[i]) < 0 || (s[i] >= 'A' && s[i] <= 'F')) return err.expected(p, kExpect, excerpt_json(s));
    out[i / 2] = static_cast<std::uint8_t>(out[i / 2] * 16 + hex(s[i]));
  }
  return true;
}

bool dec(od::document& doc, const Path& p, Boot& out, Err& err) {
  bool exec = false, geometry = false, on_exit = false;
  bool ok = each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "exec") return exec = true, dec_exec(fv, fp, out.exec, err);
    if (k == "mounts")
      return each_element(fv, fp, "array of objects", err, [&](std::size_t i, od::value el) {
        return dec_mount(el, fp[i], out.mounts.emplace_back(), err);
      });
    if (k == "root") return dec_root(fv, fp, out.root.emplace(), err);
    if (k == "geometry") return geometry = true, dec_geometry(fv, fp, out.geometry, err);
    if (k == "on_exit") return on_exit = true, dec_on_exit(fv, fp, out.on_exit, err);
    if (k == "hostname") return get_str(fv, fp, out.hostname.emplace(), err);
    if (k == "stdio") {
      if (is_null(fv)) return out.stdio.reset(), true;
      return dec_stdio(fv, fp, out.stdio.emplace(), err);
    }
    if (k == "reconnect_ms")
      return get_ranged(fv, fp, 0, kReconnectMaxMs, "integer 0..3600000", out.reconnect_ms, err);
    if (k == "vm") return get_str(fv, fp, out.vm.emplace(), err);
    if (k == "generation")
      return get_ranged(fv, fp, 1, static_cast<std::int64_t>(kGenerationMax), kGeneration,
                        out.generation.emplace(), err);
    if (k == "network") {
      if (is_null(fv)) return out.network.reset(), true;
      return dec_network(fv, fp, out.network.emplace(), err);
    }
    if (k == "entropy") return get_entropy(fv, fp, out.entropy.emplace(), err);
    if (k == "realtime_ns")
      return get_ranged(fv, fp, 0, std::numeric_limits<std::int64_t>::max(), "integer 0..9223372036854775807",
                        out.realtime_ns.emplace(), err);
    return true;
  });
  if (!ok) return false;
  if (!exec) return missing(p, "exec", "object", err);
  if (!geometry) return missing(p, "geometry", "object", err);
  if (!on_exit) return missing(p, "on_exit", "object", err);
  return true;
}

// ---- the small messages ----

template <class Msg>
bool dec(od::document& doc, const Path& p, Msg&, Err& err)
  requires(std::is_empty_v<Msg>)
{
  return each_top_field(doc, p, err, [](std::string_view, od::value) { return true; });
}

/// `ready.resume`: every field required (it is ours; no earlier revision sends it).
bool dec_resume(od::value v, const Path& p, Resume& out, Err& err) {
  bool vm = false, gen = false, started = false, pending = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "vm") return vm = true, get_str(fv, fp, out.vm, err);
    if (k == "generation")
      return gen = true, get_ranged(fv, fp, 1, static_cast<std::int64_t>(kGenerationMax), kGeneration,
                                    out.generation, err);
    if (k == "started") return started = true, get_bool(fv, fp, out.started, err);
    if (k == "outcome_pending") return pending = true, get_bool(fv, fp, out.outcome_pending, err);
    return true;
  });
  if (!ok) return false;
  if (!vm) return missing(p, "vm", "string", err);
  if (!gen) return missing(p, "generation", kGeneration, err);
  if (!started) return missing(p, "started", "boolean", err);
  if (!pending) return missing(p, "outcome_pending", "boolean", err);
  return true;
}

bool dec(od::document& doc, const Path& p, Ready& out, Err& err) {
  bool ver = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "protocol_version") return ver = true, get_u32(fv, p / k, out.protocol_version, err);
        if (k == "resume") {
          if (is_null(fv)) return out.resume.reset(), true;
          return dec_resume(fv, p / k, out.resume.emplace(), err);
        }
        if (k == "features")
          return get_list(fv, p / k, 64, "array of strings", out.features.emplace(), err,
                          [&](od::value el, const Path& ep, std::string& f) { return get_str(el, ep, f, err); });
        return true;
      }))
    return false;
  return ver || missing(p, "protocol_version", kU32, err);
}

constexpr std::string_view kErrno = "integer 0..2147483647";
constexpr std::int64_t kI32Max = std::numeric_limits<std::int32_t>::max();

// Every v2 revision the reference shipped is accepted (docs/protocol.md "Revisions of v2"): a
// later one sends `started` without `pid` and the failures with `reason` alone, so only `reason`
// is required; a field that is present must still be well-formed.
bool dec(od::document& doc, const Path& p, MountFailed& out, Err& err) {
  bool reason = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "tag") return get_str(fv, p / k, out.tag.emplace(), err);
        if (k == "reason") return reason = true, get_str(fv, p / k, out.reason, err);
        if (k == "errno") return get_ranged(fv, p / k, 0, kI32Max, kErrno, out.err.emplace(), err);
        return true;
      }))
    return false;
  return reason || missing(p, "reason", "string", err);
}

bool dec(od::document& doc, const Path& p, Started& out, Err& err) {
  return each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
    if (k == "pid")
      return get_ranged(fv, p / k, 1, kI32Max, "integer 1..2147483647", out.pid.emplace(), err);
    return true;
  });
}

bool dec(od::document& doc, const Path& p, StartFailed& out, Err& err) {
  bool reason = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "reason") return reason = true, get_str(fv, p / k, out.reason, err);
        if (k == "errno") return get_ranged(fv, p / k, 0, kI32Max, kErrno, out.err.emplace(), err);
        if (k == "class") return get_enum(fv, p / k, kClasses, out.cls, err);
        return true;
      }))
    return false;
  return reason || missing(p, "reason", "string", err);
}

constexpr std::string_view kExitCode = "integer 0..255";
constexpr std::string_view kSignal = "integer 1..64";

bool dec(od::document& doc, const Path& p, WorkloadExited& out, Err& err) {
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "exit_code") return get_ranged(fv, p / k, 0, 255, kExitCode, out.exit_code.emplace(), err);
        if (k == "signal") return get_ranged(fv, p / k, 1, 64, kSignal, out.signal.emplace(), err);
        return true;
      }))
    return false;
  if (out.exit_code && out.signal)
    return err.expected(p, "exactly one of exit_code and signal", "both");
  if (!out.exit_code && !out.signal)
    return err.expected(p, "exactly one of exit_code and signal", "neither");
  return true;
}

bool dec(od::document& doc, const Path& p, ProtocolError& out, Err& err) {
  bool reason = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "reason") return reason = true, get_str(fv, p / k, out.reason, err);
        return true;
      }))
    return false;
  return reason || missing(p, "reason", "string", err);
}

bool dec_process(od::value v, const Path& p, ProcessInfo& out, Err& err) {
  bool pid = false, ppid = false, uid = false, cmd = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "pid") return pid = true, get_ranged(fv, fp, 1, kI32Max, "integer 1..2147483647", out.pid, err);
    if (k == "ppid") return ppid = true, get_ranged(fv, fp, 0, kI32Max, "integer 0..2147483647", out.ppid, err);
    if (k == "uid") return uid = true, get_ranged(fv, fp, 0, 4294967295LL, "integer 0..4294967295", out.uid, err);
    if (k == "cmd") return cmd = true, get_str(fv, fp, out.cmd, err);
    return true;
  });
  if (!ok) return false;
  if (!pid) return missing(p, "pid", "integer 1..2147483647", err);
  if (!ppid) return missing(p, "ppid", "integer 0..2147483647", err);
  if (!uid) return missing(p, "uid", "integer 0..4294967295", err);
  if (!cmd) return missing(p, "cmd", "string", err);
  return true;
}

bool dec(od::document& doc, const Path& p, Processes& out, Err& err) {
  bool list = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        const Path fp = p / k;
        if (k == "processes")
          return list = true, each_element(fv, fp, "array of objects", err, [&](std::size_t i, od::value el) {
                   if (i >= kProcessesMax)
                     return err.fail(fp, fmt::format("more than {} entries", kProcessesMax));
                   return dec_process(el, fp[i], out.processes.emplace_back(), err);
                 });
        if (k == "truncated")
          return get_ranged(fv, fp, 0, 4294967295LL, "integer 0..4294967295", out.truncated, err);
        if (k == "totals") {
          auto& t = out.totals.emplace();
          constexpr std::int64_t kMax = 9007199254740991LL;
          constexpr std::string_view kN = "integer 0..9007199254740991";
          return each_field(fv, fp, "object", err, [&](std::string_view tk, od::value tv) {
            if (tk == "mem_total") return get_ranged(tv, fp / tk, 0, kMax, kN, t.mem_total, err);
            if (tk == "mem_available") return get_ranged(tv, fp / tk, 0, kMax, kN, t.mem_available, err);
            if (tk == "cpu_user_usec") return get_ranged(tv, fp / tk, 0, kMax, kN, t.cpu_user_usec, err);
            if (tk == "cpu_system_usec") return get_ranged(tv, fp / tk, 0, kMax, kN, t.cpu_system_usec, err);
            return true;
          });
        }
        return true;
      }))
    return false;
  return list || missing(p, "processes", "array of objects", err);
}


constexpr std::string_view kProc = "integer 1..65535";

bool dec(od::document& doc, const Path& p, Kill& out, Err& err) {
  bool sig = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "signal") return sig = true, get_ranged(fv, p / k, 1, 64, kSignal, out.signal, err);
        if (k == "proc") return get_ranged(fv, p / k, 1, 65535, kProc, out.proc.emplace(), err);
        return true;
      }))
    return false;
  return sig || missing(p, "signal", kSignal, err);
}

constexpr std::array kContainerFsTypes{FsType::bind, FsType::tmpfs};

/// Whether `p` is an absolute path of 2..kContainerRootMax bytes with no empty, "." or ".."
/// component (a container mount's `dst`: it never leaves the container's root).
bool clean_abs_path(std::string_view p) {
  if (p.size() < 2 || p.size() > kContainerRootMax || p[0] != '/' || p.back() == '/') return false;
  std::size_t i = 1;
  while (i <= p.size()) {
    std::size_t j = p.find('/', i);
    if (j == std::string_view::npos) j = p.size();
    const std::string_view c = p.substr(i, j - i);
    if (c.empty() || c == "." || c == "..") return false;
    i = j + 1;
  }
  return p.find('\0') == std::string_view::npos;
}

/// exec.container.mounts[i] (ContainerMount): `dst` and `fs` required; `src` required for bind.
[[gnu::noinline]] bool dec_container_mount(od::value v, const Path& p, ContainerMount& out, Err& err) {
  bool dst = false, fs = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "dst") {
      dst = true;
      if (!get_str(fv, fp, out.dst, err)) return false;
      if (!clean_abs_path(out.dst))
        return err.expected(fp, "absolute path of 2..4000 bytes without '.' or '..'", excerpt_json(out.dst));
      return true;
    }
    if (k == "src") {
      if (!get_str(fv, fp, out.src, err)) return false;
      if (out.src.empty() || out.src.size() > kContainerRootMax || out.src[0] != '/' ||
          out.src.find('\0') != std::string::npos)
        return err.expected(fp, "absolute path of 1..4000 bytes", excerpt_json(out.src));
      return true;
    }
    if (k == "fs") return fs = true, get_enum(fv, fp, kContainerFsTypes, out.fs, err);
    if (k == "ro") return get_bool(fv, fp, out.ro, err);
    if (k == "nosuid") return get_bool(fv, fp, out.nosuid, err);
    if (k == "nodev") return get_bool(fv, fp, out.nodev, err);
    if (k == "noexec") return get_bool(fv, fp, out.noexec, err);
    if (k == "data") {
      if (!get_str(fv, fp, out.data, err)) return false;
      if (out.data.size() > 256 || out.data.find('\0') != std::string::npos)
        return err.expected(fp, "tmpfs options of at most 256 bytes", excerpt_json(out.data));
      return true;
    }
    if (k == "propagation") {
      if (!get_str(fv, fp, out.propagation, err)) return false;
      for (std::string_view n : {"private", "rprivate", "slave", "rslave", "shared", "rshared"})
        if (out.propagation == n) return true;
      return err.expected(fp, "private, rprivate, slave, rslave, shared or rshared", excerpt_json(out.propagation));
    }
    return true;
  });
  if (!ok) return false;
  if (!dst) return missing(p, "dst", "absolute path", err);
  if (!fs) return missing(p, "fs", "bind or tmpfs", err);
  if (out.fs == FsType::bind && out.src.empty()) return missing(p, "src", "absolute path", err);
  return true;
}

/// exec.container.resources: each field an integer in its cgroup file's range (ContainerResources).
bool dec_resources(od::value v, const Path& p, ContainerResources& out, Err& err) {
  constexpr auto kMax = static_cast<std::int64_t>(kResourceMax);
  constexpr auto kPeriodMin = static_cast<std::int64_t>(kCpuPeriodMin);
  constexpr auto kPeriodMax = static_cast<std::int64_t>(kCpuPeriodMax);
  constexpr std::string_view kN = "integer 0..9007199254740991";
  return each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "memory_max") return get_ranged(fv, fp, 0, kMax, kN, out.memory_max.emplace(), err);
    if (k == "pids_max") return get_ranged(fv, fp, 0, kMax, kN, out.pids_max.emplace(), err);
    if (k == "cpu_quota") {
      if (!get_ranged(fv, fp, 0, kMax, kN, out.cpu_quota.emplace(), err)) return false;
      if (*out.cpu_quota != 0 && *out.cpu_quota < kCpuQuotaMin)
        return err.expected(fp, "0 (no limit) or 1000..9007199254740991 (µs)", fmt::format("{}", *out.cpu_quota));
      return true;
    }
    if (k == "cpu_period")
      return get_ranged(fv, fp, kPeriodMin, kPeriodMax, "integer 1000..1000000 (µs)", out.cpu_period.emplace(), err);
    if (k == "cpu_weight") return get_ranged(fv, fp, 1, kCpuWeightMax, "integer 1..10000", out.cpu_weight.emplace(), err);
    return true;
  });
}

/// exec.container: `root` required, an absolute path of 2..kContainerRootMax bytes other than "/";
/// `hostname` a DNS name; `readonly` a boolean.
[[gnu::noinline]] bool dec_container(od::value v, const Path& p, Container& out, Err& err) {
  bool root = false;
  bool ok = each_field(v, p, "object", err, [&](std::string_view k, od::value fv) {
    const Path fp = p / k;
    if (k == "root") {
      root = true;
      if (!get_str(fv, fp, out.root, err)) return false;
      if (out.root.size() < 2 || out.root.size() > kContainerRootMax || out.root[0] != '/')
        return err.expected(fp, "absolute path of 2..4000 bytes other than \"/\"", excerpt_json(out.root));
      return true;
    }
    if (k == "hostname") return get_dns_name(fv, fp, out.hostname.emplace(), err);
    if (k == "readonly") return get_bool(fv, fp, out.readonly, err);
    if (k == "mounts")
      return each_element(fv, fp, "array of objects", err, [&](std::size_t i, od::value el) {
        if (i >= kContainerMountsMax) return err.fail(fp, fmt::format("more than {} mounts", kContainerMountsMax));
        return dec_container_mount(el, fp[i], out.mounts.emplace_back(), err);
      });
    if (k == "resources") {
      if (is_null(fv)) return out.resources.reset(), true;
      return dec_resources(fv, fp, out.resources.emplace(), err);
    }
    return true;
  });
  if (!ok) return false;
  return root || missing(p, "root", "absolute path", err);
}

bool dec(od::document& doc, const Path& p, ExecProcess& out, Err& err) {
  bool proc = false, exec = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        const Path fp = p / k;
        if (k == "proc") return proc = true, get_ranged(fv, fp, 1, 65535, kProc, out.proc, err);
        if (k == "exec") return exec = true, dec_exec(fv, fp, out.exec, err);
        if (k == "stdio") {
          if (is_null(fv)) return out.stdio.reset(), true;
          return dec_stdio(fv, fp, out.stdio.emplace(), err);
        }
        if (k == "container") {
          if (is_null(fv)) return out.container.reset(), true;
          return dec_container(fv, fp, out.container.emplace(), err);
        }
        if (k == "in") return get_ranged(fv, fp, 1, 65535, kProc, out.in.emplace(), err);
        return true;
      }))
    return false;
  if (!proc) return missing(p, "proc", kProc, err);
  if (out.container && out.in)
    return err.fail(p / "in", "set with exec.container: a process is a new container or joins one, not both");
  return exec || missing(p, "exec", "object", err);
}

bool dec(od::document& doc, const Path& p, ExecStarted& out, Err& err) {
  bool proc = false, pid = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "proc") return proc = true, get_ranged(fv, p / k, 1, 65535, kProc, out.proc, err);
        if (k == "pid") return pid = true, get_ranged(fv, p / k, 1, kI32Max, "integer 1..2147483647", out.pid, err);
        return true;
      }))
    return false;
  if (!proc) return missing(p, "proc", kProc, err);
  return pid || missing(p, "pid", "integer 1..2147483647", err);
}

bool dec(od::document& doc, const Path& p, ExecFailed& out, Err& err) {
  bool proc = false, reason = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "proc") return proc = true, get_ranged(fv, p / k, 1, 65535, kProc, out.proc, err);
        if (k == "reason") return reason = true, get_str(fv, p / k, out.reason, err);
        if (k == "errno") return get_ranged(fv, p / k, 0, kI32Max, kErrno, out.err.emplace(), err);
        if (k == "class") return get_enum(fv, p / k, kClasses, out.cls, err);
        return true;
      }))
    return false;
  if (!proc) return missing(p, "proc", kProc, err);
  return reason || missing(p, "reason", "string", err);
}

bool dec(od::document& doc, const Path& p, ExecExited& out, Err& err) {
  bool proc = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "proc") return proc = true, get_ranged(fv, p / k, 1, 65535, kProc, out.proc, err);
        if (k == "exit_code") return get_ranged(fv, p / k, 0, 255, kExitCode, out.exit_code.emplace(), err);
        if (k == "signal") return get_ranged(fv, p / k, 1, 64, kSignal, out.signal.emplace(), err);
        return true;
      }))
    return false;
  if (!proc) return missing(p, "proc", kProc, err);
  if (out.exit_code && out.signal)
    return err.expected(p, "exactly one of exit_code and signal", "both");
  if (!out.exit_code && !out.signal)
    return err.expected(p, "exactly one of exit_code and signal", "neither");
  return true;
}

bool dec(od::document& doc, const Path& p, NetworkFailed& out, Err& err) {
  bool iface = false, step = false, reason = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "interface") return iface = true, get_str(fv, p / k, out.interface, err);
        if (k == "step") return step = true, get_str(fv, p / k, out.step, err);
        if (k == "reason") return reason = true, get_str(fv, p / k, out.reason, err);
        if (k == "errno") return get_ranged(fv, p / k, 0, kI32Max, kErrno, out.err, err);
        return true;
      }))
    return false;
  if (!iface) return missing(p, "interface", "string", err);
  if (!step) return missing(p, "step", "string", err);
  return reason || missing(p, "reason", "string", err);
}

constexpr std::array<Stream, 2> kOutputStreams = {Stream::out, Stream::err};
constexpr std::string_view kBytes53 = "integer 0..9007199254740991";

bool dec(od::document& doc, const Path& p, OutputEnd& out, Err& err) {
  bool proc = false, stream = false, sent = false, unsent = false;
  const auto max = static_cast<std::int64_t>(kGenerationMax);  // 2^53-1: JSON's exact integers
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "proc") return proc = true, get_ranged(fv, p / k, 0, 65535, "integer 0..65535", out.proc, err);
        if (k == "stream") return stream = true, get_enum(fv, p / k, kOutputStreams, out.stream, err);
        if (k == "sent") return sent = true, get_ranged(fv, p / k, 0, max, kBytes53, out.sent, err);
        if (k == "unsent") return unsent = true, get_ranged(fv, p / k, 0, max, kBytes53, out.unsent, err);
        return true;
      }))
    return false;
  if (!proc) return missing(p, "proc", "integer 0..65535", err);
  if (!stream) return missing(p, "stream", "one of \"stdout\", \"stderr\"", err);
  if (!sent) return missing(p, "sent", kBytes53, err);
  return unsent || missing(p, "unsent", kBytes53, err);
}

bool dec(od::document& doc, const Path& p, ContainerResourcesRequest& out, Err& err) {
  bool proc = false;
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        if (k == "proc") return proc = true, get_ranged(fv, p / k, 1, 65535, kProc, out.proc, err);
        if (k == "update") {
          if (is_null(fv)) return out.update.reset(), true;
          return dec_resources(fv, p / k, out.update.emplace(), err);
        }
        return true;
      }))
    return false;
  return proc || missing(p, "proc", kProc, err);
}

bool dec(od::document& doc, const Path& p, ContainerResourcesReply& out, Err& err) {
  bool proc = false;
  const auto max = static_cast<std::int64_t>(kResourceMax);
  if (!each_top_field(doc, p, err, [&](std::string_view k, od::value fv) {
        const Path fp = p / k;
        if (k == "proc") return proc = true, get_ranged(fv, fp, 1, 65535, kProc, out.proc, err);
        if (k == "error") return get_str(fv, fp, out.error.emplace(), err);
        if (k == "stats") {
          CgroupStats& t = out.stats.emplace();
          std::pair<std::string_view, std::uint64_t*> f[] = {
              {"memory_current", &t.memory_current}, {"memory_max", &t.memory_max}, {"memory_anon", &t.memory_anon},
              {"memory_file", &t.memory_file}, {"oom_kills", &t.oom_kills}, {"cpu_usage_usec", &t.cpu_usage_usec},
              {"cpu_user_usec", &t.cpu_user_usec}, {"cpu_system_usec", &t.cpu_system_usec},
              {"cpu_nr_periods", &t.cpu_nr_periods}, {"cpu_nr_throttled", &t.cpu_nr_throttled},
              {"cpu_throttled_usec", &t.cpu_throttled_usec}, {"pids_current", &t.pids_current},
              {"pids_max", &t.pids_max}};
          return each_field(fv, fp, "object", err, [&](std::string_view tk, od::value tv) {
            for (auto& [name, at] : f)
              if (tk == name) return get_ranged(tv, fp / tk, 0, max, kBytes53, *at, err);
            return true;
          });
        }
        return true;
      }))
    return false;
  return proc || missing(p, "proc", kProc, err);
}

// ---- the three passes ----

constexpr std::string_view kTag(const Ready*) { return "ready"; }
constexpr std::string_view kTag(const Mounted*) { return "mounted"; }
constexpr std::string_view kTag(const MountFailed*) { return "mount_failed"; }
constexpr std::string_view kTag(const Started*) { return "started"; }
constexpr std::string_view kTag(const StartFailed*) { return "start_failed"; }
constexpr std::string_view kTag(const WorkloadExited*) { return "workload_exited"; }
constexpr std::string_view kTag(const ProtocolError*) { return "protocol_error"; }
constexpr std::string_view kTag(const Boot*) { return "boot"; }
constexpr std::string_view kTag(const Stop*) { return "stop"; }
constexpr std::string_view kTag(const Shutdown*) { return "shutdown"; }
constexpr std::string_view kTag(const Kill*) { return "kill"; }
constexpr std::string_view kTag(const Processes*) { return "processes"; }
constexpr std::string_view kTag(const ListProcesses*) { return "list_processes"; }
constexpr std::string_view kTag(const ExecProcess*) { return "exec"; }
constexpr std::string_view kTag(const ExecStarted*) { return "exec_started"; }
constexpr std::string_view kTag(const ExecFailed*) { return "exec_failed"; }
constexpr std::string_view kTag(const ExecExited*) { return "exec_exited"; }
constexpr std::string_view kTag(const OutputEnd*) { return "output_end"; }
constexpr std::string_view kTag(const NetworkFailed*) { return "network_failed"; }
constexpr std::string_view kTag(const ContainerResourcesRequest*) { return "container_resources"; }
constexpr std::string_view kTag(const ContainerResourcesReply*) { return "container_resources_reply"; }

template <class T>
constexpr std::string_view tag_of = kTag(static_cast<const T*>(nullptr));

/// Index of the alternative of Variant whose wire tag is `type`, or N if none.
template <class Variant, std::size_t I = 0>
std::size_t index_of(std::string_view type) {
  if constexpr (I == std::variant_size_v<Variant>) {
    return I;
  } else {
    if (tag_of<std::variant_alternative_t<I, Variant>> == type) return I;
    return index_of<Variant, I + 1>(type);
  }
}

template <class Variant, std::size_t I = 0>
bool dec_alt(std::size_t idx, od::document& doc, const Path& p, Variant& out, Err& err) {
  if constexpr (I == std::variant_size_v<Variant>) {
    return false;
  } else {
    if (idx == I) return dec(doc, p, out.template emplace<I>(), err);
    return dec_alt<Variant, I + 1>(idx, doc, p, out, err);
  }
}

/// Decodes one line into Variant's alternatives; the result is Decoded (GuestDecoded/HostDecoded).
/// `env` (guest lines only): where the line's envelope goes.
template <class Variant, class Decoded>
Decoded decode_line(std::string_view line, GuestEnvelope* env = nullptr) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (trim(line).empty()) return DecodeError{"line: empty (expected a JSON object)"};

  simdjson::padded_string buf(line);
  od::parser parser;
  od::document doc;
  const Path msg{nullptr, "message"};
  Err err;
  // Each pass starts from a fresh iteration: document::rewind() is unusable after an error has
  // abandoned the iterator, and stage 1 over at most one line is cheap.
  auto start = [&]() -> error_code { return parser.iterate(buf).get(doc); };
  if (auto e = start()) {
    err.json(msg, e);
    return DecodeError{std::move(err.reason)};
  }

  // Pass A: find `type` (first occurrence; a duplicate is refused by pass B).
  std::string type;
  bool have_type = false, type_is_string = false;
  {
    od::object o;
    if (doc.get_object().get(o) == simdjson::SUCCESS) {
      for (auto fr : o) {
        od::field f;
        std::string_view k;
        if (std::move(fr).get(f) || f.unescaped_key().get(k)) break;
        if (k != "type") continue;
        have_type = true;
        std::string_view s;
        if (f.value().get_string().get(s) == simdjson::SUCCESS) {
          type.assign(s);
          type_is_string = true;
        }
        break;
      }
    }
  }
  const std::size_t idx = type_is_string ? index_of<Variant>(type) : std::variant_size_v<Variant>;
  const bool known = idx < std::variant_size_v<Variant>;
  const Path root{nullptr, known ? std::string_view(type) : std::string_view("message")};

  // Pass B: the line is exactly one well-formed JSON object.
  if (auto e = start()) {
    err.json(root, e);
    return DecodeError{std::move(err.reason)};
  }
  {
    od::json_type t{};
    if (auto e = doc.type().get(t)) {
      err.json(root, e);
      return DecodeError{std::move(err.reason)};
    }
    if (t != od::json_type::object) {
      err.expected(root, "a JSON object", type_word(t));
      return DecodeError{std::move(err.reason)};
    }
    od::object o;
    if (auto e = doc.get_object().get(o)) {
      err.json(root, e);
      return DecodeError{std::move(err.reason)};
    }
    if (!validate_object(o, root, 1, err)) return DecodeError{std::move(err.reason)};
    const char* rest = nullptr;
    if (doc.current_location().get(rest) == simdjson::SUCCESS) {
      err.fail(root, fmt::format("unexpected content after the JSON object at byte {}",
                                 rest - buf.data()));
      return DecodeError{std::move(err.reason)};
    }
  }

  if (!have_type) return DecodeError{"type: missing (expected string)"};
  if (!type_is_string) {
    // Re-read the value to describe it.
    od::value tv;
    std::string got = "non-string";
    if (start() == simdjson::SUCCESS && doc.find_field_unordered("type").get(tv) == simdjson::SUCCESS)
      got = describe(tv);
    return DecodeError{fmt::format("type: expected string, got {}", got)};
  }
  if (type.find('\0') != std::string::npos)
    return DecodeError{"type: expected string without NUL bytes, got NUL"};
  if (!known) return UnknownMessage{std::move(type)};

  // Pass C: the contract.
  Variant out;
  if (auto e = start()) {
    err.json(root, e);
    return DecodeError{std::move(err.reason)};
  }
  if (!dec_alt(idx, doc, root, out, err)) return DecodeError{std::move(err.reason)};
  if (env) {
    // The envelope: a top-level `generation` beside the message's own fields (unique: pass B).
    od::value gv;
    if (auto e = start()) {
      err.json(root, e);
      return DecodeError{std::move(err.reason)};
    }
    if (doc.find_field_unordered("generation").get(gv) == simdjson::SUCCESS &&
        !get_ranged(gv, root / "generation", 1, static_cast<std::int64_t>(kGenerationMax), kGeneration,
                    env->generation.emplace(), err))
      return DecodeError{std::move(err.reason)};
  }
  return out;
}

}  // namespace

std::string ip_text(const IpAddr& a) {
  // RFC 5952's text, as musl's and glibc's inet_ntop(3) write it, without their snprintf (musl's
  // printf core was ~9 KiB of the init for this one caller): lower-case hex without leading
  // zeros, the longest run of 2+ zero groups (the first of equals) as "::", ::ffff:0:0/96
  // (IPv4-mapped) in mixed notation. glibc also writes ::/96 (IPv4-compatible, deprecated by RFC
  // 4291) mixed; this does not, as musl does not.
  const auto& b = a.bytes;
  if (a.family != 6) return fmt::format("{}.{}.{}.{}", b[0], b[1], b[2], b[3]);
  std::array<unsigned, 8> w{};
  for (std::size_t i = 0; i < 8; ++i) w[i] = b[2 * i] << 8 | b[2 * i + 1];
  if (w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == 0 && w[4] == 0 && w[5] == 0xffff)
    return fmt::format("::ffff:{}.{}.{}.{}", b[12], b[13], b[14], b[15]);
  std::size_t best = 8, best_len = 1;
  for (std::size_t i = 0; i < 8;) {
    std::size_t j = i;
    while (j < 8 && w[j] == 0) ++j;
    if (j - i > best_len) best = i, best_len = j - i;
    i = j == i ? i + 1 : j;
  }
  std::string out;
  for (std::size_t i = 0; i < 8; ++i) {
    if (i == best) {
      out += "::";
      i += best_len - 1;
      continue;
    }
    if (i && i != best + best_len) out += ':';
    out += fmt::format("{:x}", w[i]);
  }
  return out;
}
std::string prefix_text(const IpPrefix& p) { return fmt::format("{}/{}", ip_text(p.addr), p.len); }
std::string mac_text(const MacAddr& m) {
  return fmt::format("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5]);
}

GuestDecoded decode_guest(std::string_view line) {
  return decode_line<GuestMessage, GuestDecoded>(line);
}
GuestDecoded decode_guest(std::string_view line, GuestEnvelope& envelope) {
  envelope = {};
  GuestDecoded d = decode_line<GuestMessage, GuestDecoded>(line, &envelope);
  if (!std::holds_alternative<GuestMessage>(d)) envelope = {};
  return d;
}
HostDecoded decode_host(std::string_view line) { return decode_line<HostMessage, HostDecoded>(line); }

std::string encode(const GuestMessage& m) { return encode_any(m, false); }
std::string encode(const HostMessage& m) { return encode_any(m, false); }
std::string encode_line(const GuestMessage& m) { return encode_any(m, true); }
std::string encode_line(const HostMessage& m) { return encode_any(m, true); }
std::string encode_line(const GuestMessage& m, const GuestEnvelope& envelope) {
  return encode_any(m, true, &envelope);
}

namespace {
template <class Msg, class Decoded>
base::StatusOf<DecodeError> validate_any(const Msg& m, Decoded (*decode)(std::string_view)) {
  Decoded d = decode(encode(m));
  if (auto* e = std::get_if<DecodeError>(&d)) return std::move(*e);
  if (auto* got = std::get_if<Msg>(&d); got && *got == m) return base::Ok{};
  return DecodeError{fmt::format("{}: a string is not valid UTF-8", type_name(m))};
}
}  // namespace

base::StatusOf<DecodeError> validate(const GuestMessage& m) { return validate_any(m, &decode_guest); }
base::StatusOf<DecodeError> validate(const HostMessage& m) { return validate_any(m, &decode_host); }

std::string_view type_name(const GuestMessage& m) {
  return std::visit([](const auto& x) { return tag_of<std::decay_t<decltype(x)>>; }, m);
}
std::string_view type_name(const HostMessage& m) {
  return std::visit([](const auto& x) { return tag_of<std::decay_t<decltype(x)>>; }, m);
}

std::string json_quote(std::string_view s) {
  Buf b;
  put_string(b, s);
  return fmt::to_string(b);
}

std::optional<IpAddr> ip_from_text(std::string_view text) {
  IpAddr a;
  if (!parse_ip(text, a)) return std::nullopt;
  return a;
}

bool valid_dns_name(std::string_view s) {
  bool ok = !s.empty() && s.size() <= 253;
  for (char c : s)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                c == '.' || c == '_');
  return ok;
}

bool valid_dns_option(std::string_view s) {
  bool ok = !s.empty() && s.size() <= 64;
  for (char c : s) ok = ok && c > ' ' && c < 0x7f;
  return ok;
}

}  // namespace nes::proto
