#include "status.hpp"

#include <array>
#include <utility>

namespace nes::proto {

int exit_status(const WorkloadExited& m) {
  if (m.signal) return kStatusSignalBase + *m.signal;
  return m.exit_code.value_or(0);
}

int exit_status(const StartFailed& m) {
  return m.cls == StartFailClass::not_found ? kStatusNotFound : kStatusNotExecutable;
}

int exit_status(const MountFailed&) { return kStatusHostFailure; }
int exit_status(const NetworkFailed&) { return kStatusHostFailure; }

int exit_status(Outcome o, std::optional<std::uint8_t> exit_code,
                std::optional<std::uint8_t> signal, std::optional<StartFailClass> cls) {
  switch (o) {
    case Outcome::exited: return exit_code.value_or(0);
    case Outcome::signalled: return kStatusSignalBase + signal.value_or(0);
    case Outcome::start_failed:
      return cls == StartFailClass::not_found ? kStatusNotFound : kStatusNotExecutable;
    case Outcome::timeout: return kStatusTimeout;
    case Outcome::stopped: return kStatusStopped;
    case Outcome::mount_failed:
    case Outcome::network_failed:
    case Outcome::channel_lost:
    case Outcome::protocol_error:
    case Outcome::no_ready:
    case Outcome::version_mismatch: return kStatusHostFailure;
  }
  return kStatusHostFailure;
}

namespace {
constexpr std::array<std::pair<Outcome, std::string_view>, 11> kOutcomeNames{{
    {Outcome::exited, "exited"},
    {Outcome::signalled, "signalled"},
    {Outcome::start_failed, "start_failed"},
    {Outcome::mount_failed, "mount_failed"},
    {Outcome::network_failed, "network_failed"},
    {Outcome::channel_lost, "channel_lost"},
    {Outcome::protocol_error, "protocol_error"},
    {Outcome::no_ready, "no_ready"},
    {Outcome::version_mismatch, "version_mismatch"},
    {Outcome::timeout, "timeout"},
    {Outcome::stopped, "stopped"},
}};
}  // namespace

std::string_view to_string(Outcome o) {
  for (auto& [k, n] : kOutcomeNames)
    if (k == o) return n;
  return "unknown";
}

std::optional<Outcome> outcome_from_string(std::string_view s) {
  for (auto& [k, n] : kOutcomeNames)
    if (n == s) return k;
  return std::nullopt;
}

std::string_view to_string(StartFailClass c) {
  switch (c) {
    case StartFailClass::not_found: return "not_found";
    case StartFailClass::not_executable: return "not_executable";
    case StartFailClass::other: return "other";
  }
  return "other";
}

std::string_view to_string(FsType f) {
  switch (f) {
    case FsType::virtiofs: return "virtiofs";
    case FsType::ninep: return "9p";
    case FsType::tmpfs: return "tmpfs";
    case FsType::bind: return "bind";
    case FsType::erofs: return "erofs";
    case FsType::ext4: return "ext4";
  }
  return "virtiofs";
}

std::string_view to_string(Halt h) { return h == Halt::reboot ? "reboot" : "poweroff"; }

std::string_view to_string(StdioMode m) { return m == StdioMode::lossy ? "lossy" : "lossless"; }

}  // namespace nes::proto
