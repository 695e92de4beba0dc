#pragma once
// A packer's state as bytes, to keep beside a checkpoint and resume the same data: the step, the next document
// to read, the look-ahead buffer and the carried rest of a split document, with the options that packed them.
//
// Layout (integers little-endian, core/bytes.hpp, whatever the machine's order): "FSDPPACK", u32 version 1; the options
// (i64 row_tokens, i64 rows_per_step, i64 lookahead, u8 long_docs, i32 pad); u64 step, u64 next_document, u8
// stream_ended; u64 pieces, each piece; u8 has_carry, the carry; then u64 FNV-1a of every byte before it. A piece
// is u64 document, i64 offset, u8 has_next, i32 next, u64 tokens, the tokens as i32.
//
// Reading trusts no count it has not checked against the bytes left, and a state saved with other options is
// refused (resuming with other options would not give the data of an uninterrupted run).
//
// With a checkpoint: to_text() gives the bytes as base64, a string for checkpoint::save_options::metadata, so the
// data's position is committed with the weights, atomically; from_text() reads it back from the manifest's
// metadata. save_state() / load_state() write and read a file of their own instead (through a .partial file
// renamed into place, without fsync).
#include <string>
#include <string_view>

#include "fsdp/core/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/data/packing.hpp"

namespace fsdp::data {

/// The state and the options that packed it, as bytes.
FSDP_DECL std::string to_bytes(const packing_options& o, const packer_state& s);

/// The state in `bytes`, saved with options equal to `o`; a checkpoint_error naming `what` (a file name, say) and
/// the fault otherwise.
FSDP_DECL packer_state from_bytes(std::string_view bytes, const packing_options& o, std::string_view what = "(bytes)");

/// The state and its options as base64 text (RFC 4648, with padding): for a checkpoint's metadata.
FSDP_DECL std::string to_text(const packing_options& o, const packer_state& s);

/// The state in base64 `text` (to_text's), saved with options equal to `o`; a checkpoint_error naming `what` and
/// the fault otherwise.
FSDP_DECL packer_state from_text(std::string_view text, const packing_options& o, std::string_view what = "(text)");

/// Writes the state to `path` (through `path`.partial, renamed into place once written); a checkpoint_error
/// naming the file when it cannot.
FSDP_DECL void save_state(const std::string& path, const packing_options& o, const packer_state& s);

/// The state saved in `path` with options equal to `o`.
FSDP_DECL packer_state load_state(const std::string& path, const packing_options& o);

}  // namespace fsdp::data

#if !defined(FSDP_SEPARATE_COMPILATION)
#include "fsdp/data/packer_state.ipp"
#endif
