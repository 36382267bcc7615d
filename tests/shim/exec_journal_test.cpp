// The task's exec journal (host/shim/exec_journal.hpp): every state and field through its exact
// line and back, strings that need escaping, and each malformed field refused by name.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "host/shim/exec_journal.hpp"

using namespace nes;
using shim::ExecEntry;
using shim::ExecState;

namespace {
/// An entry with the fields these tests vary (the rest as ExecEntry's defaults).
ExecEntry entry(std::string id, ExecState st, std::uint16_t proc = 0, std::uint32_t pid = 0, std::uint32_t status = 0,
                std::int64_t at = 0) {
  ExecEntry e;
  e.id = std::move(id);
  e.state = st;
  e.proc = proc;
  e.pid = pid;
  e.exit_status = status;
  e.exited_at_ns = at;
  return e;
}

std::string error_of(std::string_view json) {
  auto r = shim::parse_exec_journal(json);
  REQUIRE_FALSE(r.ok());
  return r.error().message;
}
}  // namespace

TEST_CASE("every state, through its line and back") {
  std::vector<ExecEntry> v;
  ExecEntry a = entry("a", ExecState::added);
  a.spec = R"({"args":["sh","-c","echo \"hi\"\n"]})";
  a.stdin_path = "/f/in";
  a.stdout_path = "/f/out";
  a.terminal = true;
  v.push_back(a);
  ExecEntry b = entry("b", ExecState::starting);
  b.spec = "{}";
  b.stdout_path = "file:///l";
  v.push_back(b);
  v.push_back(entry("c", ExecState::running, 7, 42));
  v.push_back(entry("d\xc3\xa9", ExecState::stopped, 8, 43, 3, 1700000000123456789));
  v.push_back(entry("e", ExecState::deleted, 0, 44, 137, -5));
  // A pod's: a container (its bundle), an exec in it, a deleted container.
  ExecEntry c = entry("c1", ExecState::running, 3, 50);
  c.stdout_path = "/f/c1-out";
  c.container = true;
  c.bundle = "/run/b/c1";
  v.push_back(c);
  ExecEntry ci = entry("a", ExecState::stopped, 4, 51, 4, 9);  // id "a" again: in c1
  ci.task = "c1";
  ci.stdin_closed = true;
  v.push_back(ci);
  ExecEntry cd = entry("c0", ExecState::deleted, 0, 49, 0, 8);
  cd.container = true;
  v.push_back(cd);
  const std::string line = shim::encode_exec_journal(v);
  CHECK(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);
  CHECK(line.starts_with(R"({"schema_version":1,"execs":[{"id":"a","spec":"{\"args\":)"));
  auto back = shim::parse_exec_journal(line);
  REQUIRE(back.ok());
  CHECK(*back == v);
  auto none = shim::parse_exec_journal(shim::encode_exec_journal({}));
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("malformed journals: the entry and the field named") {
  const std::string ok =
      R"({"id":"a","spec":"{}","stdin":"","stdout":"","stderr":"","terminal":false,"state":"running","proc":1,"pid":2,"exit_status":0,"exited_at_ns":0})";
  auto with = [&](std::string entry) { return R"({"schema_version":1,"execs":[)" + ok + "," + entry + "]}"; };
  CHECK(error_of("") == "nesinit-execs.json: expected a JSON object");
  CHECK(error_of("[]") == "nesinit-execs.json: expected a JSON object");
  CHECK(error_of(R"({"schema_version":2,"execs":[]})") == "nesinit-execs.json: schema_version: expected 1");
  CHECK(error_of(R"({"schema_version":1})") == "nesinit-execs.json: execs: expected an array");
  CHECK(error_of(with("3")) == "nesinit-execs.json: execs[1].: expected an object");
  CHECK(error_of(with(ok)) == "nesinit-execs.json: execs[1].id: expected an id not given before ('a' is)");
  auto replace = [&](std::string from, std::string to) {
    std::string e = ok;
    e.replace(e.find("\"a\""), 3, "\"b\"");  // an id of its own
    if (from.starts_with(R"("id")")) from = R"("id":"b")";
    e.replace(e.find(from), from.size(), to);
    return with(e);
  };
  CHECK(error_of(replace(R"("id":"a")", R"("id":"")")) == "nesinit-execs.json: execs[1].id: expected 1..256 bytes");
  CHECK(error_of(replace(R"("id":"a")", R"("id":")" + std::string(257, 'x') + "\"")) ==
        "nesinit-execs.json: execs[1].id: expected 1..256 bytes");
  CHECK(error_of(replace(R"("spec":"{}")", R"("spec":{})")) == "nesinit-execs.json: execs[1].spec: expected a string");
  CHECK(error_of(replace(R"("stdout":"")", R"("stdout":1)")) == "nesinit-execs.json: execs[1].stdout: expected a string");
  CHECK(error_of(replace(R"("terminal":false)", R"("terminal":0)")) ==
        "nesinit-execs.json: execs[1].terminal: expected a boolean");
  CHECK(error_of(replace(R"("state":"running")", R"("state":"paused")")) ==
        "nesinit-execs.json: execs[1].state: expected one of added, starting, running, stopped, deleted");
  CHECK(error_of(replace(R"("proc":1)", R"("proc":65536)")) == "nesinit-execs.json: execs[1].proc: expected an integer 0..65535");
  CHECK(error_of(replace(R"("proc":1)", R"("proc":0)")) ==
        "nesinit-execs.json: execs[1].proc: expected the monitor's number and a pid for a running exec");
  CHECK(error_of(replace(R"("pid":2)", R"("pid":-1)")) == "nesinit-execs.json: execs[1].pid: expected a pid or 0");
  CHECK(error_of(replace(R"("exit_status":0)", R"("exit_status":4294967296)")) ==
        "nesinit-execs.json: execs[1].exit_status: expected a u32");
  CHECK(error_of(replace(R"("exited_at_ns":0)", R"("exited_at_ns":"x")")) ==
        "nesinit-execs.json: execs[1].exited_at_ns: expected an integer");
  CHECK(error_of(replace(R"("exited_at_ns":0)", R"("exited_at_ns":0,"container":true,"bundle":"rel")")) ==
        "nesinit-execs.json: execs[1].bundle: expected an absolute path (or empty once deleted)");
  CHECK(error_of(replace(R"("exited_at_ns":0)", R"("exited_at_ns":0,"container":true,"bundle":"")")) ==
        "nesinit-execs.json: execs[1].bundle: expected an absolute path");
  CHECK(error_of(replace(R"("exited_at_ns":0)", R"("exited_at_ns":0,"container":1)")) ==
        "nesinit-execs.json: execs[1].container: expected a boolean");
  CHECK(error_of(replace(R"("exited_at_ns":0)", R"("exited_at_ns":0,"task":"c","container":true,"bundle":"/b")")) ==
        "nesinit-execs.json: execs[1].task: expected none for a container");
  CHECK(error_of(std::string(shim::kExecJournalMax + 1, ' ')) == "nesinit-execs.json: over 4194304 bytes");
  std::vector<ExecEntry> many;
  for (int i = 0; i < 1025; ++i) many.push_back(entry("x" + std::to_string(i), ExecState::deleted));
  CHECK(error_of(shim::encode_exec_journal(many)) == "nesinit-execs.json: execs: over 1024 entries (1025)");
  many.pop_back();
  CHECK(shim::parse_exec_journal(shim::encode_exec_journal(many)).ok());
}
