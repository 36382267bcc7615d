// The task's record and its Delete's receipt (host/shim/task_record.hpp).
#include "host/shim/task_record.hpp"

#include <cerrno>

#include <fmt/format.h>
#include <simdjson.h>

#include "base/small_file.hpp"
#include "host/lib/record.hpp"
#include "host/lib/state_dir.hpp"

namespace nes::shim {
namespace fs = std::filesystem;
using host::Error;
using host::Result;

std::string encode_task_record(const TaskRecord& r) {
  std::string pod;
  if (!r.pod_share.empty()) pod += fmt::format(R"(,"pod_share":{})", host::json_string(r.pod_share.string()));
  if (r.container) pod += R"(,"container":true)";
  if (!r.stdin_path.empty()) pod += fmt::format(R"(,"stdin":{})", host::json_string(r.stdin_path));
  if (!r.stdout_path.empty()) pod += fmt::format(R"(,"stdout":{})", host::json_string(r.stdout_path));
  if (!r.stderr_path.empty()) pod += fmt::format(R"(,"stderr":{})", host::json_string(r.stderr_path));
  if (r.terminal) pod += R"(,"terminal":true)";
  if (r.created) pod += R"(,"created":true)";
  if (r.stdin_closed) pod += R"(,"stdin_closed":true)";
  if (r.control_seq) pod += fmt::format(R"(,"control_seq":{})", r.control_seq);
  if (!r.controls.empty()) {
    pod += R"(,"controls":[)";
    for (std::size_t i = 0; i < r.controls.size(); ++i)
      pod += fmt::format(R"({}{{"seq":{},"request":{}}})", i ? "," : "", r.controls[i].seq,
                         host::json_string(r.controls[i].request));
    pod += "]";
  }
  return fmt::format(R"({{"schema_version":1,"id":{},"vm":{},"state_dir":{},"pid":{},"pid_start":{},"mounted_rootfs":{}{}}})"
                     "\n",
                     host::json_string(r.id), host::json_string(r.vm), host::json_string(r.state_dir.string()), r.pid,
                     r.pid_start, r.mounted_rootfs, pod);
}

Result<TaskRecord> parse_task_record(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::object o;
  if (parser.parse(padded).get_object().get(o)) return Error{"nesinit-task.json: expected a JSON object"};
  TaskRecord r;
  std::string_view s;
  std::uint64_t u = 0;
  if (o["schema_version"].get_uint64().get(u) || u != 1) return Error{"nesinit-task.json: schema_version: expected 1"};
  if (o["id"].get_string().get(s)) return Error{"nesinit-task.json: id: expected a string"};
  r.id = std::string(s);
  if (o["vm"].get_string().get(s) || !host::check_vm_id(s)) return Error{"nesinit-task.json: vm: expected a VM id"};
  r.vm = std::string(s);
  if (o["state_dir"].get_string().get(s) || s.empty() || s.front() != '/')
    return Error{"nesinit-task.json: state_dir: expected an absolute path"};
  r.state_dir = std::string(s);
  if (o["pid"].get_uint64().get(u) || u > 0x7fffffff) return Error{"nesinit-task.json: pid: expected a pid"};
  r.pid = static_cast<pid_t>(u);
  if (o["pid_start"].get_uint64().get(u)) return Error{"nesinit-task.json: pid_start: expected an integer"};
  r.pid_start = u;
  if (o["mounted_rootfs"].get_bool().get(r.mounted_rootfs)) return Error{"nesinit-task.json: mounted_rootfs: expected a boolean"};
  if (auto e = o["pod_share"]; e.error() != simdjson::NO_SUCH_FIELD) {
    if (e.get_string().get(s) || s.empty() || s.front() != '/')
      return Error{"nesinit-task.json: pod_share: expected an absolute path"};
    r.pod_share = std::string(s);
  }
  if (auto e = o["container"]; e.error() != simdjson::NO_SUCH_FIELD && e.get_bool().get(r.container))
    return Error{"nesinit-task.json: container: expected a boolean"};
  if (r.container && r.pod_share.empty()) return Error{"nesinit-task.json: pod_share: required for a container"};
  for (auto [name, field] : {std::pair{"stdin", &r.stdin_path}, {"stdout", &r.stdout_path}, {"stderr", &r.stderr_path}}) {
    if (auto e = o[name]; e.error() != simdjson::NO_SUCH_FIELD) {
      if (e.get_string().get(s)) return Error{fmt::format("nesinit-task.json: {}: expected a string", name)};
      *field = std::string(s);
    }
  }
  if (auto e = o["terminal"]; e.error() != simdjson::NO_SUCH_FIELD && e.get_bool().get(r.terminal))
    return Error{"nesinit-task.json: terminal: expected a boolean"};
  if (auto e = o["created"]; e.error() != simdjson::NO_SUCH_FIELD && e.get_bool().get(r.created))
    return Error{"nesinit-task.json: created: expected a boolean"};
  if (auto e = o["stdin_closed"]; e.error() != simdjson::NO_SUCH_FIELD && e.get_bool().get(r.stdin_closed))
    return Error{"nesinit-task.json: stdin_closed: expected a boolean"};
  if (auto e = o["control_seq"]; e.error() != simdjson::NO_SUCH_FIELD && e.get_uint64().get(r.control_seq))
    return Error{"nesinit-task.json: control_seq: expected an integer"};
  if (auto e = o["controls"]; e.error() != simdjson::NO_SUCH_FIELD) {
    simdjson::dom::array a;
    if (e.get_array().get(a) || a.size() > kPendingControlsMax)
      return Error{fmt::format("nesinit-task.json: controls: expected an array of at most {}", kPendingControlsMax)};
    for (auto c : a) {
      PendingControl pc;
      if (c["seq"].get_uint64().get(pc.seq) || pc.seq == 0 || pc.seq > r.control_seq)
        return Error{"nesinit-task.json: controls: seq: expected an integer 1..control_seq"};
      if (c["request"].get_string().get(s)) return Error{"nesinit-task.json: controls: request: expected a string"};
      pc.request = std::string(s);
      r.controls.push_back(std::move(pc));
    }
  }
  return r;
}

Result<std::optional<TaskRecord>> load_task_record(const fs::path& bundle) {
  auto text = base::read_small_file((bundle / kTaskFile).c_str(), 64 * 1024);
  if (!text) {
    if (text.error().err == ENOENT) return std::optional<TaskRecord>{};
    return text.error();
  }
  auto r = parse_task_record(*text);
  if (!r) return r.error();
  return std::optional<TaskRecord>(std::move(*r));
}
std::string encode_receipt(const Cleanup& c) {
  return fmt::format(R"({{"schema_version":1,"pid":{},"exit_status":{},"exited_at_ns":{}}})"
                     "\n",
                     c.pid, c.exit_status, c.exited_at_ns);
}

host::Result<Cleanup> parse_receipt(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(json);
  simdjson::dom::object o;
  if (parser.parse(padded).get_object().get(o)) return Error{"nesinit-deleted.json: expected a JSON object"};
  std::uint64_t u = 0;
  std::int64_t i = 0;
  Cleanup c;
  if (o["schema_version"].get_uint64().get(u) || u != 1) return Error{"nesinit-deleted.json: schema_version: expected 1"};
  if (o["pid"].get_uint64().get(u) || u > 0x7fffffff) return Error{"nesinit-deleted.json: pid: expected a pid"};
  c.pid = static_cast<pid_t>(u);
  if (o["exit_status"].get_uint64().get(u) || u > 0xffffffffu) return Error{"nesinit-deleted.json: exit_status: expected a u32"};
  c.exit_status = static_cast<std::uint32_t>(u);
  if (o["exited_at_ns"].get_int64().get(i)) return Error{"nesinit-deleted.json: exited_at_ns: expected an integer"};
  c.exited_at_ns = i;
  return c;
}

std::optional<Cleanup> load_receipt(const fs::path& bundle) {
  auto t = base::read_small_file((bundle / kReceiptFile).c_str(), 4096);
  if (!t) return std::nullopt;
  auto c = parse_receipt(*t);
  if (!c) return std::nullopt;
  return *c;
}

}  // namespace nes::shim
