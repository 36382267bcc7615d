// Malformed input. First a schema table of every field of every message, from which the cases
// are generated (missing, each wrong JSON type, out of range, NUL byte), each asserting the exact
// field path in the error; then hand-written cases for what a table cannot express.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support.hpp"

#include <functional>

using namespace nes::proto;
using namespace nes::proto::test;

namespace {

/// The JSON shape a field expects; it decides which wrong-typed values are tried.
enum class Kind { u32, integer, boolean, string, string_or_null, enumeration, array, object, object_or_null };

/// Well-formed JSON values of each type, used as "the wrong type" for every other kind.
const std::vector<std::pair<Kind, std::vector<std::string>>> kWrongTypes = {
    {Kind::u32, {R"("1")", "true", "null", "[1]", "{}", "1.5", "1e3", "-0.0"}},
    {Kind::integer, {R"("1")", "false", "null", "[]", R"({"a":1})", "2.5", "1E1"}},
    {Kind::boolean, {"1", "0", R"("true")", "null", "[]", "{}"}},
    {Kind::string, {"1", "true", "null", R"(["a"])", R"({"a":"b"})"}},
    {Kind::string_or_null, {"1", "false", "[]", "{}"}},
    {Kind::enumeration, {"1", "true", "null", R"(["virtiofs"])", "{}"}},
    {Kind::array, {R"("a")", "1", "true", "null", "{}"}},
    {Kind::object, {R"("a")", "1", "false", "null", "[]"}},
    {Kind::object_or_null, {R"("a")", "1", "false", "[]", "[{}]"}},
};

const std::vector<std::string>& wrong_types(Kind k) {
  for (const auto& [kind, values] : kWrongTypes)
    if (kind == k) return values;
  throw std::logic_error("kind");
}

/// One field of the contract.
struct Field {
  std::string base;          // which valid line it lives in (see base_tree)
  J::Loc loc;                // where, in that line's tree
  std::string path;          // the path the error must name
  Kind kind;
  bool required;             // missing -> error (false: missing decodes fine)
  bool element = false;      // an array element: cannot be "missing"
  std::vector<std::string> out_of_range = {};  // well-typed but refused values (raw JSON)
  std::string missing_error = {};  // when a missing field is reported other than "<path>: missing"
};

const std::vector<Field> kSchema = {
    // boot
    {"boot", {"exec"}, "boot.exec", Kind::object, true},
    {"boot", {"exec", "argv"}, "boot.exec.argv", Kind::array, true, false, {"[]"}},
    {"boot", {"exec", "argv", 0}, "boot.exec.argv[0]", Kind::string, true, true},
    {"boot", {"exec", "argv", 2}, "boot.exec.argv[2]", Kind::string, true, true},
    {"boot", {"exec", "env"}, "boot.exec.env", Kind::object, false},
    {"boot", {"exec", "env", "PATH"}, "boot.exec.env.PATH", Kind::string, false},
    {"boot", {"exec", "cwd"}, "boot.exec.cwd", Kind::string_or_null, false},
    {"boot", {"exec", "uid"}, "boot.exec.uid", Kind::u32, true, false, {"-1", "4294967295", "4294967296", "18446744073709551616"}},
    {"boot", {"exec", "gid"}, "boot.exec.gid", Kind::u32, true, false, {"-1", "4294967295", "4294967296"}},
    {"boot", {"exec", "groups"}, "boot.exec.groups", Kind::array, false},
    {"boot", {"exec", "groups", 1}, "boot.exec.groups[1]", Kind::u32, true, true, {"-1", "4294967296"}},
    {"boot", {"mounts"}, "boot.mounts", Kind::array, false},
    {"boot", {"mounts", 0}, "boot.mounts[0]", Kind::object, true, true},
    {"boot", {"mounts", 0, "tag"}, "boot.mounts[0].tag", Kind::string, true},
    {"boot", {"mounts", 0, "at"}, "boot.mounts[0].at", Kind::string, true, false, {R"("work")", R"("")", R"("./w")"}},
    {"boot", {"mounts", 0, "ro"}, "boot.mounts[0].ro", Kind::boolean, false},
    {"boot", {"mounts", 0, "fs"}, "boot.mounts[0].fs", Kind::enumeration, false, false, {R"("xfs")", R"("VIRTIOFS")", R"("")", R"("virtiofs\u0000")"}},
    {"boot", {"geometry"}, "boot.geometry", Kind::object, true},
    {"boot", {"geometry", "width"}, "boot.geometry.width", Kind::u32, true, false, {"-1", "4294967296"}},
    {"boot", {"geometry", "height"}, "boot.geometry.height", Kind::u32, true, false, {"-1", "4294967296"}},
    {"boot", {"geometry", "fps"}, "boot.geometry.fps", Kind::u32, true, false, {"-1", "4294967296"}},
    {"boot", {"geometry", "hdr"}, "boot.geometry.hdr", Kind::boolean, false},
    {"boot", {"on_exit"}, "boot.on_exit", Kind::object, true},
    {"boot", {"on_exit", "terminal"}, "boot.on_exit.terminal", Kind::boolean, true},
    {"boot", {"on_exit", "halt"}, "boot.on_exit.halt", Kind::enumeration, false, false, {R"("halt")", R"("Reboot")"}},
    {"boot", {"hostname"}, "boot.hostname", Kind::string, false},
    {"boot", {"stdio"}, "boot.stdio", Kind::object_or_null, false},
    {"boot", {"stdio", "stdin"}, "boot.stdio.stdin", Kind::boolean, false},
    {"boot", {"stdio", "terminal"}, "boot.stdio.terminal", Kind::object_or_null, false},
    {"boot", {"stdio", "terminal", "rows"}, "boot.stdio.terminal.rows", Kind::integer, true, false, {"0", "-1", "65536"}},
    {"boot", {"stdio", "terminal", "cols"}, "boot.stdio.terminal.cols", Kind::integer, true, false, {"0", "65536", "4294967297"}},
    {"boot", {"stdio", "mode"}, "boot.stdio.mode", Kind::enumeration, false, false, {R"("LOSSY")", R"("none")", R"("")"}},
    {"boot", {"stdio", "buffer_bytes"}, "boot.stdio.buffer_bytes", Kind::integer, false, false, {"0", "4095", "67108865", "-1"}},
    {"boot", {"stdio", "drain_ms"}, "boot.stdio.drain_ms", Kind::integer, false, false, {"-1", "60001", "18446744073709551616"}},
    {"boot", {"root"}, "boot.root", Kind::object, false},
    {"boot", {"root", "tag"}, "boot.root.tag", Kind::string, true, false, {R"("")"}},
    {"boot", {"root", "ro"}, "boot.root.ro", Kind::boolean, false},
    {"boot", {"root", "fs"}, "boot.root.fs", Kind::enumeration, false, false, {R"("tmpfs")", R"("bind")", R"("xfs")"}},
    {"boot", {"entropy"}, "boot.entropy", Kind::string, false, false,
     {R"("")", '"' + std::string(63, 'a') + '"', '"' + std::string(65, 'a') + '"', '"' + std::string(64, 'A') + '"',
      '"' + std::string(62, '0') + "0g\"", '"' + std::string(62, '0') + "0 \"", '"' + std::string(32, '0') + '"'}},
    {"boot", {"realtime_ns"}, "boot.realtime_ns", Kind::integer, false, false,
     {"-1", "9223372036854775808", "18446744073709551615", "18446744073709551616"}},
    // kill
    {"kill", {"signal"}, "kill.signal", Kind::integer, true, false, {"0", "65", "-9", "4294967305"}},
    {"kill", {"proc"}, "kill.proc", Kind::integer, false, false, {"0", "65536", "-1"}},
    // exec
    {"exec", {"proc"}, "exec.proc", Kind::integer, true, false, {"0", "65536", "-1"}},
    {"exec", {"exec"}, "exec.exec", Kind::object, true},
    {"exec", {"exec", "argv"}, "exec.exec.argv", Kind::array, true, false, {"[]"}},
    {"exec", {"exec", "uid"}, "exec.exec.uid", Kind::u32, true, false, {"-1", "4294967295"}},
    {"exec", {"stdio"}, "exec.stdio", Kind::object_or_null, false},
    {"exec", {"stdio", "terminal", "rows"}, "exec.stdio.terminal.rows", Kind::integer, true, false, {"0", "65536"}},
    // guest -> host
    {"ready", {"protocol_version"}, "ready.protocol_version", Kind::u32, true, false, {"-1", "4294967296"}},
    {"mount_failed", {"tag"}, "mount_failed.tag", Kind::string, false},  // optional: a later v2 revision
    {"mount_failed", {"reason"}, "mount_failed.reason", Kind::string, true},
    {"mount_failed", {"errno"}, "mount_failed.errno", Kind::integer, false, false, {"-1", "2147483648"}},
    {"started", {"pid"}, "started.pid", Kind::integer, false, false, {"0", "-1", "2147483648"}},
    {"start_failed", {"reason"}, "start_failed.reason", Kind::string, true},
    {"start_failed", {"errno"}, "start_failed.errno", Kind::integer, false, false, {"-2", "2147483648"}},
    {"start_failed", {"class"}, "start_failed.class", Kind::enumeration, false, false, {R"("nope")", R"("not-found")"}},
    {"exited_code", {"exit_code"}, "workload_exited.exit_code", Kind::integer, true, false, {"-1", "256", "1000"},
     "workload_exited: expected exactly one of exit_code and signal, got neither"},
    {"exited_signal", {"signal"}, "workload_exited.signal", Kind::integer, true, false, {"0", "65", "-15"},
     "workload_exited: expected exactly one of exit_code and signal, got neither"},
    {"protocol_error", {"reason"}, "protocol_error.reason", Kind::string, true},
    {"processes", {"processes"}, "processes.processes", Kind::array, true},
    {"processes", {"processes", 0}, "processes.processes[0]", Kind::object, true, true},
    {"processes", {"processes", 0, "pid"}, "processes.processes[0].pid", Kind::integer, true, false, {"0", "-1", "2147483648"}},
    {"processes", {"processes", 0, "ppid"}, "processes.processes[0].ppid", Kind::integer, true, false, {"-1", "2147483648"}},
    {"processes", {"processes", 0, "uid"}, "processes.processes[0].uid", Kind::u32, true, false, {"-1", "4294967296"}},
    {"processes", {"processes", 0, "cmd"}, "processes.processes[0].cmd", Kind::string, true},
    {"processes", {"truncated"}, "processes.truncated", Kind::u32, false, false, {"-1", "4294967296"}},
    {"processes", {"totals"}, "processes.totals", Kind::object, false},
    {"processes", {"totals", "mem_total"}, "processes.totals.mem_total", Kind::integer, false, false, {"-1", "9007199254740992"}},
    {"processes", {"totals", "cpu_system_usec"}, "processes.totals.cpu_system_usec", Kind::integer, false, false, {"-1"}},
    {"exec_started", {"proc"}, "exec_started.proc", Kind::integer, true, false, {"0", "65536"}},
    {"exec_started", {"pid"}, "exec_started.pid", Kind::integer, true, false, {"0", "-1", "2147483648"}},
    {"exec_failed", {"proc"}, "exec_failed.proc", Kind::integer, true, false, {"0", "65536"}},
    {"exec_failed", {"reason"}, "exec_failed.reason", Kind::string, true},
    {"exec_failed", {"errno"}, "exec_failed.errno", Kind::integer, false, false, {"-1", "2147483648"}},
    {"exec_failed", {"class"}, "exec_failed.class", Kind::enumeration, false, false, {R"("nope")"}},
    {"exec_exited", {"proc"}, "exec_exited.proc", Kind::integer, true, false, {"0", "65536"}},
    {"exec_exited", {"exit_code"}, "exec_exited.exit_code", Kind::integer, true, false, {"-1", "256"},
     "exec_exited: expected exactly one of exit_code and signal, got neither"},
    {"output_end", {"proc"}, "output_end.proc", Kind::integer, true, false, {"-1", "65536"}},
    {"output_end", {"stream"}, "output_end.stream", Kind::enumeration, true, false, {R"("stdin")", R"("out")"}},
    {"output_end", {"sent"}, "output_end.sent", Kind::integer, true, false, {"-1", "9007199254740992"}},
    {"output_end", {"unsent"}, "output_end.unsent", Kind::integer, true, false, {"-1", "9007199254740992"}},
};

J base_tree(const std::string& name) {
  if (name == "boot") return boot_tree();
  if (name == "kill") return J::obj({{"type", J::s("kill")}, {"signal", J::n(9)}, {"proc", J::n(1)}});
  if (name == "ready") return J::obj({{"type", J::s("ready")}, {"protocol_version", J::n(2)}});
  if (name == "mount_failed")
    return J::obj({{"type", J::s("mount_failed")}, {"tag", J::s("w")}, {"reason", J::s("r")}, {"errno", J::n(19)}});
  if (name == "started") return J::obj({{"type", J::s("started")}, {"pid", J::n(7)}});
  if (name == "start_failed")
    return J::obj({{"type", J::s("start_failed")}, {"reason", J::s("r")}, {"errno", J::n(2)}, {"class", J::s("not_found")}});
  if (name == "exited_code") return J::obj({{"type", J::s("workload_exited")}, {"exit_code", J::n(3)}});
  if (name == "exited_signal") return J::obj({{"type", J::s("workload_exited")}, {"signal", J::n(9)}});
  if (name == "protocol_error") return J::obj({{"type", J::s("protocol_error")}, {"reason", J::s("x")}});
  if (name == "processes")
    return J::obj({{"type", J::s("processes")},
                   {"processes", J::arr({J::obj({{"pid", J::n(1)}, {"ppid", J::n(0)}, {"uid", J::n(0)}, {"cmd", J::s("init")}})})},
                   {"truncated", J::n(0)},
                   {"totals", J::obj({{"mem_total", J::n(1)}, {"mem_available", J::n(1)}, {"cpu_user_usec", J::n(0)},
                                      {"cpu_system_usec", J::n(0)}})}});
  if (name == "exec")
    return J::obj({{"type", J::s("exec")}, {"proc", J::n(1)},
                   {"exec", J::obj({{"argv", J::arr({J::s("sh")})}, {"uid", J::n(0)}, {"gid", J::n(0)}})},
                   {"stdio", J::obj({{"stdin", J::b(true)}, {"terminal", J::obj({{"rows", J::n(24)}, {"cols", J::n(80)}})}})}});
  if (name == "exec_started") return J::obj({{"type", J::s("exec_started")}, {"proc", J::n(1)}, {"pid", J::n(9)}});
  if (name == "exec_failed")
    return J::obj({{"type", J::s("exec_failed")}, {"proc", J::n(1)}, {"reason", J::s("r")}, {"errno", J::n(2)},
                   {"class", J::s("not_found")}});
  if (name == "exec_exited") return J::obj({{"type", J::s("exec_exited")}, {"proc", J::n(1)}, {"exit_code", J::n(3)}});
  if (name == "output_end")
    return J::obj({{"type", J::s("output_end")}, {"proc", J::n(0)}, {"stream", J::s("stdout")}, {"sent", J::n(5)},
                   {"unsent", J::n(7)}});
  throw std::logic_error("base " + name);
}

bool host_side(const std::string& base) { return base == "boot" || base == "kill" || base == "exec"; }

/// Decodes `line` in the direction its base belongs to.
std::string decode_summary(const std::string& base, const std::string& line) {
  return host_side(base) ? summary(decode_host(line)) : summary(decode_guest(line));
}

struct Generated {
  std::string base;
  std::string what;
  std::string line;
  std::string want_prefix;  // "error:<path>: ..." expected at the start of summary()
};

std::vector<Generated> generate() {
  std::vector<Generated> out;
  for (const Field& f : kSchema) {
    const J base = base_tree(f.base);
    const std::string err = "error:" + f.path + ": ";
    // Missing.
    if (!f.element) {
      J t = base;
      REQUIRE(t.remove(f.loc));
      if (!f.required) {
        out.push_back({f.base, f.path + " missing", t.dump(), "ok"});
      } else if (!f.missing_error.empty()) {
        out.push_back({f.base, f.path + " missing", t.dump(), "error:" + f.missing_error});
      } else {
        out.push_back({f.base, f.path + " missing", t.dump(), err + "missing (expected "});
      }
    }
    // Each wrong JSON type.
    for (const std::string& v : wrong_types(f.kind)) {
      J t = base;
      J* at = t.at(f.loc);
      REQUIRE(at);
      *at = J::raw(v);
      out.push_back({f.base, f.path + " = " + v, t.dump(), err + "expected "});
    }
    // Out of range.
    for (const std::string& v : f.out_of_range) {
      J t = base;
      *t.at(f.loc) = J::raw(v);
      out.push_back({f.base, f.path + " = " + v, t.dump(), err + "expected "});
    }
    // NUL byte, at its start, middle and end.
    if (f.kind == Kind::string || f.kind == Kind::string_or_null) {
      const std::pair<std::string, int> nuls[] = {{std::string("\0ab", 3), 0}, {std::string("/a\0b", 4), 2},
                                                  {std::string("/ab\0", 4), 3}};
      for (const auto& [s, pos] : nuls) {
        J t = base;
        *t.at(f.loc) = J::s(s);
        out.push_back({f.base, f.path + " with NUL", t.dump(),
                       err + "expected string without NUL bytes, got NUL at byte " + std::to_string(pos)});
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("schema table: every base line is valid as written") {
  for (const Field& f : kSchema) {
    CAPTURE(f.path);
    CHECK(decode_summary(f.base, base_tree(f.base).dump()) == "ok");
  }
}

TEST_CASE("schema table: generated cases name the exact field path") {
  const std::vector<Generated> cases = generate();
  std::size_t errors = 0;
  for (const Generated& c : cases) {
    CAPTURE(c.what);
    CAPTURE(c.line);
    const std::string got = decode_summary(c.base, c.line);
    CHECK_MESSAGE(starts_with(got, c.want_prefix), got);
    errors += got != "ok";
  }
  MESSAGE("generated malformed-field cases: " << cases.size() << " (" << errors << " errors)");
  CHECK(cases.size() > 250);
}

TEST_CASE("schema table: the reasons read as the contract says") {
  auto boot_with = [](J::Loc loc, std::string raw) {
    J t = boot_tree();
    *t.at(loc) = J::raw(std::move(raw));
    return error_of(decode_host(t.dump()));
  };
  CHECK(boot_with({"exec", "argv", 1}, "3") == "boot.exec.argv[1]: expected string, got 3");
  CHECK(boot_with({"exec", "argv"}, R"("/bin/sh -c x")") ==
        R"(boot.exec.argv: expected non-empty array of strings, got "/bin/sh -c x")");
  CHECK(boot_with({"exec", "env", "PATH"}, "null") == "boot.exec.env.PATH: expected string, got null");
  CHECK(boot_with({"exec", "cwd"}, "7") == "boot.exec.cwd: expected string or null, got 7");
  CHECK(boot_with({"exec", "groups", 0}, "-1") ==
        "boot.exec.groups[0]: expected unsigned 32-bit integer, got -1");
  CHECK(boot_with({"mounts", 0, "at"}, R"("work")") == R"(boot.mounts[0].at: expected absolute path, got "work")");
  CHECK(boot_with({"mounts", 0, "fs"}, R"("xfs")") ==
        R"(boot.mounts[0].fs: expected one of "virtiofs", "9p", "tmpfs", "bind", got "xfs")");
  CHECK(boot_with({"mounts", 0, "ro"}, R"("yes")") == R"(boot.mounts[0].ro: expected boolean, got "yes")");
  CHECK(boot_with({"root", "fs"}, R"("bind")") ==
        R"(boot.root.fs: expected one of "virtiofs", "9p", "erofs", "ext4", got "bind")");
  CHECK(boot_with({"on_exit", "halt"}, R"("halt")") ==
        R"(boot.on_exit.halt: expected one of "poweroff", "reboot", got "halt")");
  CHECK(boot_with({"geometry"}, "[]") == "boot.geometry: expected object, got array");
  CHECK(boot_with({"stdio"}, "true") == "boot.stdio: expected object or null, got true");
  CHECK(boot_with({"stdio", "terminal", "rows"}, "0") ==
        "boot.stdio.terminal.rows: expected integer 1..65535, got 0");
  CHECK(boot_with({"stdio", "mode"}, R"("fast")") ==
        R"(boot.stdio.mode: expected one of "lossless", "lossy", got "fast")");
  CHECK(boot_with({"stdio", "buffer_bytes"}, "4095") ==
        "boot.stdio.buffer_bytes: expected integer 4096..67108864, got 4095");
  CHECK(boot_with({"stdio", "drain_ms"}, "60001") == "boot.stdio.drain_ms: expected integer 0..60000, got 60001");
  CHECK(boot_with({"geometry", "fps"}, "59.94") == "boot.geometry.fps: expected unsigned 32-bit integer, got 59.94");
  CHECK(boot_with({"entropy"}, R"("00ff")") == R"(boot.entropy: expected 64 lowercase hex digits, got "00ff")");
  CHECK(boot_with({"entropy"}, '"' + std::string(63, '0') + "F\"") ==
        "boot.entropy: expected 64 lowercase hex digits, got \"" + std::string(48, '0') + "\"...");
  CHECK(boot_with({"entropy"}, "[1]") == "boot.entropy: expected string, got array");
  CHECK(boot_with({"realtime_ns"}, "-1") == "boot.realtime_ns: expected integer 0..9223372036854775807, got -1");
  CHECK(boot_with({"realtime_ns"}, "1.7e18") ==
        "boot.realtime_ns: expected integer 0..9223372036854775807, got 1.7e18");
  J t = boot_tree();
  t.remove({"exec", "uid"});
  CHECK(error_of(decode_host(t.dump())) == "boot.exec.uid: missing (expected unsigned 32-bit integer)");
  t = boot_tree();
  t.remove({"stdio", "terminal", "cols"});
  CHECK(error_of(decode_host(t.dump())) == "boot.stdio.terminal.cols: missing (expected integer 1..65535)");
  t = boot_tree();
  t.remove({"on_exit"});
  CHECK(error_of(decode_host(t.dump())) == "boot.on_exit: missing (expected object)");
  // A long offending value is clipped in the reason (at a UTF-8 boundary), never copied whole.
  const std::string big = boot_with({"exec", "uid"}, '"' + std::string(100000, 'x') + '"');
  CHECK(big.size() < 200);
  CHECK(starts_with(big, "boot.exec.uid: expected unsigned 32-bit integer, got \"xxx"));
  const std::string uni = boot_with({"exec", "uid"}, '"' + std::string(30, 'x') + std::string(20, '\xC3') + '"');
  CHECK(summary(decode_guest(encode(GuestMessage{ProtocolError{uni}}))) == "ok");
}

TEST_CASE("environment names: non-empty, no '=' (they could not reach the workload as written)") {
  auto env = [](std::string name) {
    J t = boot_tree();
    std::get<J::Obj>(t.at({"exec", "env"})->v).push_back({name, J::s("v")});
    return error_of(decode_host(t.dump()));
  };
  CHECK(env("") == R"(boot.exec.env[""]: environment variable name must be non-empty and contain no '=')");
  CHECK(env("A=B") == R"(boot.exec.env["A=B"]: environment variable name must be non-empty and contain no '=')");
  CHECK(env(std::string("A\0B", 3)) == R"(boot.exec.env["A\u0000B"]: environment variable name must not contain NUL bytes)");
  CHECK(env("lower.dot-dash") == "");
}

// ---- hand-written -------------------------------------------------------------------------------

TEST_CASE("truncated JSON: every proper prefix of a valid line is an error, never a message") {
  for (const std::string& line : {std::string(kReferenceBootLine), boot_tree().dump(),
                                 std::string(R"({"type":"workload_exited","signal":9})")}) {
    for (std::size_t n = 0; n < line.size(); ++n) {
      CAPTURE(line.substr(0, n));
      CHECK(starts_with(summary(decode_host(line.substr(0, n))), "error:"));
      CHECK(starts_with(summary(decode_guest(line.substr(0, n))), "error:"));
    }
  }
}

TEST_CASE("not exactly one JSON object on the line") {
  CHECK(error_of(decode_host(R"({"type":"stop"}{"type":"stop"})")) ==
        "stop: unexpected content after the JSON object at byte 15");
  CHECK(error_of(decode_host(R"({"type":"stop"} {"type":"shutdown"})")) ==
        "stop: unexpected content after the JSON object at byte 16");
  CHECK(starts_with(error_of(decode_host(R"({"type":"stop"} x)")), "message: invalid JSON"));
  CHECK(starts_with(error_of(decode_host(R"({"type":"stop"} 1)")), "message: invalid JSON"));
  CHECK(starts_with(error_of(decode_host(R"({"type":"stop"}])")), "message: invalid JSON"));
  CHECK(error_of(decode_host(R"([{"type":"stop"}])")) == "message: expected a JSON object, got array");
  CHECK(error_of(decode_host(R"("stop")")) == "message: expected a JSON object, got string");
  CHECK(error_of(decode_host("42")) == "message: expected a JSON object, got number");
  CHECK(error_of(decode_host("null")) == "message: expected a JSON object, got null");
  CHECK(error_of(decode_host("true")) == "message: expected a JSON object, got boolean");
  CHECK(error_of(decode_host("")) == "line: empty (expected a JSON object)");
  CHECK(error_of(decode_host("  \t")) == "line: empty (expected a JSON object)");
  CHECK(error_of(decode_host("\r")) == "line: empty (expected a JSON object)");
}

TEST_CASE("duplicate keys are refused in every object, naming the object and the key") {
  CHECK(error_of(decode_host(R"({"type":"stop","type":"shutdown"})")) == R"(stop: duplicate key "type")");
  CHECK(error_of(decode_host(R"({"type":"kill","signal":9,"signal":15})")) == R"(kill: duplicate key "signal")");
  // Escapes are resolved first: "\u0074ype" is "type".
  CHECK(error_of(decode_host(R"({"type":"stop","\u0074ype":"stop"})")) == R"(stop: duplicate key "type")");
  J t = boot_tree();
  std::get<J::Obj>(t.at({"exec"})->v).push_back({"uid", J::n(0)});
  CHECK(error_of(decode_host(t.dump())) == R"(boot.exec: duplicate key "uid")");
  t = boot_tree();
  std::get<J::Obj>(t.at({"exec", "env"})->v).push_back({"PATH", J::s("/evil")});
  CHECK(error_of(decode_host(t.dump())) == R"(boot.exec.env: duplicate key "PATH")");
  t = boot_tree();
  std::get<J::Obj>(t.at({"mounts", 0})->v).push_back({"at", J::s("/etc")});
  CHECK(error_of(decode_host(t.dump())) == R"(boot.mounts[0]: duplicate key "at")");
  // Also inside unknown fields and unknown messages: a line is one unambiguous object.
  CHECK(error_of(decode_host(R"({"type":"stop","video":{"a":1,"b":[{"c":1,"c":2}]}})")) ==
        R"(stop.video.b[0]: duplicate key "c")");
  CHECK(error_of(decode_host(R"({"type":"future","x":1,"x":2})")) == R"(message: duplicate key "x")");
}

TEST_CASE("nesting: kMaxJsonDepth levels decode, one more is refused without deep recursion") {
  auto nested = [](int containers) {  // the top-level object counts as 1
    std::string inner;
    for (int i = 1; i < containers; ++i) inner += (i % 2) ? "[" : R"({"k":)";
    inner += "1";
    for (int i = containers - 1; i >= 1; --i) inner += (i % 2) ? "]" : "}";
    return R"({"type":"stop","x":)" + (containers > 1 ? inner : std::string("1")) + "}";
  };
  CHECK(summary(decode_host(nested(kMaxJsonDepth))) == "ok");
  CHECK(error_of(decode_host(nested(kMaxJsonDepth + 1))).find("nesting deeper than 64 levels") !=
        std::string::npos);
  CHECK(starts_with(error_of(decode_host(nested(kMaxJsonDepth + 1))), "stop.x[0].k[0]"));
  // 100 000 levels: refused, no stack exhaustion (the walk stops at the limit).
  const std::string deep = R"({"type":"stop","x":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  CHECK(starts_with(summary(decode_host(deep)), "error:"));
  const std::string unclosed = R"({"type":"stop","x":)" + std::string(100000, '{');
  CHECK(starts_with(summary(decode_host(unclosed)), "error:"));
}

TEST_CASE("invalid JSON text: each a DecodeError, never a message") {
  const char* bad[] = {
      R"({"type":"stop",})",            R"({"type":"stop",,"x":1})",     R"({"type" "stop"})",
      R"({"type":"stop","x":[1 2]})",   R"({"type":"stop","x":[1,]})",   R"({"type":"stop","x":{"a" 1}})",
      R"({"type":"stop","x":tru})",     R"({"type":"stop","x":nul})",    R"({"type":"stop","x":True})",
      R"({"type":"stop","x":01})",      R"({"type":"stop","x":1.})",     R"({"type":"stop","x":.5})",
      R"({"type":"stop","x":+1})",      R"({"type":"stop","x":NaN})",    R"({"type":"stop","x":Infinity})",
      R"({"type":"stop","x":1e400})",   R"({"type":"stop","x":"\x"})",   R"({"type":"stop","x":"\u12"})",
      R"({"type":"stop","x":"\ud800"})", R"({"type":"stop","x":"\udc00\ud800"})",
      R"({"type":"stop","x":'a'})",     R"({type:"stop"})",              R"({"type":"stop","x":[1,2]]})",
      R"({"type":"stop"]})",            R"({"type":"stop","x":"a)",      R"({"type":"stop"} // c)",
  };
  for (const char* line : bad) {
    CAPTURE(line);
    CHECK(starts_with(summary(decode_host(line)), "error:"));
  }
  // Raw control characters inside strings (JSON requires them escaped), raw invalid UTF-8.
  CHECK(starts_with(summary(decode_host("{\"type\":\"stop\",\"x\":\"a\tb\"}")), "error:"));
  CHECK(starts_with(summary(decode_host("{\"type\":\"stop\",\"x\x01\":1}")), "error:"));
  CHECK(starts_with(summary(decode_host(std::string("{\"type\":\"stop\",\"x\":\"a\0b\"}", 24))), "error:"));
  CHECK(error_of(decode_host("{\"type\":\"stop\",\"x\":\"\xFF\"}")) ==
        "message: invalid JSON (The input is not valid UTF-8)");
  // Integers beyond 64 bits are valid JSON in an unknown field, and out of range in a known one.
  CHECK(summary(decode_host(R"({"type":"stop","x":123456789012345678901234567890})")) == "ok");
  // A number is refused only where a double would round it to infinity: at 2^1024 - 2^970 (the
  // half-way point above DBL_MAX), in every spelling; what rounds to zero is valid.
  const std::string limit =
      "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977"
      "587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845"
      "817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559"
      "699508093042880177904174497792";
  const std::string below = limit.substr(0, limit.size() - 1) + "1";
  auto stop_x = [](const std::string& num) { return R"({"type":"stop","x":)" + num + "}"; };
  for (const std::string& ok : {std::string("1.7976931348623157e308"), std::string("-1.7976931348623158e308"),
                                below, below + ".99999", "0." + below + "e309", std::string("1e-400"),
                                std::string("-0.0e99999999999999999999"), std::string("1E+2"), std::string("0.000e-7")}) {
    CAPTURE(ok);
    CHECK(summary(decode_host(stop_x(ok))) == "ok");
  }
  for (const std::string& bad : {limit, "-" + limit, limit + ".0", "0." + limit + "e309", limit.substr(0, 1) + "." + limit.substr(1) + "e308",
                                 std::string("1.7976931348623159e308"), std::string("1e99999999999999999999999"), std::string("1e"), std::string("1e+"),
                                 std::string("-"), std::string("--1"), std::string("1x"), std::string("0x10"), std::string("00")}) {
    CAPTURE(bad);
    CHECK(error_of(decode_host(stop_x(bad))) == "stop.x: invalid JSON (Problem while parsing a number)");
  }
  CHECK(error_of(decode_host(R"({"type":"kill","signal":123456789012345678901234567890})")) ==
        "kill.signal: expected integer 1..64, got 123456789012345678901234567890");
}

TEST_CASE("the type field itself") {
  CHECK(error_of(decode_host(R"({"signal":9})")) == "type: missing (expected string)");
  CHECK(error_of(decode_host(R"({"type":9})")) == "type: expected string, got 9");
  CHECK(error_of(decode_host(R"({"x":1,"type":null})")) == "type: expected string, got null");
  CHECK(error_of(decode_host(R"({"type":["stop"]})")) == "type: expected string, got array");
  CHECK(error_of(decode_host(R"({"type":"stop\u0000"})")) == "type: expected string without NUL bytes, got NUL");
  // An unknown type is only skipped when the line is otherwise well-formed JSON.
  CHECK(starts_with(error_of(decode_host(R"({"type":"future","x":[1,]})")), "message.x[1]: invalid JSON"));
}

TEST_CASE("2 MiB line: refused by the LineReader without buffering it, then the next line decodes") {
  LineReader r;  // default cap: kDefaultLineCap (1 MiB)
  const std::string chunk(64 * 1024, ' ');
  r.feed(R"({"type":"boot","exec":{"argv":[")");
  std::size_t fed = 32, peak = 0;
  while (fed < 2u * 1024 * 1024) {
    r.feed(chunk);
    fed += chunk.size();
    peak = std::max(peak, r.buffered());
    CHECK(!r.next().has_value());
  }
  CHECK(peak <= kDefaultLineCap + 1);
  CHECK(r.buffered() == 0);  // dropping: nothing of the long line is held
  r.feed("\"]}}\n{\"type\":\"stop\"}\n");
  auto l1 = r.next();
  REQUIRE(l1.has_value());
  CHECK(l1->kind == Line::Kind::too_long);
  CHECK(l1->length == fed + 4);
  CHECK(l1->text.empty());
  auto l2 = r.next();
  REQUIRE(l2.has_value());
  CHECK(l2->kind == Line::Kind::text);
  CHECK(summary(decode_host(l2->text)) == "ok");
  // The codec itself has no cap: a 2 MiB line handed to it directly still decodes (the cap is
  // framing's job, so both ends enforce it in one place).
  Boot b = reference_boot();
  b.exec.env["BIG"] = std::string(2u * 1024 * 1024, 'x');
  CHECK(summary(decode_host(encode(HostMessage{b}))) == "ok");
}
