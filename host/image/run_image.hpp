// `neshost run IMAGE [COMMAND [ARG...]]`: what the image's config and docker run's flags make of
// the workload, by docker's rules (pure: no store, no file read here; the caller reads the image's
// /etc/passwd and /etc/group from its unpacked root). docs/images.md "run".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/image/manifest.hpp"

namespace nes::image {

/// What `neshost run` was given besides IMAGE.
struct RunOverrides {
  /// --entrypoint: replaces the image's Entrypoint, and drops the image's Cmd (docker's rule);
  /// "" clears the Entrypoint.
  std::optional<std::string> entrypoint;
  std::vector<std::string> args;                 // COMMAND [ARG...] after IMAGE: replace Cmd
  std::map<std::string, std::string> env;        // -e K=V: over the image's Env
  std::optional<std::string> workdir;            // -w: over WorkingDir
  std::optional<std::string> user;               // -u USER[:GROUP] as given: over User
};

/// The workload resolved.
struct RunSpec {
  std::vector<std::string> argv;                 // Entrypoint + Cmd, never empty
  std::map<std::string, std::string> env;        // the image's Env, then -e
  std::string workdir = "/";                     // absolute
  std::uint32_t uid = 0, gid = 0;
  std::vector<std::uint32_t> groups;             // supplementary: the user's in /etc/group
};

/// Resolves the workload. `passwd` and `group` are the image's /etc/passwd and /etc/group ("" when
/// absent). Errors (docker's wording where it has one): "no command specified: the image has no
/// Entrypoint or Cmd and none was given", "unable to find user app: no matching entries in passwd
/// file", "unable to find group staff: no matching entries in group file", a malformed Env entry.
Result<RunSpec> resolve_run(const ImageConfig& config, const RunOverrides& over, std::string_view passwd,
                            std::string_view group);

/// USER[:GROUP] -> uid, gid, supplementary groups, by docker's rules: a name is looked up in
/// `passwd` (its gid is the primary group unless GROUP is given); a number not there is taken as
/// is with gid 0; GROUP is a name in `group` or a number. "" is root.
Result<RunSpec> resolve_user(std::string_view user, std::string_view passwd, std::string_view group);

}  // namespace nes::image
