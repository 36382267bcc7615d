// Running one of the tools that make filesystem images on the host (mkfs.erofs, mke2fs: host/image/
// block_root.hpp, writable_layer.hpp) to its end, through vm::VmProcess (its own session, killed
// with us, every fd closed).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "host/image/digest.hpp"

namespace nes::image {

/// Runs `argv` (argv[0] looked up in PATH) to its end, at most an hour (then killed), its stdout
/// and stderr kept (the last 2 KiB) for the error. Ok when it exits 0. Errors name the tool: not
/// installed ("mkfs.erofs: No such file or directory (searched PATH) (install Debian's
/// erofs-utils)", err ENOENT), or how it ended and what it said (err EIO).
Status run_tool(const std::vector<std::string>& argv, std::string_view package);

}  // namespace nes::image
