// The manifest and safetensors-header parsers, field by field: what they accept round-trips exactly; every
// malformed field is a checkpoint_error naming the document and the field. (tools/fuzz-check runs the same
// parsers under libFuzzer.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <fsdp/checkpoint/manifest.hpp>
#include <fsdp/checkpoint/safetensors_header.hpp>
#include <nlohmann/json.hpp>

#include "tests/support/support.hpp"

namespace ckpt = fsdp::checkpoint;
namespace st = fsdp::safetensors;
using fsdp_test::error_of;
using json = nlohmann::ordered_json;

namespace {
/// Two ranks' files of a model with 'emb' [3, 4] and 'b' [4], AdamW: rank 0 holds emb[0, 8), rank 1 emb[8, 12)
/// and b.
ckpt::manifest two_ranks() {
  ckpt::manifest m;
  m.step = 12;
  m.optimizer = ckpt::optimizer_record{"adamw", 11, {"exp_avg", "exp_avg_sq"}};
  m.loss_scaler = ckpt::scaler_record{32768.0f, 3};
  m.metadata = {{"data.next_step", "12"}};
  m.world = 2;
  m.shards = 2;
  m.strategy = "full_shard";
  m.compute_dtype = "bf16";
  m.tensors = {{"emb", {3, 4}}, {"b", {4}}};
  m.ties = {{"head", "emb"}};
  ckpt::file_record f0{"shard-00000-of-00002.bin", 0, 96, 0x1234, 4096, {0xabcdef0123456789ull}, {}};
  ckpt::file_record f1{"shard-00001-of-00002.bin", 1, 96, 0x5678, 4096, {0x0123456789abcdefull}, {}};
  std::uint64_t o0 = 0, o1 = 0;
  for (const char* k : {"param", "exp_avg", "exp_avg_sq"}) {
    f0.pieces.push_back({"emb", k, 0, 8, o0});
    o0 += 32;
    f1.pieces.push_back({"emb", k, 8, 12, o1});
    o1 += 16;
    f1.pieces.push_back({"b", k, 0, 4, o1});
    o1 += 16;
  }
  m.files = {f0, f1};
  return m;
}

const std::string doc = "the manifest 'ck/manifest.json'";

/// The error of parsing two_ranks() after `edit` changed its JSON, sealed again with its checksum (so the fields'
/// own checks are what speaks).
template <class Edit>
std::string error_after(Edit edit) {
  json j = json::parse(ckpt::to_json(two_ranks()));
  edit(j);
  return error_of<fsdp::checkpoint_error>([&] { ckpt::parse_manifest(ckpt::seal_manifest(j.dump()), doc); });
}
}  // namespace

TEST_CASE("a manifest written by to_json parses back to the same value, and names its fields in their order") {
  const ckpt::manifest m = two_ranks();
  const std::string text = ckpt::to_json(m);
  CHECK(ckpt::parse_manifest(text, doc) == m);
  CHECK(text.starts_with("{\n \"format\": \"fsdp-checkpoint\",\n \"version\": 2,\n \"step\": 12,"));
  // tensor parallelism: the mesh's tensor dimension and each tensor's placement round-trip; a manifest written
  // before them (no such members) reads as one tensor rank, every tensor replicated
  ckpt::manifest tp = m;
  tp.world = 4;
  tp.tensor_ranks = 2;
  tp.tensors[0].placement = fsdp::tp::split(1, 2);
  tp.tensors[1].placement = fsdp::tp::partial_grad;
  CHECK(ckpt::parse_manifest(ckpt::to_json(tp), doc) == tp);
  json older = json::parse(text);
  older["mesh"].erase("tensor");
  for (json& t : older["tensors"]) t.erase("placement");
  CHECK(ckpt::parse_manifest(ckpt::seal_manifest(older.dump()), doc) == m);
  ckpt::manifest bare = m;  // saved without an optimizer or a scaler
  bare.optimizer.reset();
  bare.loss_scaler.reset();
  for (auto& f : bare.files) std::erase_if(f.pieces, [](const ckpt::piece_record& p) { return p.kind != "param"; });
  CHECK(ckpt::parse_manifest(ckpt::to_json(bare), doc) == bare);
}

TEST_CASE("every malformed field of a manifest is named") {
  const std::string at = "fsdp: " + doc + ": ";
  const std::string sum = ", \"manifest_xxh3\": \"0000000000000000\"}";  // sealed below: the parser speaks
  CHECK(error_of<fsdp::checkpoint_error>([&] {
          ckpt::parse_manifest(ckpt::seal_manifest("{\"format\": " + sum), doc);
        }) == at + "the document does not parse as JSON");
  CHECK(error_of<fsdp::checkpoint_error>([&] {
          ckpt::parse_manifest(ckpt::seal_manifest("{\"a\": \"\xff\"" + sum), doc);
        }) == at + "the document is not valid UTF-8 (byte 7)");
  CHECK(error_after([](json& j) { j["format"] = "other"; }) ==
        at + "format must be \"fsdp-checkpoint\" (this is not a checkpoint manifest of this library)");
  CHECK(error_after([](json& j) { j["version"] = 1; }) == at + "version is 1; this library reads version 2");
  CHECK(error_after([](json& j) { j.erase("step"); }) == at + "the document has no member 'step'");
  CHECK(error_after([](json& j) { j["step"] = -1; }) == at + "step must be in [0, 9223372036854775807], got -1");
  CHECK(error_after([](json& j) { j["mesh"]["shards"] = 3; }) == at + "mesh is 1 x 3 x 1, which is not the world of 2");
  CHECK(error_after([](json& j) { j["mesh"]["tensor"] = 2; }) == at + "mesh is 1 x 2 x 2, which is not the world of 2");
  CHECK(error_after([](json& j) { j["mesh"]["tensor"] = 0; }) == at + "mesh.tensor must be in [1, 16777216], got 0");
  CHECK(error_after([](json& j) { j["tensors"][0]["placement"] = "split(2)"; }) ==
        at + "tensors[0].placement splits dimension 2, which the shape does not have");
  CHECK(error_after([](json& j) { j["tensors"][0]["placement"] = "split(01)"; }) ==
        at + "tensors[0].placement is 'split(01)', which is none of \"replicated\", \"partial_grad\", \"split(d)\"");
  CHECK(error_after([](json& j) { j["tensors"][0]["placement"] = 1; }) == at + "tensors[0].placement must be a string");
  CHECK(error_after([](json& j) { j["loss_scaler"]["scale"] = 0.1; }) ==
        at + "loss_scaler.scale must be a finite fp32 value > 0, got 0.1");
  CHECK(error_after([](json& j) { j["optimizer"]["states"][1] = "exp_avg"; }) ==
        at + "optimizer.states[1] repeats a state name");
  CHECK(error_after([](json& j) { j["tensors"][0]["shape"][1] = 0; }) ==
        at + "tensors[0].shape[1] must be in [1, 281474976710656], got 0");
  CHECK(error_after([](json& j) { j["tensors"][1]["dtype"] = "BF16"; }) ==
        at + "tensors[1].dtype must be \"F32\" (checkpoints hold fp32 master values)");
  CHECK(error_after([](json& j) { j["ties"]["head"] = "nothing"; }) ==
        at + "ties.head names 'nothing', which is not a tensor");
  CHECK(error_after([](json& j) { j["files"][1]["name"] = "../escape.bin"; }) ==
        at + "files[1].name must be a plain file name in the checkpoint directory");
  CHECK(error_after([](json& j) { j["files"][0]["xxh3"] = "12"; }) ==
        at + "files[0].xxh3 must be 16 lowercase hexadecimal digits");
  CHECK(error_after([](json& j) { j["files"][0]["blocks"].push_back("0000000000000000"); }) ==
        at + "files[0].blocks has 2 checksums; a file of 96 bytes in blocks of 4096 has 1");
  CHECK(error_after([](json& j) { j["files"][0]["pieces"][0]["end"] = 13; }) ==
        at + "files[0].pieces[0].end must be in [1, 12], got 13");
  CHECK(error_after([](json& j) { j["files"][0]["pieces"][2]["offset"] = 80; }) ==
        at + "files[0].pieces[2] (elements [0, 8) of 'emb' (exp_avg_sq)) ends at byte 112, past the file's 96 bytes");
  CHECK(error_after([](json& j) { j["files"][0]["pieces"][1]["offset"] = 16; }) ==
        at + "files[0].pieces overlap in the file at byte 16: elements [0, 8) of 'emb' (param) and elements [0, 8) "
             "of 'emb' (exp_avg)");
  CHECK(error_after([](json& j) { j["files"][0]["pieces"][1]["kind"] = "momentum"; }) ==
        at + "files[0].pieces[1].kind is 'momentum', which is neither \"param\" nor a state of the optimizer");
  CHECK(error_after([](json& j) { j["files"][1]["pieces"].erase(2); }) ==
        at + "files leave out elements [8, 12) of tensor 'emb' (exp_avg)");
  CHECK(error_after([](json& j) {  // emb [7, 11) instead of [8, 12): as long, one element twice
          j["files"][1]["pieces"][0]["begin"] = 7;
          j["files"][1]["pieces"][0]["end"] = 11;
        }) == at + "files overlap on elements [7, 8) of tensor 'emb' (param)");
}

TEST_CASE("a manifest carries its own checksum: any byte changed after writing is refused, naming the file") {
  const std::string text = ckpt::to_json(two_ranks());
  // the last member, over the file's bytes with its own digits read as zeros
  const std::size_t digits = text.size() - 20;
  REQUIRE(text.substr(digits - 20) == "\n \"manifest_xxh3\": \"" + text.substr(digits, 16) + "\"\n}\n");
  std::string zeroed = text;
  zeroed.replace(digits, 16, std::string(16, '0'));
  CHECK(text.substr(digits, 16) == ckpt::hex64(ckpt::xxh3(zeroed.data(), zeroed.size())));
  CHECK(ckpt::seal_manifest(zeroed) == text);
  // every byte, each of three ways: one bit (a digit to its neighbour: "step": 12 -> 13), a case bit, all bits
  int silent = 0, refused = 0;
  for (std::size_t i = 0; i < text.size(); ++i)
    for (unsigned char x : {0x01, 0x20, 0xff}) {
      std::string bad = text;
      bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ x);
      try {
        (void)ckpt::parse_manifest(bad, doc);
        ++silent;
      } catch (const fsdp::checkpoint_error& e) {
        ++refused;
        CHECK(std::string_view(e.what()).starts_with("fsdp: " + doc + " "));
      }
    }
  CHECK(silent == 0);
  CHECK(refused == 3 * int(text.size()));
  // the messages, whole
  std::string step13 = text;
  step13.replace(step13.find("\"step\": 12"), 10, "\"step\": 13");
  std::string h13 = step13;
  h13.replace(digits, 16, std::string(16, '0'));
  CHECK(error_of<fsdp::checkpoint_error>([&] { ckpt::parse_manifest(step13, doc); }) ==
        "fsdp: " + doc + " does not match its own checksum (xxh3 " + ckpt::hex64(ckpt::xxh3(h13.data(), h13.size())) +
            ", recorded " + text.substr(digits, 16) + "): it was changed or damaged after it was written");
  CHECK(error_of<fsdp::checkpoint_error>([&] { ckpt::parse_manifest(text.substr(0, digits - 21) + "\n}\n", doc); }) ==
        "fsdp: " + doc + " has no checksum of its own (no member \"manifest_xxh3\"): it was cut or damaged, or "
        "written by a version of this library that did not checksum its manifests (manifest version 1), which this "
        "one does not read");
  std::string upper = text;
  upper[digits] = 'G';
  CHECK(error_of<fsdp::checkpoint_error>([&] { ckpt::parse_manifest(upper, doc); }) ==
        "fsdp: " + doc + " has a checksum (\"manifest_xxh3\") that is not 16 lowercase hexadecimal digits");
  CHECK(error_of<fsdp::checkpoint_error>([&] { ckpt::parse_manifest(text.substr(0, digits + 3), doc); }) ==
        "fsdp: " + doc + " has a checksum member \"manifest_xxh3\" whose value is not a string of 16 digits");
  CHECK(error_of<fsdp::usage_error>([] { (void)ckpt::seal_manifest("{}"); }) ==
        "fsdp: checkpoint::seal_manifest: the text has no checksum of its own (no member \"manifest_xxh3\"): it was "
        "cut or damaged, or written by a version of this library that did not checksum its manifests (manifest "
        "version 1), which this one does not read");
}

TEST_CASE("a safetensors header: what make_header writes parses back; every malformed entry is named") {
  const std::vector<st::tensor_info> tensors = {
      {"emb", "F32", {3, 4}, 0, 48}, {"b", "BF16", {4}, 48, 56}, {"e", "F16", {0}, 56, 56}};
  const std::string file = st::make_header(tensors, {{"format", "pt"}});
  CHECK(file.size() % 8 == 0);
  const std::uint64_t n = st::header_length(file.substr(0, 8), file.size() + 56, "f");
  CHECK(n == file.size() - 8);
  const st::header h = st::parse_header(file.substr(8), 56, "f");
  CHECK(h.metadata == std::map<std::string, std::string>{{"format", "pt"}});
  REQUIRE(h.tensors.size() == 3);
  for (const auto& t : tensors) CHECK(*h.find(t.name) == t);

  auto error = [](const std::string& text, std::uint64_t data = 56) {
    return error_of<fsdp::checkpoint_error>([&] { st::parse_header(text, data, "the file 'f'"); });
  };
  const std::string at = "fsdp: the file 'f': ";
  CHECK(error(R"({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})") ==
        at + "tensor 'a': dtype is 'F33', which is not a safetensors dtype");
  CHECK(error(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})") ==
        at + "tensor 'a' holds 4 bytes, but 2 elements of F32 take 8");
  CHECK(error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, )"
              R"("b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}})") ==
        at + "tensor 'b' begins at byte 2 of the data, inside tensor 'a' [0, 4)");
  CHECK(error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})") ==
        at + "tensor 'a': data_offsets must hold two numbers, [begin, end]");
  CHECK(error(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})") ==
        at + "tensor 'a': shape[0] must be in [0, 281474976710656], got -1");
  CHECK(error(R"({"__metadata__": {"k": 1}})") == at + "__metadata__.k must be a string");
  CHECK(error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 2) ==
        at + "tensor 'a': data_offsets are [0, 4], which is not a range of the 2 bytes of data");
  // the format's rules, as the safetensors package holds them: unique names, data tiled exactly
  const std::string a = R"("a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
  const std::string b = R"("b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})";
  CHECK(error("{" + a + ", " + b + ", " + R"("a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8) ==
        at + "tensor 'a' appears twice; the names in a JSON object must be unique (a reader that keeps either one "
             "would see another document)");
  CHECK(error(R"({"a": {"dtype": "F32", "shape": [1], "shape": [2], "data_offsets": [0, 4]}})", 4) ==
        at + "tensor 'a': shape appears twice; the names in a JSON object must be unique (a reader that keeps either "
             "one would see another document)");
  CHECK(error(R"({"__metadata__": {"k": "1", "k": "2"}})", 0) ==
        at + "__metadata__.k appears twice; the names in a JSON object must be unique (a reader that keeps either "
             "one would see another document)");
  CHECK(error(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8) ==
        at + "tensor 'a' begins at byte 4 of the data, leaving bytes [0, 4) unused; a safetensors file's tensors tile "
             "its data exactly");
  CHECK(error("{" + a + ", " + R"("b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})", 12) ==
        at + "tensor 'b' begins at byte 8 of the data, leaving bytes [4, 8) unused; a safetensors file's tensors tile "
             "its data exactly");
  CHECK(error("{" + a + ", " + b + "}", 12) ==
        at + "the document ends its last tensor at byte 8 of its 12 bytes of data; a safetensors file's tensors tile "
             "its data exactly");
  CHECK(st::parse_header("{" + a + ", " + b + "}", 8, "f").tensors.size() == 2);
}

TEST_CASE("a member name repeated within one object of a manifest is refused, with its path") {
  const std::string text = ckpt::to_json(two_ranks());
  std::string twice = text;  // "step" once more, just after the first
  twice.insert(twice.find("\"step\": 12,") + 11, "\n \"step\": 13,");
  CHECK(error_of<fsdp::checkpoint_error>([&] { ckpt::parse_manifest(ckpt::seal_manifest(twice), doc); }) ==
        "fsdp: " + doc + ": step appears twice; the names in a JSON object must be unique (a reader that keeps either "
        "one would see another document)");
  std::string piece = text;  // a piece with its "end" twice
  piece.insert(piece.find("\"end\": 8,") + 9, " \"end\": 7,");
  CHECK(error_of<fsdp::checkpoint_error>([&] { ckpt::parse_manifest(ckpt::seal_manifest(piece), doc); }) ==
        "fsdp: " + doc + ": files[0].pieces[0].end appears twice; the names in a JSON object must be unique (a reader "
        "that keeps either one would see another document)");
}
