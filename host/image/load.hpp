// `neshost load`: images from an archive into the store (docs/images.md "load"). Two formats, as
// `skopeo copy … docker-archive:FILE` / `docker save` and `skopeo copy … oci-archive:FILE` write
// them: a tar holding manifest.json (docker's: Config, RepoTags, Layers) or an OCI image layout
// (oci-layout, index.json, blobs/sha256/). Read as a stream (a pipe works; gzip/zstd/xz around
// the tar too) with libarchive; entries are staged under STATE/.images/ingest/load-*/ by number
// (never by their names), hashed as they arrive, and only once every document parsed and every
// blob matched its digest are they ingested through Store::begin_blob and named. A truncated or
// corrupt archive, a blob whose bytes do not match its name, a manifest naming a blob the archive
// lacks: refused, the store unchanged.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "host/image/store.hpp"

namespace nes::image {

/// What load_archive() added.
struct Loaded {
  std::vector<std::string> refs;      // the ref names set (Reference::str() form)
  std::vector<Digest> untagged;       // manifests loaded without a name (named by digest)
};

/// Loads the archive read from `fd` (`what` names it in errors: the file, or "stdin") into
/// `store`. `platform` picks the manifest of an OCI index that has several.
Result<Loaded> load_archive(Store& store, int fd, std::string_view what, std::string_view platform = "linux/amd64");

/// The ref name an untagged image gets in index.json: its manifest's digest ("sha256:…"); `images`
/// shows it as <none>.
std::string untagged_ref_name(const Digest& manifest);

}  // namespace nes::image
