// Encoding and round trips: every message with edge values, every control character, unicode,
// the invalid-UTF-8 and NUL policies, and the reference's wire shapes (docs/protocol.md).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "support.hpp"

#include <algorithm>
#include <numeric>

using namespace nes::proto;
using namespace nes::proto::test;

namespace {

/// Properties every encoded line has: one compact JSON object, `type` first, no raw control bytes.
template <class Msg>
void check_shape(const Msg& m, const std::string& enc) {
  const std::string head = std::string(R"({"type":")") + std::string(type_name(m)) + "\"";
  CHECK(starts_with(enc, head));
  CHECK(enc.back() == '}');
  for (unsigned char c : enc) CHECK_MESSAGE(c >= 0x20, "raw control byte in " << enc);
  CHECK(encode_line(m) == enc + "\n");
}

Boot boot_with_string(std::string s) {
  Boot b = reference_boot();
  b.exec.argv.push_back(s);
  b.exec.env["K" + s] = s;
  b.exec.cwd = "/" + s;
  b.mounts.push_back(Mount{s, "/" + s, false, FsType::bind});
  b.hostname = s;
  return b;
}

}  // namespace

TEST_CASE("every host message round-trips: decode(encode(m)) == m") {
  for (const HostMessage& m : host_samples()) {
    const std::string enc = encode(m);
    CAPTURE(enc);
    check_shape(m, enc);
    HostDecoded d = decode_host(enc);
    REQUIRE(summary(d) == "ok");
    CHECK(std::get<HostMessage>(d) == m);
    CHECK(validate(m).ok());
    // The other direction does not know these types: skipped, not an error.
    CHECK(summary(decode_guest(enc)) == "unknown:" + std::string(type_name(m)));
  }
}

TEST_CASE("every guest message round-trips: decode(encode(m)) == m") {
  for (const GuestMessage& m : guest_samples()) {
    const std::string enc = encode(m);
    CAPTURE(enc);
    check_shape(m, enc);
    GuestDecoded d = decode_guest(enc);
    REQUIRE(summary(d) == "ok");
    CHECK(std::get<GuestMessage>(d) == m);
    CHECK(validate(m).ok());
    CHECK(summary(decode_host(enc)) == "unknown:" + std::string(type_name(m)));
  }
}

TEST_CASE("exact wire shapes: the reference's lines, byte for byte") {
  CHECK(encode(HostMessage{reference_boot()}) == kReferenceBootLine);
  CHECK(encode(GuestMessage{Ready{}}) == R"({"type":"ready","protocol_version":2})");
  CHECK(encode(GuestMessage{WorkloadExited::code(3)}) == R"({"type":"workload_exited","exit_code":3})");
  CHECK(encode(GuestMessage{WorkloadExited::killed(9)}) == R"({"type":"workload_exited","signal":9})");
  CHECK(encode(HostMessage{Stop{}}) == R"({"type":"stop"})");
  CHECK(encode(HostMessage{Shutdown{}}) == R"({"type":"shutdown"})");
  CHECK(encode(HostMessage{Kill{15}}) == R"({"type":"kill","signal":15})");
  CHECK(encode(GuestMessage{Mounted{}}) == R"({"type":"mounted"})");
  CHECK(encode(GuestMessage{MountFailed{"w", "no", 19}}) ==
        R"({"type":"mount_failed","tag":"w","reason":"no","errno":19})");
  CHECK(encode(GuestMessage{Started{42}}) == R"({"type":"started","pid":42})");
  CHECK(encode(GuestMessage{StartFailed{"r", 2, StartFailClass::not_found}}) ==
        R"({"type":"start_failed","reason":"r","errno":2,"class":"not_found"})");
  CHECK(encode(GuestMessage{ProtocolError{"x"}}) == R"({"type":"protocol_error","reason":"x"})");
  // exec (additive): its own process number on every message and frame.
  CHECK(encode(HostMessage{Kill{9, 2}}) == R"({"type":"kill","signal":9,"proc":2})");
  ExecProcess ex;
  ex.proc = 2;
  ex.exec.argv = {"sh"};
  CHECK(encode(HostMessage{ex}) ==
        R"({"type":"exec","proc":2,"exec":{"argv":["sh"],"env":{},"cwd":null,"uid":0,"gid":0}})");
  CHECK(encode(GuestMessage{ExecStarted{2, 77}}) == R"({"type":"exec_started","proc":2,"pid":77})");
  CHECK(encode(GuestMessage{ExecFailed{2, "r", 2, StartFailClass::not_found}}) ==
        R"({"type":"exec_failed","proc":2,"reason":"r","errno":2,"class":"not_found"})");
  CHECK(encode(GuestMessage{ExecExited{2, 7, std::nullopt}}) == R"({"type":"exec_exited","proc":2,"exit_code":7})");
  CHECK(encode(GuestMessage{ExecExited{2, std::nullopt, 9}}) == R"({"type":"exec_exited","proc":2,"signal":9})");
  CHECK(encode(GuestMessage{OutputEnd{0, Stream::err, 5, 7}}) ==
        R"({"type":"output_end","proc":0,"stream":"stderr","sent":5,"unsent":7})");
  // boot.stdio: absent means the console (reference shape); present, every field is written.
  Boot st = reference_boot();
  st.stdio = Stdio{};
  CHECK(encode(HostMessage{st}) ==
        std::string(kReferenceBootLine.substr(0, kReferenceBootLine.size() - 1)) +
            R"(,"stdio":{"stdin":false,"terminal":null,"mode":"lossless","buffer_bytes":1048576,"drain_ms":500}})");
  st.stdio = Stdio{true, Terminal{40, 132}, StdioMode::lossy, 4096, 0};
  CHECK(encode(HostMessage{st}) ==
        std::string(kReferenceBootLine.substr(0, kReferenceBootLine.size() - 1)) +
            R"(,"stdio":{"stdin":true,"terminal":{"rows":40,"cols":132},"mode":"lossy","buffer_bytes":4096,"drain_ms":0}})");
  // Additive fields appear only when set to something other than their default.
  CHECK(encode(HostMessage{full_boot()}) ==
        "{\"type\":\"boot\",\"exec\":{\"argv\":[\"/usr/bin/env\",\"\",\"with space\","
        "\"quote\\\"back\\\\slash\",\"\xC3\xA9\xE6\x97\xA5\xF0\x9F\x98\x80\"],"
        "\"env\":{\"EMPTY\":\"\",\"PATH\":\"/bin\",\"UNI\xC3\x89\":\"\xF4\x8F\xBF\xBF\"},"
        "\"cwd\":\"/tmp/work dir\",\"uid\":4294967294,\"gid\":0,\"groups\":[0,1,4294967294,4294967295]},"
        "\"mounts\":[{\"tag\":\"work\",\"at\":\"/work\",\"ro\":true},"
        "{\"tag\":\"nine\",\"at\":\"/n\",\"ro\":false,\"fs\":\"9p\"},"
        "{\"tag\":\"scratch\",\"at\":\"/tmp\",\"ro\":false,\"fs\":\"tmpfs\"},"
        "{\"tag\":\"/srv\",\"at\":\"/mnt/srv\",\"ro\":true,\"fs\":\"bind\"}],"
        "\"root\":{\"tag\":\"root\",\"ro\":true,\"fs\":\"9p\"},"
        "\"geometry\":{\"width\":4294967295,\"height\":0,\"fps\":1,\"hdr\":true},"
        "\"on_exit\":{\"terminal\":false,\"halt\":\"reboot\"},\"hostname\":\"guest-1\","
        "\"stdio\":{\"stdin\":true,\"terminal\":{\"rows\":1,\"cols\":65535},\"mode\":\"lossy\","
        "\"buffer_bytes\":67108864,\"drain_ms\":60000}}");
}

TEST_CASE("every control character U+0001..U+001F round-trips in every string field") {
  const char* short_forms[32] = {};
  short_forms['\b'] = "\\b";
  short_forms['\f'] = "\\f";
  short_forms['\n'] = "\\n";
  short_forms['\r'] = "\\r";
  short_forms['\t'] = "\\t";
  for (int c = 1; c < 0x20; ++c) {
    CAPTURE(c);
    const std::string s = std::string("a") + static_cast<char>(c) + "b";
    // The exact escape: JSON's short form where it has one, else \u00XX (lower-case hex).
    char want[8];
    std::snprintf(want, sizeof want, "\\u%04x", c);
    const std::string esc = short_forms[c] ? short_forms[c] : want;
    CHECK(encode(GuestMessage{ProtocolError{s}}) ==
          std::string(R"({"type":"protocol_error","reason":"a)") + esc + "b\"}");

    const Boot b = boot_with_string(s);
    HostDecoded d = decode_host(encode(HostMessage{b}));
    REQUIRE(summary(d) == "ok");
    CHECK(std::get<Boot>(std::get<HostMessage>(d)) == b);
    const GuestMessage g = MountFailed{s, s, 1};
    CHECK(std::get<GuestMessage>(decode_guest(encode(g))) == g);
  }
  // DEL and the escapable printable characters.
  for (std::string s : {std::string("\x7f"), std::string("\"\\/"), std::string(256, '\\')}) {
    const Boot b = boot_with_string(s);
    CHECK(std::get<Boot>(std::get<HostMessage>(decode_host(encode(HostMessage{b})))) == b);
  }
}

TEST_CASE("NUL: encoded faithfully as \\u0000, refused on decode naming the field; validate agrees") {
  const std::string nul("a\0b", 3);
  Boot b = reference_boot();
  b.exec.argv.push_back(nul);
  const std::string enc = encode(HostMessage{b});
  CHECK(enc.find(R"("a\u0000b")") != std::string::npos);
  const std::string want = "boot.exec.argv[3]: expected string without NUL bytes, got NUL at byte 1";
  CHECK(error_of(decode_host(enc)) == want);
  REQUIRE(!validate(HostMessage{b}).ok());
  CHECK(validate(HostMessage{b}).error().reason == want);

  Boot h = reference_boot();
  h.hostname = nul;
  CHECK(error_of(decode_host(encode(HostMessage{h}))) ==
        "boot.hostname: expected string without NUL bytes, got NUL at byte 1");
  CHECK(error_of(decode_guest(encode(GuestMessage{ProtocolError{nul}}))) ==
        "protocol_error.reason: expected string without NUL bytes, got NUL at byte 1");
}

TEST_CASE("invalid UTF-8: each offending byte becomes U+FFFD; valid sequences pass untouched") {
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case { std::string in, out; };
  const Case cases[] = {
      {"\xFF", fffd},                                   // never valid
      {"a\x80z", "a" + fffd + "z"},                      // lone continuation byte
      {"\xE2\x82", fffd + fffd},                        // truncated 3-byte sequence
      {"\xE2\x82" "A", fffd + fffd + "A"},
      {"\xC0\xAF", fffd + fffd},                        // overlong '/'
      {"\xE0\x80\xAF", fffd + fffd + fffd},             // overlong, 3 bytes
      {"\xED\xA0\x80", fffd + fffd + fffd},             // UTF-16 surrogate U+D800
      {"\xF4\x90\x80\x80", fffd + fffd + fffd + fffd},  // above U+10FFFF
      {"\xF8\x88\x80\x80\x80", fffd + fffd + fffd + fffd + fffd},
      {"\xC3\xA9", "\xC3\xA9"},                         // U+00E9
      {"\xEF\xBF\xBF", "\xEF\xBF\xBF"},                 // U+FFFF (a noncharacter, but valid)
      {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80"},         // U+1F600
      {"\xF4\x8F\xBF\xBF", "\xF4\x8F\xBF\xBF"},         // U+10FFFF
      {"\xE2\x80\xA8", "\xE2\x80\xA8"},                 // U+2028 (legal raw in JSON)
  };
  for (const Case& c : cases) {
    CAPTURE(c.in);
    const std::string enc = encode(GuestMessage{ProtocolError{c.in}});
    CHECK(enc == R"({"type":"protocol_error","reason":")" + c.out + "\"}");
    GuestDecoded d = decode_guest(enc);
    REQUIRE(summary(d) == "ok");
    CHECK(std::get<ProtocolError>(std::get<GuestMessage>(d)).reason == c.out);
    CHECK(!validate(GuestMessage{ProtocolError{c.in}}).ok() == (c.in != c.out));
  }
  CHECK(validate(GuestMessage{ProtocolError{"\xFF"}}).error().reason ==
        "protocol_error: a string is not valid UTF-8");
}

TEST_CASE("unicode strings round-trip in every string field") {
  for (std::string s : {std::string("\xC3\xA9t\xC3\xA9"), std::string("\xE6\x97\xA5\xE6\x9C\xAC"),
                        std::string("\xF0\x9F\x98\x80\xF0\x9F\x8E\xA5"), std::string("\xD7\xA9\xD7\x9C"),
                        std::string("\xEF\xBB\xBF" "bom")}) {
    const Boot b = boot_with_string(s);
    CHECK(std::get<Boot>(std::get<HostMessage>(decode_host(encode(HostMessage{b})))) == b);
  }
  // Escaped input decodes to the same bytes: "\u00e9" and "\ud83d\ude00" (a surrogate pair).
  HostDecoded d = decode_host(
      R"({"type":"boot","exec":{"argv":["\u00e9","\ud83d\ude00","\u0041\/"],"uid":0,"gid":0},)"
      R"("geometry":{"width":1,"height":1,"fps":1},"on_exit":{"terminal":true}})");
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<Boot>(std::get<HostMessage>(d)).exec.argv ==
        std::vector<std::string>{"\xC3\xA9", "\xF0\x9F\x98\x80", "A/"});
}

TEST_CASE("huge env and argv round-trip (a line just under the 1 MiB cap)") {
  Boot b = reference_boot();
  for (int i = 0; i < 20000; ++i) b.exec.env["VAR_" + std::to_string(i)] = std::string(32, 'x');
  for (int i = 0; i < 2000; ++i) b.exec.argv.push_back("arg" + std::to_string(i));
  const std::string enc = encode(HostMessage{b});
  CAPTURE(enc.size());
  CHECK(enc.size() < kDefaultLineCap);
  CHECK(enc.size() > kDefaultLineCap * 3 / 4);
  HostDecoded d = decode_host(enc);
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<Boot>(std::get<HostMessage>(d)) == b);
  CHECK(validate(HostMessage{b}).ok());
}

TEST_CASE("range limits: the edges decode, one past them does not") {
  auto exited = [](std::string field, std::string v) {
    return decode_guest(R"({"type":"workload_exited",")" + field + "\":" + v + "}");
  };
  CHECK(summary(exited("exit_code", "0")) == "ok");
  CHECK(summary(exited("exit_code", "255")) == "ok");
  CHECK(error_of(exited("exit_code", "256")) == "workload_exited.exit_code: expected integer 0..255, got 256");
  CHECK(error_of(exited("exit_code", "-1")) == "workload_exited.exit_code: expected integer 0..255, got -1");
  CHECK(summary(exited("signal", "1")) == "ok");
  CHECK(summary(exited("signal", "64")) == "ok");
  CHECK(error_of(exited("signal", "0")) == "workload_exited.signal: expected integer 1..64, got 0");
  CHECK(error_of(exited("signal", "65")) == "workload_exited.signal: expected integer 1..64, got 65");
  CHECK(error_of(decode_host(R"({"type":"kill","signal":0})")) == "kill.signal: expected integer 1..64, got 0");
  CHECK(error_of(decode_host(R"({"type":"kill","signal":65})")) == "kill.signal: expected integer 1..64, got 65");
  CHECK(summary(decode_guest(R"({"type":"started","pid":2147483647})")) == "ok");
  CHECK(error_of(decode_guest(R"({"type":"started","pid":2147483648})")) ==
        "started.pid: expected integer 1..2147483647, got 2147483648");
  CHECK(error_of(decode_guest(R"({"type":"started","pid":0})")) ==
        "started.pid: expected integer 1..2147483647, got 0");

  Boot b = reference_boot();
  b.exec.uid = kU32Max - 1;
  b.exec.gid = kU32Max - 1;
  CHECK(summary(decode_host(encode(HostMessage{b}))) == "ok");
  b.exec.uid = kInvalidId;
  CHECK(error_of(decode_host(encode(HostMessage{b}))) ==
        "boot.exec.uid: expected unsigned 32-bit integer other than 4294967295 (\"unchanged\" to "
        "set*id), got 4294967295");
  // A negative uid (-1, "unchanged" to set*id(2)) in the reference boot line.
  std::string line(kReferenceBootLine);
  line.replace(line.find("\"uid\":0"), 7, "\"uid\":-1");
  CHECK(error_of(decode_host(line)) == "boot.exec.uid: expected unsigned 32-bit integer, got -1");
}

TEST_CASE("workload_exited with both or neither field: refused, and validate() says so") {
  const WorkloadExited both{3, 9}, neither{};
  CHECK(error_of(decode_guest(encode(GuestMessage{both}))) ==
        "workload_exited: expected exactly one of exit_code and signal, got both");
  CHECK(error_of(decode_guest(encode(GuestMessage{neither}))) ==
        "workload_exited: expected exactly one of exit_code and signal, got neither");
  CHECK(!validate(GuestMessage{both}).ok());
  CHECK(!validate(GuestMessage{neither}).ok());
}

TEST_CASE("the reference's shapes decode: fields in any order, cwd null, env omitted, unknown fields") {
  const Boot want = reference_boot();
  CHECK(std::get<Boot>(std::get<HostMessage>(decode_host(kReferenceBootLine))) == want);

  // Every order of the top-level fields (type included) and of exec's fields.
  J tree = J::obj({{"type", J::s("boot")},
                   {"exec", J::obj({{"argv", J::arr({J::s("/bin/sh"), J::s("-c"), J::s("echo hi")})},
                                    {"env", J::obj({{"PATH", J::s("/usr/bin:/bin")}})},
                                    {"cwd", J::null()}, {"uid", J::n(0)}, {"gid", J::n(0)}})},
                   {"mounts", J::arr({J::obj({{"tag", J::s("work")}, {"at", J::s("/work")}, {"ro", J::b(false)}})})},
                   {"geometry", J::obj({{"width", J::n(1920)}, {"height", J::n(1080)}, {"fps", J::n(60)}, {"hdr", J::b(false)}})},
                   {"on_exit", J::obj({{"terminal", J::b(true)}})}});
  auto& top = std::get<J::Obj>(tree.v);
  std::vector<int> order(top.size());
  std::iota(order.begin(), order.end(), 0);
  int n = 0;
  do {
    J t;
    J::Obj o;
    for (int i : order) o.push_back(top[i]);
    t.v = o;
    auto& exec = std::get<J::Obj>(t.at({"exec"})->v);
    std::rotate(exec.begin(), exec.begin() + (n % exec.size()), exec.end());
    std::reverse(exec.begin(), exec.begin() + (n % 3));
    CAPTURE(t.dump());
    HostDecoded d = decode_host(t.dump());
    REQUIRE(summary(d) == "ok");
    CHECK(std::get<Boot>(std::get<HostMessage>(d)) == want);
    ++n;
  } while (std::next_permutation(order.begin(), order.end()));
  CHECK(n == 120);  // 5! orders of type, exec, mounts, geometry, on_exit

  // Optional fields omitted take their defaults.
  HostDecoded d = decode_host(
      R"({"type":"boot","exec":{"argv":["/bin/true"],"uid":0,"gid":0},)"
      R"("geometry":{"width":1,"height":2,"fps":3},"on_exit":{"terminal":false}})");
  REQUIRE(summary(d) == "ok");
  const Boot& b = std::get<Boot>(std::get<HostMessage>(d));
  CHECK(b.exec.env.empty());
  CHECK(!b.exec.cwd);
  CHECK(b.exec.groups.empty());
  CHECK(b.mounts.empty());
  CHECK(!b.geometry.hdr);
  CHECK(!b.on_exit.terminal);
  CHECK(!b.on_exit.halt);
  CHECK(!b.hostname);
  HostDecoded m = decode_host(R"({"type":"boot","exec":{"argv":["x"],"uid":0,"gid":0},)"
                              R"("mounts":[{"tag":"t","at":"/t"}],)"
                              R"("geometry":{"width":1,"height":2,"fps":3},"on_exit":{"terminal":true}})");
  REQUIRE(summary(m) == "ok");
  CHECK(std::get<Boot>(std::get<HostMessage>(m)).mounts == std::vector<Mount>{Mount{"t", "/t", false, FsType::virtiofs}});

  // Unknown fields at every level are ignored, whatever their shape.
  const std::string video = R"({"codec":"h264","layers":[{"id":1,"opts":{"x":[null,true,1.5e3,"s"]}}]})";
  std::string extra(kReferenceBootLine);
  extra.insert(extra.size() - 1, R"(,"video":)" + video + R"(,"z":null,"n":-1.5)");
  extra.insert(extra.find("\"uid\""), R"("future":[1,2],)");
  extra.insert(extra.find("\"tag\""), R"("opts":{"cache":"auto"},)");
  extra.insert(extra.find("\"width\""), R"("dpi":96.5,)");
  extra.insert(extra.find("\"terminal\""), R"("restart":"never",)");
  CAPTURE(extra);
  HostDecoded e = decode_host(extra);
  REQUIRE(summary(e) == "ok");
  CHECK(std::get<Boot>(std::get<HostMessage>(e)) == want);
  CHECK(summary(decode_host(R"({"type":"stop","reason":"user"})")) == "ok");
  CHECK(summary(decode_guest(R"({"protocol_version":2,"type":"ready","features":["x"]})")) == "ok");

  // Whitespace between tokens (the contract's examples are displayed with it) and a trailing \r.
  CHECK(summary(decode_host(" { \"type\" :\t\"stop\" } ")) == "ok");
  CHECK(summary(decode_host(std::string(kReferenceBootLine) + "\r")) == "ok");
  CHECK(summary(decode_guest("{\"type\":\"ready\",\"protocol_version\":2}\r")) == "ok");
}

TEST_CASE("unknown types are skipped, not errors; type_name matches the wire tag") {
  CHECK(summary(decode_host(R"({"type":"resize","width":3})")) == "unknown:resize");
  CHECK(summary(decode_guest(R"({"type":"heartbeat"})")) == "unknown:heartbeat");
  CHECK(summary(decode_guest(R"({"type":""})")) == "unknown:");
  CHECK(summary(decode_host(R"({"type":"Stop"})")) == "unknown:Stop");  // tags are case-sensitive
  // Known to the other direction only: unknown here.
  CHECK(summary(decode_host(R"({"type":"ready","protocol_version":2})")) == "unknown:ready");
  CHECK(summary(decode_guest(R"({"type":"kill","signal":9})")) == "unknown:kill");
  CHECK(type_name(HostMessage{Kill{9}}) == "kill");
  CHECK(type_name(GuestMessage{StartFailed{}}) == "start_failed");
}

TEST_CASE("channel survival fields: boot.reconnect_ms/vm/generation and ready.resume round-trip, bounds hold") {
  Boot b = reference_boot();
  b.reconnect_ms = kReconnectMaxMs;
  b.vm = "web-1";
  b.generation = kGenerationMax;
  const std::string enc = encode(HostMessage{b});
  CAPTURE(enc);
  auto d = decode_host(enc);
  REQUIRE(std::holds_alternative<HostMessage>(d));
  CHECK(std::get<Boot>(std::get<HostMessage>(d)) == b);
  // Absent on the wire when unset: the reference's boot is unchanged byte for byte.
  CHECK(encode(HostMessage{reference_boot()}).find("reconnect_ms") == std::string::npos);

  Ready r{kProtocolVersion, Resume{"web-1", 7, true, false}};
  const std::string renc = encode(GuestMessage{r});
  CHECK(renc == R"({"type":"ready","protocol_version":2,"resume":{"vm":"web-1","generation":7,"started":true,"outcome_pending":false}})");
  auto rd = decode_guest(renc);
  REQUIRE(std::holds_alternative<GuestMessage>(rd));
  CHECK(std::get<Ready>(std::get<GuestMessage>(rd)) == r);

  auto bad = [](std::string_view line) {
    auto x = decode_guest(line);
    REQUIRE(std::holds_alternative<DecodeError>(x));
    return std::get<DecodeError>(x).reason;
  };
  CHECK(bad(R"({"type":"ready","protocol_version":2,"resume":{"vm":"a","started":true,"outcome_pending":false}})")
            .find("ready.resume.generation") != std::string::npos);
  CHECK(bad(R"({"type":"ready","protocol_version":2,"resume":{"vm":"a","generation":0,"started":true,"outcome_pending":false}})")
            .find("ready.resume.generation") != std::string::npos);
  auto hbad = [](std::string_view line) {
    auto x = decode_host(line);
    REQUIRE(std::holds_alternative<DecodeError>(x));
    return std::get<DecodeError>(x).reason;
  };
  std::string big = enc;
  big.replace(big.find("\"reconnect_ms\":3600000"), 22, "\"reconnect_ms\":3600001");
  CHECK(hbad(big).find("boot.reconnect_ms") != std::string::npos);
}

TEST_CASE("warm start fields: boot.entropy and boot.realtime_ns round-trip, after every other field") {
  Boot b = reference_boot();
  b.entropy.emplace();
  for (std::size_t i = 0; i < kEntropyBytes; ++i) (*b.entropy)[i] = static_cast<std::uint8_t>(0xf0 + i % 16);
  (*b.entropy)[0] = 0x00;
  (*b.entropy)[31] = 0x0a;
  b.realtime_ns = 1765000000123456789ull;
  const std::string enc = encode(HostMessage{b});
  CHECK(enc == std::string(kReferenceBootLine.substr(0, kReferenceBootLine.size() - 1)) +
                   R"(,"entropy":"00f1f2f3f4f5f6f7f8f9fafbfcfdfeff)" + R"(f0f1f2f3f4f5f6f7f8f9fafbfcfdfe0a")" +
                   R"(,"realtime_ns":1765000000123456789})");
  auto d = decode_host(enc);
  REQUIRE(std::holds_alternative<HostMessage>(d));
  CHECK(std::get<Boot>(std::get<HostMessage>(d)) == b);
  CHECK(validate(HostMessage{b}).ok());
  // Each alone; the edges of realtime_ns.
  for (std::uint64_t ns : {std::uint64_t{0}, std::uint64_t{9223372036854775807ull}}) {
    Boot t = reference_boot();
    t.realtime_ns = ns;
    auto td = decode_host(encode(HostMessage{t}));
    REQUIRE(std::holds_alternative<HostMessage>(td));
    CHECK(std::get<Boot>(std::get<HostMessage>(td)) == t);
  }
  Boot e = reference_boot();
  e.entropy = Entropy{};  // all zero bytes: still sent
  CHECK(encode(HostMessage{e}).find(R"("entropy":")" + std::string(64, '0') + '"') != std::string::npos);
  // Unset: absent, and the reference's boot is unchanged byte for byte.
  CHECK(encode(HostMessage{reference_boot()}) == kReferenceBootLine);
  // A realtime_ns beyond 2^63-1 cannot be sent: validate() says so before a host writes it.
  Boot big = reference_boot();
  big.realtime_ns = 9223372036854775808ull;
  auto v = validate(HostMessage{big});
  REQUIRE_FALSE(v.ok());
  CHECK(v.error().reason.find("boot.realtime_ns") != std::string::npos);
}

TEST_CASE("fencing: every guest message carries the envelope's generation after its own fields, and back") {
  for (const GuestMessage& m : guest_samples()) {
    CAPTURE(encode(m));
    const std::string line = encode_line(m, GuestEnvelope{42});
    // The message's own fields first, byte for byte, then the envelope.
    std::string plain = encode_line(m);
    CHECK(line == plain.substr(0, plain.size() - 2) + ",\"generation\":42}\n");
    GuestEnvelope env;
    auto d = decode_guest(std::string_view(line).substr(0, line.size() - 1), env);
    REQUIRE(std::holds_alternative<GuestMessage>(d));
    CHECK(std::get<GuestMessage>(d) == m);
    CHECK(env.generation == std::optional<std::uint64_t>(42));
    // Without it (an older init): the same message, no generation; the plain decoder ignores it.
    CHECK(encode_line(m, GuestEnvelope{}) == plain);
    GuestEnvelope none{7};
    auto p = decode_guest(std::string_view(plain).substr(0, plain.size() - 1), none);
    REQUIRE(std::holds_alternative<GuestMessage>(p));
    CHECK_FALSE(none.generation);
    CHECK(std::get<GuestMessage>(decode_guest(std::string_view(line).substr(0, line.size() - 1))) == m);
  }
  CHECK(encode_line(GuestMessage{WorkloadExited::code(7)}, GuestEnvelope{3}) ==
        "{\"type\":\"workload_exited\",\"exit_code\":7,\"generation\":3}\n");
  // A resumed ready: the envelope beside resume.generation (both the boot's).
  CHECK(encode_line(GuestMessage{Ready{kProtocolVersion, Resume{"web", 3, true, true}}}, GuestEnvelope{3}) ==
        R"({"type":"ready","protocol_version":2,"resume":{"vm":"web","generation":3,"started":true,"outcome_pending":true},"generation":3})"
        "\n");
}

TEST_CASE("fencing: a malformed envelope generation is a DecodeError naming the field; the envelope stays unset") {
  auto bad = [](std::string_view line) {
    GuestEnvelope env{9};
    auto x = decode_guest(line, env);
    CHECK_FALSE(env.generation);
    REQUIRE(std::holds_alternative<DecodeError>(x));
    return std::get<DecodeError>(x).reason;
  };
  CHECK(bad(R"({"type":"workload_exited","exit_code":7,"generation":0})") ==
        "workload_exited.generation: expected integer 1..9007199254740991, got 0");
  CHECK(bad(R"({"type":"mounted","generation":9007199254740992})") ==
        "mounted.generation: expected integer 1..9007199254740991, got 9007199254740992");
  CHECK(bad(R"({"type":"started","generation":"3"})") == "started.generation: expected integer 1..9007199254740991, got \"3\"");
  CHECK(bad(R"({"type":"mounted","generation":1,"generation":1})").find("duplicate key \"generation\"") != std::string::npos);
  // An unknown type keeps no envelope; the first field may be the generation.
  GuestEnvelope env{1};
  CHECK(std::holds_alternative<UnknownMessage>(decode_guest(R"({"type":"hello","generation":3})", env)));
  CHECK_FALSE(env.generation);
  auto d = decode_guest(R"({"generation":5,"type":"mounted"})", env);
  CHECK(std::holds_alternative<GuestMessage>(d));
  CHECK(env.generation == std::optional<std::uint64_t>(5));
}

TEST_CASE("exec.container and exec.in (additive): wire shape, round trip, errors naming the field") {
  ExecProcess ex;
  ex.proc = 3;
  ex.exec.argv = {"sh"};
  ex.container = Container{"/run/nes/pod/c1/rootfs", "web", true};
  const std::string line = encode(HostMessage{ex});
  CHECK(line == R"({"type":"exec","proc":3,"exec":{"argv":["sh"],"env":{},"cwd":null,"uid":0,"gid":0},)"
                R"("container":{"root":"/run/nes/pod/c1/rootfs","hostname":"web","readonly":true}})");
  HostDecoded d = decode_host(line);
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<ExecProcess>(std::get<HostMessage>(d)) == ex);
  // Defaults are not written; `in` alone.
  ex.container = Container{"/c2"};
  CHECK(encode(HostMessage{ex}).ends_with(R"(,"container":{"root":"/c2"}})"));
  ex.container.reset();
  ex.in = 3;
  CHECK(encode(HostMessage{ex}).ends_with(R"("gid":0},"in":3})"));
  d = decode_host(encode(HostMessage{ex}));
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<ExecProcess>(std::get<HostMessage>(d)) == ex);
  // A null container is none.
  d = decode_host(R"({"type":"exec","proc":1,"exec":{"argv":["sh"],"uid":0,"gid":0},"container":null})");
  REQUIRE(summary(d) == "ok");
  CHECK(!std::get<ExecProcess>(std::get<HostMessage>(d)).container);

  const std::string head = R"({"type":"exec","proc":1,"exec":{"argv":["sh"],"uid":0,"gid":0},)";
  auto err = [&](const std::string& tail) { return error_of(decode_host(head + tail + "}")); };
  CHECK(err(R"("container":{})") == "exec.container.root: missing (expected absolute path)");
  CHECK(err(R"("container":{"root":"rel/x"})") ==
        R"(exec.container.root: expected absolute path of 2..4000 bytes other than "/", got "rel/x")");
  CHECK(err(R"("container":{"root":"/"})").starts_with("exec.container.root: expected absolute path"));
  CHECK(err(R"("container":{"root":")" + std::string(4001, 'a') + "\"}").starts_with("exec.container.root: expected absolute path"));
  CHECK(err(R"("container":{"root":7})") == "exec.container.root: expected string, got 7");
  CHECK(err(R"("container":{"root":"/r","hostname":"a b"})").starts_with("exec.container.hostname: expected name of 1..253"));
  CHECK(err(R"("container":{"root":"/r","readonly":1})") == "exec.container.readonly: expected boolean, got 1");
  CHECK(err(R"("container":[])").starts_with("exec.container: expected object"));
  CHECK(err(R"("in":0)") == "exec.in: expected integer 1..65535, got 0");
  CHECK(err(R"("in":2,"container":{"root":"/r"})").starts_with("exec.in: set with exec.container"));
}

TEST_CASE("exec.container.mounts (additive): wire shape, round trip, errors naming the field") {
  ExecProcess ex;
  ex.proc = 2;
  ex.exec.argv = {"sh"};
  ContainerMount b{"/var/run/secrets/kubernetes.io/serviceaccount", "/run/nes/pod/d/m0", FsType::bind, true, true, true,
                   true, "", "rslave"};
  ContainerMount t{"/cache", "", FsType::tmpfs, false, true, false, false, "size=1m,mode=1777", ""};
  ex.container = Container{"/run/nes/pod/d/rootfs", std::nullopt, false, {b, t}};
  const std::string line = encode(HostMessage{ex});
  CHECK(line.ends_with(R"("container":{"root":"/run/nes/pod/d/rootfs","mounts":[)"
                       R"({"dst":"/var/run/secrets/kubernetes.io/serviceaccount","fs":"bind","src":"/run/nes/pod/d/m0",)"
                       R"("ro":true,"nosuid":true,"nodev":true,"noexec":true,"propagation":"rslave"},)"
                       R"({"dst":"/cache","fs":"tmpfs","nosuid":true,"data":"size=1m,mode=1777"}]}})"));
  HostDecoded d = decode_host(line);
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<ExecProcess>(std::get<HostMessage>(d)) == ex);

  const std::string head = R"({"type":"exec","proc":1,"exec":{"argv":["sh"],"uid":0,"gid":0},"container":{"root":"/r","mounts":[)";
  auto err = [&](const std::string& m) { return error_of(decode_host(head + m + "]}}")); };
  CHECK(err(R"({"dst":"/a/../b","fs":"bind","src":"/x"})").starts_with("exec.container.mounts[0].dst: expected absolute path"));
  CHECK(err(R"({"dst":"/a/","fs":"bind","src":"/x"})").starts_with("exec.container.mounts[0].dst: expected absolute path"));
  CHECK(err(R"({"dst":"/a","fs":"bind"})") == "exec.container.mounts[0].src: missing (expected absolute path)");
  CHECK(err(R"({"dst":"/a"})") == "exec.container.mounts[0].fs: missing (expected bind or tmpfs)");
  CHECK(err(R"({"dst":"/a","fs":"virtiofs","src":"/x"})").starts_with("exec.container.mounts[0].fs: expected"));
  CHECK(err(R"({"dst":"/a","fs":"tmpfs","propagation":"up"})").starts_with("exec.container.mounts[0].propagation: expected private"));
  CHECK(err(R"({"dst":"/a","fs":"tmpfs","data":")" + std::string(257, 'a') + R"("})")
            .starts_with("exec.container.mounts[0].data: expected tmpfs options"));
  std::string many;
  for (int i = 0; i <= 64; ++i) many += std::string(i ? "," : "") + R"({"dst":"/a","fs":"tmpfs"})";
  CHECK(err(many) == "exec.container.mounts: more than 64 mounts");
}

TEST_CASE("exec.container.resources (additive, feature resources): wire shape, round trip, errors naming the field") {
  ExecProcess ex;
  ex.proc = 2;
  ex.exec.argv = {"sh"};
  ex.container = Container{"/c"};
  ex.container->resources = ContainerResources{64u << 20, 50000, 100000, 39, 100};
  const std::string line = encode(HostMessage{ex});
  CHECK(line.ends_with(R"("container":{"root":"/c","resources":{"memory_max":67108864,"cpu_quota":50000,)"
                       R"("cpu_period":100000,"cpu_weight":39,"pids_max":100}}})"));
  HostDecoded d = decode_host(line);
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<ExecProcess>(std::get<HostMessage>(d)) == ex);
  // Unset fields are not written; 0 (no limit) is.
  ex.container->resources = ContainerResources{0, std::nullopt, std::nullopt, std::nullopt, std::nullopt};
  CHECK(encode(HostMessage{ex}).ends_with(R"("resources":{"memory_max":0}}})"));
  d = decode_host(encode(HostMessage{ex}));
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<ExecProcess>(std::get<HostMessage>(d)) == ex);

  const std::string head = R"({"type":"exec","proc":1,"exec":{"argv":["sh"],"uid":0,"gid":0},"container":{"root":"/r","resources":)";
  auto err = [&](const std::string& r) { return error_of(decode_host(head + r + "}}")); };
  CHECK(err(R"({"memory_max":-1})") == "exec.container.resources.memory_max: expected integer 0..9007199254740991, got -1");
  CHECK(err(R"({"pids_max":"x"})").starts_with("exec.container.resources.pids_max: expected integer"));
  CHECK(err(R"({"cpu_quota":999})") == "exec.container.resources.cpu_quota: expected 0 (no limit) or 1000..9007199254740991 (µs), got 999");
  CHECK(err(R"({"cpu_period":999})") == "exec.container.resources.cpu_period: expected integer 1000..1000000 (µs), got 999");
  CHECK(err(R"({"cpu_weight":0})") == "exec.container.resources.cpu_weight: expected integer 1..10000, got 0");
  CHECK(err(R"({"cpu_weight":10001})") == "exec.container.resources.cpu_weight: expected integer 1..10000, got 10001");
  CHECK(err(R"([])").starts_with("exec.container.resources: expected object"));
}

TEST_CASE("boot.root: a block root (erofs/ext4 on a virtio-blk serial) round-trips; bad values name the field") {
  Boot b = reference_boot();
  b.root = Root{"nes.root", false, FsType::erofs, 64};
  CHECK(encode(HostMessage{b}).find(R"("root":{"tag":"nes.root","ro":false,"fs":"erofs","upper_mib":64},)") !=
        std::string::npos);
  auto d = decode_host(encode(HostMessage{b}));
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<Boot>(std::get<HostMessage>(d)).root == b.root);
  b.root = Root{"a", true, FsType::ext4, 0, std::string(20, 'u')};
  CHECK(encode(HostMessage{b}).find(R"("root":{"tag":"a","ro":true,"fs":"ext4","upper":"uuuuuuuuuuuuuuuuuuuu"},)") !=
        std::string::npos);
  d = decode_host(encode(HostMessage{b}));
  REQUIRE(summary(d) == "ok");
  CHECK(std::get<Boot>(std::get<HostMessage>(d)).root == b.root);
  CHECK(is_block_fs(FsType::erofs));
  CHECK(is_block_fs(FsType::ext4));
  CHECK(!is_block_fs(FsType::virtiofs));

  auto err = [](const std::string& root) {
    std::string line(kReferenceBootLine.substr(0, kReferenceBootLine.size() - 1));
    return error_of(decode_host(line + R"(,"root":)" + root + "}"));
  };
  CHECK(err(R"({"tag":"x","fs":"erofs","upper_mib":1048577})") ==
        "boot.root.upper_mib: expected integer 0..1048576, got 1048577");
  CHECK(err(R"({"tag":"x","fs":"erofs","upper_mib":-1})") == "boot.root.upper_mib: expected integer 0..1048576, got -1");
  CHECK(err(R"({"tag":"x","fs":"erofs","upper_mib":"8"})") == R"(boot.root.upper_mib: expected integer 0..1048576, got "8")");
  CHECK(err(R"({"tag":"x","fs":"erofs","upper":""})") ==
        R"(boot.root.upper: expected virtio-blk serial of 1..20 of [A-Za-z0-9._-], got "")");
  CHECK(err(R"({"tag":"x","fs":"erofs","upper":"a,b"})").starts_with("boot.root.upper: expected virtio-blk serial"));
  CHECK(err(R"({"tag":"x","fs":"erofs","upper":7})") == "boot.root.upper: expected string, got 7");
  CHECK(err(R"({"tag":")" + std::string(21, 'a') + R"(","fs":"erofs"})").starts_with("boot.root.tag: expected virtio-blk serial"));
  CHECK(err(R"({"tag":"a b","fs":"ext4"})") == R"(boot.root.tag: expected virtio-blk serial of 1..20 of [A-Za-z0-9._-], got "a b")");
  CHECK(err(R"({"tag":"x","fs":"ext4","upper":"s","upper_mib":8})") ==
        "boot.root.upper_mib: not with upper (a scratch disk's size is its own)");
  CHECK(err(R"({"tag":"x","fs":"ext4","upper":"x"})") == "boot.root.upper: the same disk as tag");
  CHECK(err(R"({"tag":"x","upper":"s"})") == "boot.root.upper: only with a block root (fs erofs or ext4)");
  CHECK(err(R"({"tag":"x","fs":"9p","upper_mib":8})") == "boot.root.upper_mib: only with a block root (fs erofs or ext4)");
  // A share root's tag keeps its own (looser) rule: a virtiofs tag may be longer than a serial.
  CHECK(err(R"({"tag":")" + std::string(30, 'a') + R"(","fs":"virtiofs"})") == "");
  // erofs/ext4 are a root's alone: a share is never a block device.
  CHECK(error_of(decode_host(R"({"type":"boot","exec":{"argv":["x"],"uid":0,"gid":0},"mounts":[{"tag":"t","at":"/t","fs":"erofs"}],)"
                             R"("geometry":{"width":1,"height":1,"fps":1},"on_exit":{"terminal":true}})"))
            .starts_with(R"(boot.mounts[0].fs: expected one of "virtiofs", "9p", "tmpfs", "bind", got "erofs")"));
}
