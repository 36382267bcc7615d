// The task's exec journal (host/shim/exec_journal.hpp).
#include "host/shim/exec_journal.hpp"

#include <set>
#include <tuple>

#include <fmt/format.h>
#include <simdjson.h>

#include "host/lib/record.hpp"

namespace nes::shim {

namespace {
constexpr ExecState kStates[] = {ExecState::added, ExecState::starting, ExecState::running, ExecState::stopped,
                                 ExecState::deleted};
}

std::string_view to_string(ExecState s) {
  switch (s) {
    case ExecState::added: return "added";
    case ExecState::starting: return "starting";
    case ExecState::running: return "running";
    case ExecState::stopped: return "stopped";
    case ExecState::deleted: return "deleted";
  }
  return "?";
}

std::string encode_exec_journal(const std::vector<ExecEntry>& execs) {
  std::string out = R"({"schema_version":1,"execs":[)";
  bool first = true;
  for (const auto& e : execs) {
    out += first ? "" : ",";
    first = false;
    out += fmt::format(
        R"({{"id":{},"spec":{},"stdin":{},"stdout":{},"stderr":{},"terminal":{},"state":"{}","proc":{},"pid":{},"exit_status":{},"exited_at_ns":{}}})",
        host::json_string(e.id), host::json_string(e.spec), host::json_string(e.stdin_path),
        host::json_string(e.stdout_path), host::json_string(e.stderr_path), e.terminal, to_string(e.state), e.proc,
        e.pid, e.exit_status, e.exited_at_ns);
    if (!e.task.empty() || e.container || e.stdin_closed) {  // the optional fields, when set
      out.pop_back();
      if (!e.task.empty()) out += fmt::format(R"(,"task":{})", host::json_string(e.task));
      if (e.container) out += fmt::format(R"(,"container":true,"bundle":{})", host::json_string(e.bundle));
      if (e.stdin_closed) out += R"(,"stdin_closed":true)";
      out += "}";
    }
  }
  return out + "]}\n";
}

host::Result<std::vector<ExecEntry>> parse_exec_journal(std::string_view json) {
  constexpr std::string_view kFile = "nesinit-execs.json";
  if (json.size() > kExecJournalMax) return host::Error{fmt::format("{}: over {} bytes", kFile, kExecJournalMax)};
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::object o;
  if (parser.parse(padded).get_object().get(o)) return host::Error{fmt::format("{}: expected a JSON object", kFile)};
  std::uint64_t u = 0;
  if (o["schema_version"].get_uint64().get(u) || u != 1)
    return host::Error{fmt::format("{}: schema_version: expected 1", kFile)};
  simdjson::dom::array a;
  if (o["execs"].get_array().get(a)) return host::Error{fmt::format("{}: execs: expected an array", kFile)};
  std::vector<ExecEntry> out;
  std::set<std::tuple<std::string, std::string, bool>> ids;
  std::size_t i = 0;
  if (a.size() > kExecJournalEntriesMax)
    return host::Error{fmt::format("{}: execs: over {} entries ({})", kFile, kExecJournalEntriesMax, a.size())};
  for (simdjson::dom::element el : a) {
    auto bad = [&](std::string_view field, std::string_view want) {
      return host::Error{fmt::format("{}: execs[{}].{}: expected {}", kFile, i, field, want)};
    };
    simdjson::dom::object x;
    if (el.get_object().get(x)) return bad("", "an object");
    ExecEntry e;
    std::string_view s;
    if (x["id"].get_string().get(s) || s.empty() || s.size() > 256) return bad("id", "1..256 bytes");
    e.id = std::string(s);
    if (auto t = x["task"]; t.error() != simdjson::NO_SUCH_FIELD) {
      if (t.get_string().get(s) || s.size() > 256) return bad("task", "a container id of at most 256 bytes");
      e.task = std::string(s);
    }
    if (auto c = x["container"]; c.error() != simdjson::NO_SUCH_FIELD && c.get_bool().get(e.container))
      return bad("container", "a boolean");
    if (auto c = x["stdin_closed"]; c.error() != simdjson::NO_SUCH_FIELD && c.get_bool().get(e.stdin_closed))
      return bad("stdin_closed", "a boolean");
    if (e.container) {
      if (!e.task.empty()) return bad("task", "none for a container");
      if (x["bundle"].get_string().get(s) || (!s.empty() && s.front() != '/'))
        return bad("bundle", "an absolute path (or empty once deleted)");
      e.bundle = std::string(s);
    }
    if (!ids.insert({e.task, e.id, e.container}).second)
      return bad("id", fmt::format("an id not given before ('{}' is)", e.id));
    for (auto [name, field] : {std::pair{"spec", &e.spec}, {"stdin", &e.stdin_path}, {"stdout", &e.stdout_path},
                               {"stderr", &e.stderr_path}}) {
      if (x[name].get_string().get(s)) return bad(name, "a string");
      *field = std::string(s);
    }
    if (x["terminal"].get_bool().get(e.terminal)) return bad("terminal", "a boolean");
    if (x["state"].get_string().get(s)) return bad("state", "a string");
    bool known = false;
    for (ExecState st : kStates)
      if (to_string(st) == s) {
        e.state = st;
        known = true;
      }
    if (!known) return bad("state", "one of added, starting, running, stopped, deleted");
    if (e.container && e.bundle.empty() && e.state != ExecState::deleted) return bad("bundle", "an absolute path");
    if (x["proc"].get_uint64().get(u) || u > 0xffff) return bad("proc", "an integer 0..65535");
    e.proc = static_cast<std::uint16_t>(u);
    if (x["pid"].get_uint64().get(u) || u > 0x7fffffff) return bad("pid", "a pid or 0");
    e.pid = static_cast<std::uint32_t>(u);
    if (x["exit_status"].get_uint64().get(u) || u > 0xffffffffu) return bad("exit_status", "a u32");
    e.exit_status = static_cast<std::uint32_t>(u);
    if (x["exited_at_ns"].get_int64().get(e.exited_at_ns)) return bad("exited_at_ns", "an integer");
    if (e.state == ExecState::running && (e.proc == 0 || e.pid == 0))
      return bad("proc", "the monitor's number and a pid for a running exec");
    out.push_back(std::move(e));
    ++i;
  }
  return out;
}

}  // namespace nes::shim
