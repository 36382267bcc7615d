// `neshost run IMAGE`'s glue between the image store (host/image/) and run's flags (plan.hpp):
// docs/images.md "run".
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "host/cli/plan.hpp"
#include "host/lib/base.hpp"

namespace nes::cli {

/// When `o` names an image, resolves and unpacks it and rewrites `o` as a --rootfs run of it.
/// `o` names an image when ARGV did not come after `--`, there is no --rootfs, and ARGV's first
/// word is a reference of an image in the store under `state`; a first word with a registry, a
/// tag or a digest (`busybox:1.36`, `localhost:5000/app`) names one even when it is absent (then
/// the error "image …: not in the store: neshost pull … or neshost load"). A bare word not in the
/// store (`true`, `sh`) stays a command of the built-in root, as before.
/// Rewritten: argv (Entrypoint/Cmd by docker's rules, --entrypoint), env (the image's under -e),
/// workdir, uid/gid/groups (the image's User resolved in its /etc/passwd and /etc/group unless
/// -u), rootfs, and `rootfs_dir` (what check_run reads). The root: with --read-only the unpacked
/// root itself (read-only on both sides); otherwise a fresh writable layer in the VM's state dir
/// (rootfs.XXXXXX/upper and work, the overlay mounted on rootfs.XXXXXX/merged by its virtiofsd in
/// its own mount namespace), and image.json in the VM's dir names the image (rmi refuses it).
/// Returns whether it was an image run. Errors name the image and what failed (exit 125).
host::Result<bool> apply_run_image(RunFlags& o, const std::filesystem::path& state, const std::string& vm,
                                   std::optional<std::filesystem::path>& rootfs_dir);

}  // namespace nes::cli
