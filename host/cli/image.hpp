// `neshost run IMAGE`'s glue between the image store (host/image/) and run's flags (plan.hpp):
// docs/images.md "run".
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "host/cli/plan.hpp"
#include "host/image/reference.hpp"
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
/// With --pull missing (the default) an absent image whose first word has a registry, a tag or a
/// digest is pulled first (pull_for_run()); --pull always pulls ARGV's first word whatever it
/// is (docker's: it is an IMAGE then); --pull never refuses an absent one.
host::Result<bool> apply_run_image(RunFlags& o, const std::filesystem::path& state, const std::string& vm,
                                   std::optional<std::filesystem::path>& rootfs_dir);

/// `run --pull`: pulls `ref` into the store under `state` as `neshost pull` would (the
/// credentials of `neshost login`, the registry's CA from certs.d or the system's, linux/amd64),
/// docker's progress lines on stderr (the workload's stdout stays its own). Errors name the
/// registry and the reason; ^C stops it with the store consistent (host/cli/pull.cpp).
host::Status pull_for_run(const std::filesystem::path& state, const image::Reference& ref);

}  // namespace nes::cli
