// The image documents the store reads (parsed with simdjson, every field checked, every error
// naming the document and field): OCI image index / manifest / config (image-spec v1.1) and
// Docker's image manifest v2 schema 2 and its manifest list (the same shapes, other media types).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/image/digest.hpp"

namespace nes::image {

namespace media {
inline constexpr std::string_view kOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view kOciManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view kOciConfig = "application/vnd.oci.image.config.v1+json";
inline constexpr std::string_view kOciLayer = "application/vnd.oci.image.layer.v1.tar";
inline constexpr std::string_view kOciLayerGzip = "application/vnd.oci.image.layer.v1.tar+gzip";
inline constexpr std::string_view kOciLayerZstd = "application/vnd.oci.image.layer.v1.tar+zstd";
inline constexpr std::string_view kDockerList = "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr std::string_view kDockerManifest = "application/vnd.docker.distribution.manifest.v2+json";
inline constexpr std::string_view kDockerConfig = "application/vnd.docker.container.image.v1+json";
inline constexpr std::string_view kDockerLayerGzip = "application/vnd.docker.image.rootfs.diff.tar.gzip";
inline constexpr std::string_view kDockerLayer = "application/vnd.docker.image.rootfs.diff.tar";
}  // namespace media

/// The annotation naming a ref in an OCI layout's index.json (image-spec annotations.md).
inline constexpr std::string_view kRefNameAnnotation = "org.opencontainers.image.ref.name";

/// An image platform (image-spec image-index.md): "linux/amd64", "linux/arm64/v8".
struct Platform {
  std::string os, architecture, variant;
  /// "os/arch[/variant]".
  std::string str() const;
};
/// "linux/amd64" -> Platform; errors name the text.
Result<Platform> parse_platform(std::string_view text);

/// A content descriptor (image-spec descriptor.md).
struct Descriptor {
  std::string media_type;
  Digest digest;
  std::uint64_t size = 0;  // bytes
  std::map<std::string, std::string> annotations;
  std::optional<Platform> platform;
};

/// An OCI image index or a Docker manifest list.
struct Index {
  std::string media_type;  // as given ("" when the document has none: OCI makes it optional)
  std::vector<Descriptor> manifests;
};

/// An OCI image manifest or a Docker schema 2 manifest.
struct Manifest {
  std::string media_type;
  Descriptor config;
  std::vector<Descriptor> layers;  // base first
};

/// The parts of an image config (image-spec config.md) that run and `images`/`inspect` use.
struct ImageConfig {
  std::string architecture, os, variant;
  std::string created;  // RFC 3339 as given ("" when absent)
  std::string user, working_dir;
  std::vector<std::string> env, entrypoint, cmd;
  bool has_entrypoint = false, has_cmd = false;  // present (even empty) vs absent
  std::map<std::string, std::string> labels;
  std::vector<Digest> diff_ids;  // rootfs.diff_ids, base first
};

/// What a JSON document is, by its mediaType (or its shape when it has none): an index
/// ("manifests" array) or a manifest ("config" + "layers").
enum class DocKind { index, manifest };
/// Errors name `what` (e.g. "manifest sha256:…") and the field.
Result<DocKind> sniff_document(std::string_view json, std::string_view what);
Result<Index> parse_index(std::string_view json, std::string_view what);
Result<Manifest> parse_manifest(std::string_view json, std::string_view what);
Result<ImageConfig> parse_config(std::string_view json, std::string_view what);

/// The manifest of `index` for `platform` ("linux/amd64"): os and architecture equal, and the
/// variant when the wanted one has one. Error: "no manifest for linux/arm64 in <what> (it has
/// linux/amd64, linux/s390x)".
Result<Descriptor> select_platform(const Index& index, std::string_view platform, std::string_view what);

/// Whether `media_type` is a layer the unpacker reads (tar, tar+gzip, tar+zstd; OCI and Docker).
bool is_layer_media_type(std::string_view media_type);

/// Serialises a descriptor as JSON (one object, keys in image-spec order).
std::string descriptor_json(const Descriptor& d);
/// JSON string literal of `s` (quotes and escapes).
std::string json_quote(std::string_view s);

}  // namespace nes::image
