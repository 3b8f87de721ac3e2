//! [`PieceDecoder`]: `Tokenizer::decode` for SentencePiece-style decoders, from a table built once.
//!
//! Incremental detokenization decodes two short id windows per token (`incremental.rs`). Through
//! `tokenizers` each decode allocates a string per token, runs a regex per token for the `▁` → space
//! replacement, and joins: most of the step loop's text cost at 256 rows. For the decoder Gemma's
//! (and Llama 2's) `tokenizer.json` use, `Sequence[Replace(literal → content), ByteFallback, Fuse]`,
//! decoding is a concatenation of per-token pieces, except that runs of byte tokens (`<0xNN>`) are
//! joined into UTF-8 (each byte of an invalid run becoming U+FFFD). So the pieces are computed once
//! per vocabulary entry and a decode is table lookups. Any other decoder (Metaspace, ByteLevel,
//! WordPiece, Strip, a regex Replace...) is not recognised, and decoding goes through `tokenizers`.
//! The result equals `Tokenizer::decode` for every id sequence (randomized test in
//! `tests/text.rs`).

use std::collections::HashSet;

use tokenizers::decoders::DecoderWrapper;
use tokenizers::Tokenizer;

/// What one id decodes to.
#[derive(Debug, Clone, Copy)]
enum Piece {
    /// Not in the vocabulary: `decode` skips it.
    Missing,
    /// Text `arena[start..start + len]` (after the replacement).
    Text { start: u32, len: u32, special: bool },
    /// A byte-fallback token.
    Byte { byte: u8, special: bool },
}

/// A precomputed decoder for `Sequence[Replace(literal), ByteFallback, Fuse]` tokenizers.
#[derive(Debug, Clone)]
pub struct PieceDecoder {
    arena: String,
    pieces: Vec<Piece>,
}

/// The literal pattern and content of the decoder this table reproduces, if `tok` has it.
fn recognised(tok: &Tokenizer) -> Option<(String, String)> {
    let DecoderWrapper::Sequence(seq) = tok.get_decoder()? else {
        return None;
    };
    let [DecoderWrapper::Replace(r), DecoderWrapper::ByteFallback(_), DecoderWrapper::Fuse(_)] =
        seq.get_decoders()
    else {
        return None;
    };
    // The pattern is private in `tokenizers`; its serialized form names it.
    let v = serde_json::to_value(r).ok()?;
    let pattern = v.get("pattern")?.get("String")?.as_str()?.to_string();
    (!pattern.is_empty()).then(|| (pattern, r.content.clone()))
}

impl PieceDecoder {
    /// The table for `tok`, or `None` when its decoder is not the recognised kind.
    pub fn new(tok: &Tokenizer) -> Option<Self> {
        let (pattern, content) = recognised(tok)?;
        let special: HashSet<String> = tok
            .get_added_tokens_decoder()
            .values()
            .filter(|t| t.special)
            .map(|t| t.content.clone())
            .collect();
        let max_id = tok.get_vocab(true).values().copied().max()?;
        let mut arena = String::new();
        let mut pieces = Vec::with_capacity(max_id as usize + 1);
        for id in 0..=max_id {
            let Some(raw) = tok.id_to_token(id) else {
                pieces.push(Piece::Missing);
                continue;
            };
            let is_special = special.contains(&raw);
            let text = raw.replace(&pattern, &content);
            // ByteFallback's test, on the replaced token.
            let byte = (text.len() == 6 && text.starts_with("<0x") && text.ends_with('>'))
                .then(|| u8::from_str_radix(&text[3..5], 16).ok())
                .flatten();
            pieces.push(match byte {
                Some(byte) => Piece::Byte {
                    byte,
                    special: is_special,
                },
                None => {
                    let start = arena.len() as u32;
                    arena.push_str(&text);
                    Piece::Text {
                        start,
                        len: text.len() as u32,
                        special: is_special,
                    }
                }
            });
        }
        Some(Self { arena, pieces })
    }

    /// `Tokenizer::decode(ids, skip_special)`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut out = String::new();
        self.decode_into(ids, skip_special, &mut out, &mut Vec::new());
        out
    }

    /// [`PieceDecoder::decode`] appended to `out`; `bytes` is scratch for byte-fallback runs.
    pub fn decode_into(
        &self,
        ids: &[u32],
        skip_special: bool,
        out: &mut String,
        bytes: &mut Vec<u8>,
    ) {
        bytes.clear();
        for &id in ids {
            match self.pieces.get(id as usize).copied() {
                None | Some(Piece::Missing) => {}
                Some(Piece::Byte { special, .. }) | Some(Piece::Text { special, .. })
                    if skip_special && special => {}
                Some(Piece::Byte { byte, .. }) => bytes.push(byte),
                Some(Piece::Text { start, len, .. }) => {
                    flush(bytes, out);
                    out.push_str(&self.arena[start as usize..(start + len) as usize]);
                }
            }
        }
        flush(bytes, out);
    }
}

/// A run of byte tokens: its UTF-8 text, or one U+FFFD per byte when it is not valid UTF-8.
fn flush(bytes: &mut Vec<u8>, out: &mut String) {
    if bytes.is_empty() {
        return;
    }
    match std::str::from_utf8(bytes) {
        Ok(s) => out.push_str(s),
        Err(_) => (0..bytes.len()).for_each(|_| out.push('\u{FFFD}')),
    }
    bytes.clear();
}
