#include "host/monitor/vmm_record.hpp"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <simdjson.h>

#include "base/small_file.hpp"
#include "host/lib/record.hpp"
#include "host/lib/state_dir.hpp"
#include "protocol/codec.hpp"

namespace nes::host {

namespace fs = std::filesystem;

namespace {

std::string encode_identity(const ProcessIdentity& id) {
  return fmt::format(R"({{"pid":{},"start_time":{},"boot_id":{}}})", id.pid, id.start_time, json_string(id.boot_id));
}

Result<ProcessIdentity> parse_identity(simdjson::dom::element e, std::string_view field) {
  simdjson::dom::object o;
  if (e.get(o)) return Error{fmt::format("{}: expected an object", field)};
  ProcessIdentity id;
  std::uint64_t u = 0;
  if (o["pid"].get_uint64().get(u) || u < 1 || u > 0x3fffffff) return Error{fmt::format("{}.pid: expected a pid", field)};
  id.pid = static_cast<pid_t>(u);
  if (o["start_time"].get_uint64().get(u)) return Error{fmt::format("{}.start_time: expected an unsigned integer", field)};
  id.start_time = u;
  std::string_view s;
  if (o["boot_id"].get_string().get(s)) return Error{fmt::format("{}.boot_id: expected a string", field)};
  id.boot_id = std::string(s);
  return id;
}

/// The duty fields (VmmInfo::started_at .. netns), each with its leading comma; absent when unset.
std::string duties(const VmmInfo& v) {
  std::string out;
  if (v.started_at) out += fmt::format(R"(,"started_at":"{}")", format_rfc3339(*v.started_at));
  if (v.wall_timeout) out += fmt::format(R"(,"timeout_ms":{})", v.wall_timeout->count());
  if (v.wall_deadline_ns) out += fmt::format(R"(,"deadline_boottime_ns":{})", *v.wall_deadline_ns);
  if (v.netns)
    out += fmt::format(R"(,"netns":{{"path":{},"tap":{},"interface":{}}})", json_string(v.netns->path.native()),
                       json_string(v.netns->tap), json_string(v.netns->interface));
  return out;
}

/// Parses the duty fields into `v` (each optional). Errors name the field.
Status parse_duties(simdjson::dom::object obj, VmmInfo& v) {
  std::string_view s;
  std::uint64_t u = 0;
  std::int64_t i = 0;
  simdjson::dom::element e;
  if (!obj["started_at"].get(e)) {
    auto t = e.get_string().get(s) ? std::nullopt : parse_rfc3339(s);
    if (!t) return Error{"started_at: expected an RFC 3339 time"};
    v.started_at = *t;
  }
  if (!obj["timeout_ms"].get(e)) {
    if (e.get_uint64().get(u) || u > 365ull * 86400 * 1000) return Error{"timeout_ms: expected milliseconds"};
    v.wall_timeout = std::chrono::milliseconds(u);
  }
  if (!obj["deadline_boottime_ns"].get(e)) {
    if (e.get_int64().get(i) || i < 0) return Error{"deadline_boottime_ns: expected nanoseconds"};
    v.wall_deadline_ns = i;
  }
  if (!obj["netns"].get(e) && !e.is_null()) {
    VmmNetns n;
    if (e["path"].get_string().get(s) || s.empty() || s.size() > 4096) return Error{"netns.path: expected a path"};
    n.path = std::string(s);
    if (e["tap"].get_string().get(s) || s.empty() || s.size() > 15) return Error{"netns.tap: expected an interface name"};
    n.tap = std::string(s);
    if (e["interface"].get_string().get(s) || s.empty() || s.size() > 15)
      return Error{"netns.interface: expected an interface name"};
    n.interface = std::string(s);
    v.netns = std::move(n);
  }
  return Ok{};
}

}  // namespace

std::int64_t boottime_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

namespace {

/// `,"stdout":{...},"stderr":{...}` for the sinks recorded (nothing for none).
std::string sinks(const VmmInfo& v) {
  std::string out;
  for (auto [name, sink] : {std::pair{"stdout", &v.stdout_sink}, {"stderr", &v.stderr_sink}})
    if (*sink)
      out += fmt::format(R"(,"{}":{{"kind":"{}","path":{}}})", name,
                         (*sink)->kind == VmmSink::Kind::fifo ? "fifo" : "file", json_string((*sink)->path.native()));
  return out;
}

/// The sinks back; errors name the field ("stdout.kind: expected fifo or file").
Status parse_sinks(simdjson::dom::object& obj, VmmInfo& v) {
  for (auto [name, sink] : {std::pair{"stdout", &v.stdout_sink}, {"stderr", &v.stderr_sink}}) {
    simdjson::dom::element e;
    if (obj[name].get(e) || e.is_null()) continue;  // absent (an older vmm.json): none
    std::string_view s;
    VmmSink k;
    if (e["kind"].get_string().get(s) || (s != "fifo" && s != "file"))
      return Error{fmt::format("{}.kind: expected fifo or file", name)};
    k.kind = s == "fifo" ? VmmSink::Kind::fifo : VmmSink::Kind::file;
    if (e["path"].get_string().get(s) || s.empty() || s[0] != '/' || s.size() > 4096)
      return Error{fmt::format("{}.path: expected an absolute path", name)};
    k.path = std::string(s);
    *sink = std::move(k);
  }
  return Ok{};
}

}  // namespace

std::string encode_vmm(const VmmInfo& v) {
  std::string daemons = "[";
  for (std::size_t i = 0; i < v.daemons.size(); ++i)
    daemons += fmt::format(R"({}{{"name":{},"process":{}}})", i ? "," : "", json_string(v.daemons[i].name),
                           encode_identity(v.daemons[i].id));
  daemons += "]";
  return fmt::format(
      R"({{"schema_version":{},"vm":{},"generation":{},"vmm":{},"daemons":{},"runtime_dir":{},)"
      R"("channel_socket":{},"data_socket":{},"sandbox":{},"on_exit":"{}","stop_timeout_ms":{},)"
      R"("grace_ms":{},"reconnect_ms":{},"log_max_size":{},"log_max_files":{},"rm":{},"stdin":{}{}}})"
      "\n",
      VmmInfo::kSchemaVersion, json_string(v.vm), v.generation, v.vmm ? encode_identity(*v.vmm) : "null", daemons,
      json_string(v.runtime_dir.native()), json_string(v.channel_socket.native()), json_string(v.data_socket.native()),
      v.sandbox, to_string(v.on_exit), v.stop_timeout.count(), v.grace.count(), v.reconnect.count(), v.log_max_size,
      v.log_max_files, v.rm,
      v.stdin_source ? fmt::format(R"({{"kind":"{}","path":{},"offset":{}}})",
                                   v.stdin_source->kind == VmmStdin::Kind::fifo ? "fifo" : "file",
                                   json_string(v.stdin_source->path.native()), v.stdin_source->offset)
                     : std::string("null"),
      duties(v) + sinks(v));
}

Result<VmmInfo> parse_vmm(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::object obj;
  if (auto err = parser.parse(padded).get(obj))
    return Error{fmt::format("not a JSON object ({})", simdjson::error_message(err))};
  VmmInfo v;
  std::uint64_t u = 0;
  if (obj["schema_version"].get_uint64().get(u) || u != VmmInfo::kSchemaVersion)
    return Error{fmt::format("schema_version: expected {}", VmmInfo::kSchemaVersion)};
  std::string_view s;
  if (obj["vm"].get_string().get(s) || !check_vm_id(s)) return Error{"vm: expected a VM id"};
  v.vm = std::string(s);
  if (obj["generation"].get_uint64().get(u) || (v.generation = u) == 0)
    return Error{"generation: expected an integer >= 1"};
  simdjson::dom::element vmm;
  if (obj["vmm"].get(vmm)) return Error{"vmm: missing"};
  if (!vmm.is_null()) {
    auto id = parse_identity(vmm, "vmm");
    if (!id) return id.error();
    v.vmm = *id;
  }
  simdjson::dom::array ds;
  if (obj["daemons"].get_array().get(ds)) return Error{"daemons: expected an array"};
  std::size_t i = 0;
  for (auto d : ds) {
    const std::string field = fmt::format("daemons[{}]", i++);
    if (i > 64) return Error{"daemons: more than 64"};
    VmmDaemon vd;
    if (d["name"].get_string().get(s) || s.size() > 256) return Error{field + ".name: expected a string"};
    vd.name = std::string(s);
    simdjson::dom::element p;
    if (d["process"].get(p)) return Error{field + ".process: missing"};
    auto id = parse_identity(p, field + ".process");
    if (!id) return id.error();
    vd.id = *id;
    v.daemons.push_back(std::move(vd));
  }
  for (auto [name, dst] : {std::pair{"runtime_dir", &v.runtime_dir}, std::pair{"channel_socket", &v.channel_socket},
                           std::pair{"data_socket", &v.data_socket}}) {
    if (obj[name].get_string().get(s) || s.empty() || s[0] != '/')
      return Error{fmt::format("{}: expected an absolute path", name)};
    *dst = std::string(s);
  }
  if (obj["sandbox"].get_bool().get(v.sandbox)) return Error{"sandbox: expected a boolean"};
  if (obj["on_exit"].get_string().get(s)) return Error{"on_exit: expected stop, keep or remove"};
  auto pol = on_exit_from_string(s);
  if (!pol) return Error{"on_exit: expected stop, keep or remove"};
  v.on_exit = *pol;
  for (auto [name, dst] : {std::pair{"stop_timeout_ms", &v.stop_timeout}, std::pair{"grace_ms", &v.grace},
                           std::pair{"reconnect_ms", &v.reconnect}}) {
    if (obj[name].get_uint64().get(u) || u > 365ull * 86400 * 1000)
      return Error{fmt::format("{}: expected milliseconds", name)};
    *dst = std::chrono::milliseconds(u);
  }
  if (obj["log_max_size"].get_uint64().get(u)) return Error{"log_max_size: expected bytes"};
  v.log_max_size = u;
  if (obj["log_max_files"].get_uint64().get(u) || u < 1 || u > 1000) return Error{"log_max_files: expected 1..1000"};
  v.log_max_files = static_cast<unsigned>(u);
  if (obj["rm"].get_bool().get(v.rm)) return Error{"rm: expected a boolean"};
  simdjson::dom::element in;
  if (!obj["stdin"].get(in) && !in.is_null()) {  // absent (an older vmm.json) or null: no source
    VmmStdin src;
    if (in["kind"].get_string().get(s) || (s != "fifo" && s != "file"))
      return Error{"stdin.kind: expected fifo or file"};
    src.kind = s == "fifo" ? VmmStdin::Kind::fifo : VmmStdin::Kind::file;
    if (in["path"].get_string().get(s) || s.empty() || s[0] != '/' || s.size() > 4096)
      return Error{"stdin.path: expected an absolute path"};
    src.path = std::string(s);
    if (in["offset"].get_uint64().get(src.offset)) return Error{"stdin.offset: expected bytes"};
    v.stdin_source = std::move(src);
  }
  if (auto d = parse_duties(obj, v); !d) return d.error();
  if (auto d = parse_sinks(obj, v); !d) return d.error();
  return v;
}

Status write_vmm(const fs::path& state_dir, const VmmInfo& v) {
  if (auto s = write_durable(state_dir / v.vm, kVmmFile, encode_vmm(v)); !s)
    return Error{fmt::format("{}: {}", vm_path(state_dir, v.vm, kVmmFile).string(), s.error().message)};
  return Ok{};
}

Result<std::optional<VmmInfo>> load_vmm(const fs::path& state_dir, std::string_view vm) {
  const fs::path p = vm_path(state_dir, vm, kVmmFile);
  auto text = base::read_small_file(p.c_str(), 1u << 20);
  if (!text && text.error().err == ENOENT) return std::optional<VmmInfo>{};
  if (!text) return Error{fmt::format("{}: {}", p.string(), text.error().message)};
  auto v = parse_vmm(*text);
  if (!v) return Error{fmt::format("{}: {}", p.filename().string(), v.error().message)};
  return std::optional<VmmInfo>{std::move(*v)};
}

Status write_boot(const fs::path& state_dir, std::string_view vm, const proto::Boot& b) {
  return write_durable(state_dir / std::string(vm), kBootFile, proto::encode_line(proto::HostMessage{b}));
}

Result<proto::Boot> load_boot(const fs::path& state_dir, std::string_view vm) {
  const fs::path p = vm_path(state_dir, vm, kBootFile);
  auto text = base::read_small_file(p.c_str(), 4u << 20);
  if (!text) return Error{fmt::format("{}: {}", p.string(), text.error().message)};
  std::string_view line = *text;
  while (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  auto d = proto::decode_host(line);
  if (auto* e = std::get_if<proto::DecodeError>(&d)) return Error{fmt::format("{}: {}", p.string(), e->reason)};
  auto* m = std::get_if<proto::HostMessage>(&d);
  if (!m || !std::holds_alternative<proto::Boot>(*m)) return Error{fmt::format("{}: not a boot message", p.string())};
  return std::get<proto::Boot>(*m);
}

bool vmm_alive(const VmmInfo& v) { return v.vmm && is_alive(*v.vmm); }

}  // namespace nes::host
