#include "host/image/tool.hpp"

#include <cerrno>
#include <chrono>
#include <memory>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "host/vm/process.hpp"

namespace nes::image {

namespace {
constexpr std::size_t kStderrTail = 2048;  // the last bytes of a tool's output kept for its error
constexpr auto kToolBound = std::chrono::hours(1);  // a mkfs of a many-GiB root under load
}  // namespace

Status run_tool(const std::vector<std::string>& argv, std::string_view package) {
  if (auto p = vm::resolve_program(argv[0]); !p)
    return Error{fmt::format("{} (install Debian's {})", p.error().message, package), ENOENT};
  auto out = std::make_shared<std::pair<std::mutex, std::string>>();
  auto sink = [out](std::string_view s) {
    std::lock_guard g(out->first);
    out->second.append(s);
    if (out->second.size() > kStderrTail) out->second.erase(0, out->second.size() - kStderrTail);
  };
  vm::LaunchOptions o;
  o.argv = argv;
  o.console = sink;
  o.diagnostics = sink;
  auto proc = vm::VmProcess::launch(std::move(o));
  if (!proc) return Error{fmt::format("{}: {}", argv[0], proc.error().message), proc.error().err};
  auto ex = (*proc)->wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(kToolBound));
  if (!ex) ex = (*proc)->terminate(std::chrono::seconds(5));
  (*proc)->finish_output(std::chrono::seconds(5));
  if (ex->code == 0) return Ok{};
  std::string said;
  {
    std::lock_guard g(out->first);
    said = out->second;
  }
  while (!said.empty() && (said.back() == '\n' || said.back() == ' ')) said.pop_back();
  return Error{fmt::format("{} {}: {}", argv[0], vm::describe(*ex), said.empty() ? "(no output)" : said), EIO};
}

}  // namespace nes::image
