#include "host/monitor/control.hpp"

#include <charconv>
#include <fmt/format.h>
#include <vector>

#include "host/lib/escape.hpp"
#include "protocol/codec.hpp"

namespace nes::monitor::control {

namespace {

constexpr std::string_view kWaitingText = "ok waiting for the workload to start";
constexpr std::size_t kQuoteMax = 64;  // bytes of a peer's text an error message quotes

/// `s` quoted for an error message: at most kQuoteMax bytes, escaped (one printable line).
std::string quoted(std::string_view s) {
  const std::string e = host::escape_text(s.substr(0, kQuoteMax));
  return s.size() > kQuoteMax ? fmt::format("'{}' ({} bytes)", e, s.size()) : fmt::format("'{}'", e);
}

/// `s` as free text of one line: at most `cap` bytes, each '\n' a space.
std::string one_line(std::string_view s, std::size_t cap) {
  std::string t(s.substr(0, cap));
  for (char& c : t)
    if (c == '\n') c = ' ';
  return t;
}

/// The words of `s` split at each single space, at most `max` + 1 of them (the last holds the
/// rest): enough to tell "too many" without a vector as long as the line.
std::vector<std::string_view> words(std::string_view s, std::size_t max) {
  std::vector<std::string_view> w;
  for (;;) {
    auto sp = s.find(' ');
    if (sp == std::string_view::npos || w.size() == max) {
      w.push_back(s);
      return w;
    }
    w.push_back(s.substr(0, sp));
    s.remove_prefix(sp + 1);
  }
}

/// A decimal integer lo..hi (digits only). Errors: "WHAT: FIELD: expected an integer lo..hi, got 'x'".
host::Result<std::int64_t> number(std::string_view what, std::string_view field, std::string_view v, std::int64_t lo,
                                  std::int64_t hi) {
  std::int64_t x = 0;
  const bool digits = !v.empty() && v.find_first_not_of("0123456789") == std::string_view::npos;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (!digits || ec != std::errc() || p != v.data() + v.size() || x < lo || x > hi)
    return host::Error{fmt::format("{}: {}: expected an integer {}..{}, got {}", what, field, lo, hi, quoted(v))};
  return x;
}

/// The line-level checks every line passes first.
host::Status check_line(std::string_view kind, std::string_view line, std::size_t max) {
  if (line.empty()) return host::Error{fmt::format("{}: empty", kind)};
  if (line.size() > max) return host::Error{fmt::format("{}: over {} bytes ({})", kind, max, line.size())};
  if (line.find('\n') != std::string_view::npos) return host::Error{fmt::format("{}: contains a newline", kind)};
  return host::Ok{};
}

host::Result<Request> parse_kill(std::string_view args) {
  auto w = words(args, 2);
  if (w.size() > 2) return host::Error{"kill: expected SIGNAL [PROC]"};
  auto sig = number("kill", "SIGNAL", w[0], 1, 64);
  if (!sig) return sig.error();
  Kill k{static_cast<int>(*sig), std::nullopt};
  if (w.size() == 2) {
    auto proc = number("kill", "PROC", w[1], 1, 0xffff);
    if (!proc) return proc.error();
    k.proc = static_cast<std::uint16_t>(*proc);
  }
  return Request{k};
}

host::Result<Request> parse_wait(std::string_view args) {
  auto w = words(args, 2);
  if (w.size() != 1) return host::Error{"wait: expected PROC"};
  auto proc = number("wait", "PROC", w[0], 1, 0xffff);
  if (!proc) return proc.error();
  return Request{Wait{static_cast<std::uint16_t>(*proc)}};
}

host::Result<Request> parse_resize(std::string_view args) {
  auto w = words(args, 3);
  if (w.size() < 2 || w.size() > 3) return host::Error{"resize: expected ROWS COLS [PROC], each 1..65535"};
  Resize r;
  auto rows = number("resize", "ROWS", w[0], 1, 0xffff);
  if (!rows) return rows.error();
  auto cols = number("resize", "COLS", w[1], 1, 0xffff);
  if (!cols) return cols.error();
  r.rows = static_cast<std::uint16_t>(*rows);
  r.cols = static_cast<std::uint16_t>(*cols);
  if (w.size() == 3) {
    auto proc = number("resize", "PROC", w[2], 1, 0xffff);
    if (!proc) return proc.error();
    r.proc = static_cast<std::uint16_t>(*proc);
  }
  return Request{r};
}

host::Result<Request> parse_exec(std::string_view args) {
  const auto sp = args.find(' ');
  if (sp == std::string_view::npos) return host::Error{"exec: expected FLAGS JSON"};
  const std::string_view flags = args.substr(0, sp);
  Exec x;
  auto bad_flags = [&] {
    return host::Error{fmt::format("exec: FLAGS: expected '-' or letters of 'ecu' (each at most once), got {}",
                                   quoted(flags))};
  };
  if (flags != "-") {
    if (flags.empty()) return bad_flags();
    for (char c : flags) {
      bool* f = c == 'e' ? &x.env : c == 'c' ? &x.cwd : c == 'u' ? &x.user : nullptr;
      if (!f || *f) return bad_flags();
      *f = true;
    }
  }
  auto d = proto::decode_host(args.substr(sp + 1));
  if (auto* e = std::get_if<proto::DecodeError>(&d)) return host::Error{"exec: JSON: " + e->reason};
  auto* m = std::get_if<proto::HostMessage>(&d);
  auto* p = m ? std::get_if<proto::ExecProcess>(m) : nullptr;
  if (!p) return host::Error{"exec: JSON: expected an `exec` message"};
  x.process = std::move(*p);
  Request r{std::move(x)};
  // As written back (defaults spelled out): what a peer re-sending it must still fit.
  if (auto n = encode(r).size(); n > kRequestMax)
    return host::Error{fmt::format("exec: JSON: over {} bytes as encoded ({})", kRequestMax, n)};
  return r;
}

host::Result<Reply> parse_started(std::string_view args) {
  auto w = words(args, 2);
  if (w.size() != 2) return host::Error{"started: expected PID PROC"};
  auto pid = number("started", "PID", w[0], 1, 2147483647);
  if (!pid) return pid.error();
  auto proc = number("started", "PROC", w[1], 1, 0xffff);
  if (!proc) return proc.error();
  return Reply{Started{static_cast<std::int32_t>(*pid), static_cast<std::uint16_t>(*proc)}};
}

host::Result<Reply> parse_exited(std::string_view args) {
  const auto sp = args.find(' ');
  auto status = number("exit", "STATUS", args.substr(0, sp), 0, 255);
  if (!status) return status.error();
  Exited x{static_cast<int>(*status), {}};
  if (sp != std::string_view::npos) {
    const std::string_view why = args.substr(sp + 1);
    if (why.size() > kExitWhyMax)
      return host::Error{fmt::format("exit: WHY: over {} bytes ({})", kExitWhyMax, why.size())};
    x.why = std::string(why);
  }
  return Reply{std::move(x)};
}

host::Result<Reply> parse_processes(std::string_view json) {
  auto d = proto::decode_guest(json);
  if (auto* e = std::get_if<proto::DecodeError>(&d)) return host::Error{"ps: JSON: " + e->reason};
  auto* m = std::get_if<proto::GuestMessage>(&d);
  if (auto* c = m ? std::get_if<proto::ContainerResourcesReply>(m) : nullptr) return Reply{ResourcesReply{std::move(*c)}};
  auto* p = m ? std::get_if<proto::Processes>(m) : nullptr;
  if (!p) return host::Error{"ps: JSON: expected a `processes` message"};
  // As written back (defaults spelled out): what a peer re-sending it must still fit.
  if (auto n = 3 + proto::encode(proto::GuestMessage{*p}).size(); n > kReplyMax)
    return host::Error{fmt::format("ps: JSON: over {} bytes as encoded ({})", kReplyMax, n)};
  return Reply{ProcessList{std::move(*p)}};
}

}  // namespace

bool is_final(const Reply& r) { return !std::holds_alternative<Waiting>(r) && !std::holds_alternative<Started>(r); }

std::string encode(const Request& r) {
  struct V {
    std::string operator()(const Stop&) const { return "stop"; }
    std::string operator()(const Kill& k) const {
      return k.proc ? fmt::format("kill {} {}", k.signal, *k.proc) : fmt::format("kill {}", k.signal);
    }
    std::string operator()(const Resize& z) const {
      return z.proc ? fmt::format("resize {} {} {}", z.rows, z.cols, *z.proc)
                    : fmt::format("resize {} {}", z.rows, z.cols);
    }
    std::string operator()(const Ps&) const { return "ps"; }
    std::string operator()(const Pause&) const { return "pause"; }
    std::string operator()(const Resume&) const { return "resume"; }
    std::string operator()(const Wait& w) const { return fmt::format("wait {}", w.proc); }
    std::string operator()(const CloseStdin&) const { return "close-stdin"; }
    std::string operator()(const Resources& r) const {
      return "resources " + proto::encode(proto::HostMessage{r.request});
    }
    std::string operator()(const Exec& x) const {
      char flags[3];
      std::size_t n = 0;
      if (x.env) flags[n++] = 'e';
      if (x.cwd) flags[n++] = 'c';
      if (x.user) flags[n++] = 'u';
      if (n == 0) flags[n++] = '-';
      return fmt::format("exec {} {}", std::string_view(flags, n), proto::encode(proto::HostMessage{x.process}));
    }
  };
  return std::visit(V{}, r);
}

std::string encode(const Targeted& t) {
  std::string line = t.seq ? fmt::format("seq {} {}", *t.seq, encode(t.request)) : encode(t.request);
  return t.generation ? fmt::format("generation {} {}", *t.generation, line) : line;
}

std::string encode(const Reply& r) {
  struct V {
    std::string operator()(const Ok&) const { return "ok"; }
    std::string operator()(const Error& e) const { return "error: " + one_line(e.message, kErrorMessageMax); }
    std::string operator()(const Waiting&) const { return std::string(kWaitingText); }
    std::string operator()(const Started& s) const { return fmt::format("ok started {} {}", s.pid, s.proc); }
    std::string operator()(const Exited& x) const {
      return x.why.empty() ? fmt::format("ok exit {}", x.status)
                           : fmt::format("ok exit {} {}", x.status, one_line(x.why, kExitWhyMax));
    }
    std::string operator()(const ProcessList& p) const {
      return "ok " + proto::encode(proto::GuestMessage{p.processes});
    }
    std::string operator()(const ResourcesReply& r) const { return "ok " + proto::encode(proto::GuestMessage{r.reply}); }
  };
  return std::visit(V{}, r);
}

host::Result<Request> parse_request(std::string_view line) {
  if (auto c = check_line("request", line, kRequestMax); !c) return c.error();
  const auto sp = line.find(' ');
  const std::string_view verb = line.substr(0, sp);
  const std::string_view args = sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
  const bool bare = sp == std::string_view::npos;
  if (verb == "stop" || verb == "ps" || verb == "pause" || verb == "resume" || verb == "close-stdin") {
    if (!bare) return host::Error{fmt::format("{}: expected no arguments, got {}", verb, quoted(args))};
    if (verb == "stop") return Request{Stop{}};
    if (verb == "close-stdin") return Request{CloseStdin{}};
    if (verb == "pause") return Request{Pause{}};
    if (verb == "resume") return Request{Resume{}};
    return Request{Ps{}};
  }
  if (verb == "kill") return bare ? host::Error{"kill: expected SIGNAL [PROC]"} : parse_kill(args);
  if (verb == "resize")
    return bare ? host::Error{"resize: expected ROWS COLS [PROC], each 1..65535"} : parse_resize(args);
  if (verb == "exec") return bare ? host::Error{"exec: expected FLAGS JSON"} : parse_exec(args);
  if (verb == "wait") return bare ? host::Error{"wait: expected PROC"} : parse_wait(args);
  if (verb == "resources") {
    if (bare) return host::Error{"resources: expected JSON (a container_resources message)"};
    auto d = proto::decode_host(args);
    if (auto* e = std::get_if<proto::DecodeError>(&d)) return host::Error{"resources: JSON: " + e->reason};
    auto* m = std::get_if<proto::HostMessage>(&d);
    auto* r = m ? std::get_if<proto::ContainerResourcesRequest>(m) : nullptr;
    if (!r) return host::Error{"resources: JSON: expected a `container_resources` message"};
    return Request{Resources{std::move(*r)}};
  }
  return host::Error{fmt::format("unknown request {}", quoted(line))};
}

namespace {
/// `PREFIX N REST`: N (1..max) and REST; nullopt N when `line` does not start with PREFIX.
host::Result<std::pair<std::optional<std::uint64_t>, std::string_view>> strip_number(std::string_view line,
                                                                                      std::string_view name,
                                                                                      std::string_view field,
                                                                                      std::uint64_t max) {
  const std::string prefix = std::string(name) + " ";
  if (!line.starts_with(prefix)) return std::pair{std::optional<std::uint64_t>{}, line};
  line.remove_prefix(prefix.size());
  const auto sp = line.find(' ');
  auto n = number(name, field, line.substr(0, sp), 1, static_cast<std::int64_t>(max));
  if (!n) return n.error();
  if (sp == std::string_view::npos) return host::Error{fmt::format("{}: expected {} REQUEST", name, field)};
  return std::pair{std::optional<std::uint64_t>{static_cast<std::uint64_t>(*n)}, line.substr(sp + 1)};
}
}  // namespace

host::Result<Targeted> parse_targeted(std::string_view line) {
  if (auto c = check_line("request", line, kRequestMax); !c) return c.error();
  auto g = strip_number(line, "generation", "G", kGenerationMax);
  if (!g) return g.error();
  auto s = strip_number(g->second, "seq", "S", kSeqMax);
  if (!s) return s.error();
  auto r = parse_request(s->second);
  if (!r) return r.error();
  Targeted t{g->first, std::move(*r), s->first};
  if (!t.generation && !t.seq) return t;  // the bare request, as before the prefixes
  // As written back (an exec's defaults spelled out): what a peer re-sending it must still fit.
  if (auto n = encode(t).size(); n > kRequestMax)
    return host::Error{fmt::format("request: over {} bytes as encoded ({})", kRequestMax, n)};
  return t;
}

host::Result<Reply> parse_reply(std::string_view line) {
  if (auto c = check_line("reply", line, kReplyMax); !c) return c.error();
  if (line == "ok") return Reply{Ok{}};
  if (line.starts_with("error: ")) {
    const std::string_view m = line.substr(7);
    if (m.size() > kErrorMessageMax)
      return host::Error{fmt::format("error: MESSAGE: over {} bytes ({})", kErrorMessageMax, m.size())};
    return Reply{Error{std::string(m)}};
  }
  if (line == "ok waiting" || line.starts_with("ok waiting ")) return Reply{Waiting{}};
  if (line == "ok started") return host::Error{"started: expected PID PROC"};
  if (line.starts_with("ok started ")) return parse_started(line.substr(11));
  if (line == "ok exit") return host::Error{"exit: expected STATUS [WHY]"};
  if (line.starts_with("ok exit ")) return parse_exited(line.substr(8));
  if (line.starts_with("ok {")) return parse_processes(line.substr(3));
  return host::Error{fmt::format("unknown reply {}", quoted(line))};
}

namespace {
template <class T>
host::Status round_trips(const T& v, const host::Result<T>& back, std::string_view what) {
  if (!back) return back.error();
  if (!(*back == v))
    return host::Error{
        fmt::format("{}: a field cannot be written as it is (over its bound, a newline, or not UTF-8)", what)};
  return host::Ok{};
}
}  // namespace

host::Status validate(const Request& r) { return round_trips(r, parse_request(encode(r)), "request"); }
host::Status validate(const Reply& r) { return round_trips(r, parse_reply(encode(r)), "reply"); }
host::Status validate(const Targeted& t) { return round_trips(t, parse_targeted(encode(t)), "request"); }

}  // namespace nes::monitor::control
