// Image documents (host/image/manifest.hpp): OCI and Docker index/manifest/config, platform
// selection, and every malformed field named.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fmt/format.h>

#include "host/image/manifest.hpp"

using namespace nes::image;

namespace {
const std::string A = "sha256:" + std::string(64, 'a');
const std::string B = "sha256:" + std::string(64, 'b');
const std::string C = "sha256:" + std::string(64, 'c');

std::string manifest_doc(std::string_view media_type, std::string_view layer_type) {
  return fmt::format(R"({{"schemaVersion":2,"mediaType":"{}","config":{{"mediaType":"x","digest":"{}","size":7}},
    "layers":[{{"mediaType":"{}","digest":"{}","size":100}},{{"mediaType":"{}","digest":"{}","size":5,"annotations":{{"k":"v"}}}}]}})",
                     media_type, A, layer_type, B, layer_type, C);
}
}  // namespace

TEST_CASE("OCI and Docker manifests parse to the same shape") {
  for (auto [mt, lt] : {std::pair{media::kOciManifest, media::kOciLayerGzip}, {media::kDockerManifest, media::kDockerLayerGzip}}) {
    std::string doc = manifest_doc(mt, lt);
    CHECK(*sniff_document(doc, "m") == DocKind::manifest);
    auto m = parse_manifest(doc, "m");
    REQUIRE(m.ok());
    CHECK(m->media_type == mt);
    CHECK(m->config.digest.str() == A);
    CHECK(m->config.size == 7);
    REQUIRE(m->layers.size() == 2);
    CHECK(m->layers[0].digest.str() == B);
    CHECK(m->layers[1].size == 5);
    CHECK(m->layers[1].annotations.at("k") == "v");
    CHECK(is_layer_media_type(m->layers[0].media_type));
  }
  CHECK(is_layer_media_type(media::kOciLayerZstd));
  CHECK(is_layer_media_type(media::kOciLayer));
  CHECK(!is_layer_media_type("application/vnd.oci.image.layer.v1.tar+encrypted"));
}

TEST_CASE("indexes and manifest lists; platform selection") {
  std::string doc = fmt::format(R"({{"schemaVersion":2,"mediaType":"{}","manifests":[
    {{"mediaType":"{}","digest":"{}","size":1,"platform":{{"architecture":"arm64","os":"linux","variant":"v8"}}}},
    {{"mediaType":"{}","digest":"{}","size":2,"platform":{{"architecture":"amd64","os":"linux"}}}}]}})",
                                media::kDockerList, media::kDockerManifest, A, media::kDockerManifest, B);
  CHECK(*sniff_document(doc, "l") == DocKind::index);
  auto ix = parse_index(doc, "l");
  REQUIRE(ix.ok());
  REQUIRE(ix->manifests.size() == 2);
  CHECK(select_platform(*ix, "linux/amd64", "l")->digest.str() == B);
  CHECK(select_platform(*ix, "linux/arm64", "l")->digest.str() == A);
  CHECK(select_platform(*ix, "linux/arm64/v8", "l")->digest.str() == A);
  auto none = select_platform(*ix, "linux/s390x", "list of x");
  REQUIRE(!none.ok());
  CHECK(none.error().message == "no manifest for linux/s390x in list of x (it has linux/arm64/v8, linux/amd64)");
  CHECK(!select_platform(*ix, "linux", "l").ok());
  // an OCI index without a mediaType is still an index (the field is optional there)
  CHECK(*sniff_document(R"({"schemaVersion":2,"manifests":[]})", "x") == DocKind::index);
  // a descriptor round-trips through descriptor_json
  auto again = parse_index(fmt::format(R"({{"manifests":[{}]}})", descriptor_json(ix->manifests[0])), "again");
  REQUIRE(again.ok());
  CHECK(again->manifests[0].platform->str() == "linux/arm64/v8");
  CHECK(again->manifests[0].digest.str() == A);
}

TEST_CASE("image config: the run fields, present vs absent") {
  std::string doc = fmt::format(R"({{"architecture":"amd64","os":"linux","created":"2026-12-07T10:00:00Z",
    "config":{{"User":"app:staff","Env":["PATH=/bin","A=1"],"Entrypoint":["/bin/sh","-c"],"Cmd":null,"WorkingDir":"/srv","Labels":{{"l":"v"}}}},
    "rootfs":{{"type":"layers","diff_ids":["{}","{}"]}}}})", A, B);
  auto c = parse_config(doc, "config x");
  REQUIRE(c.ok());
  CHECK(c->user == "app:staff");
  CHECK(c->env == std::vector<std::string>{"PATH=/bin", "A=1"});
  CHECK(c->has_entrypoint);
  CHECK(c->entrypoint == std::vector<std::string>{"/bin/sh", "-c"});
  CHECK(!c->has_cmd);
  CHECK(c->working_dir == "/srv");
  CHECK(c->labels.at("l") == "v");
  CHECK(c->diff_ids.size() == 2);
  CHECK(c->created == "2026-12-07T10:00:00Z");
}

TEST_CASE("malformed documents: each error names the document and the field") {
  struct Case { std::string doc, says; int which; };  // which: 0 manifest, 1 index, 2 config
  const Case cases[] = {
      {"not json", "m: not JSON", 0},
      {"[]", "m: not a JSON object", 0},
      {R"({"layers":[]})", "m: field 'config': missing", 0},
      {fmt::format(R"({{"config":{{"mediaType":"x","digest":"{}","size":-1}},"layers":[]}})", A), "field 'config.size'", 0},
      {fmt::format(R"({{"config":{{"mediaType":"x","digest":"sha256:12","size":1}},"layers":[]}})"), "field 'config.digest'", 0},
      {fmt::format(R"({{"config":{{"mediaType":"x","digest":"{}","size":1}},"layers":[{{"digest":"{}","size":1}}]}})", A, B), "field 'layers[0].mediaType'", 0},
      {fmt::format(R"({{"mediaType":"{}","manifests":[]}})", media::kOciIndex), "'application/vnd.oci.image.index.v1+json' is not an image manifest", 0},
      {R"({"manifests":{}})", "field 'manifests': missing or not an array", 1},
      {R"({"rootfs":{}})", "field 'rootfs.diff_ids'", 2},
      {R"({"config":{"Env":"A=1"},"rootfs":{"diff_ids":[]}})", "config: field 'Env': not an array of strings", 2},
      {R"({"config":{"User":7},"rootfs":{"diff_ids":[]}})", "config: field 'User': not a string", 2},
  };
  for (const auto& c : cases) {
    CAPTURE(c.doc);
    std::string msg = c.which == 0 ? parse_manifest(c.doc, "m").error().message
                    : c.which == 1 ? parse_index(c.doc, "m").error().message
                                   : parse_config(c.doc, "m").error().message;
    CHECK(msg.find(c.says) != std::string::npos);
  }
  CHECK(sniff_document(R"({"schemaVersion":1,"fsLayers":[]})", "old").error().message.find("schema 1") != std::string::npos);
  CHECK(sniff_document(R"({"mediaType":"text/plain"})", "odd").error().message.find("neither") != std::string::npos);
}
