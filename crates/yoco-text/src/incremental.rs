//! Incremental detokenization of one sequence.
//!
//! Decoding token by token is wrong for SentencePiece-style tokenizers (leading spaces, byte
//! fallback pieces that only form a character together). Like vLLM and TGI we keep two offsets into
//! the token list: text is produced by decoding `ids[prefix..]` and subtracting the decoding of
//! `ids[prefix..read]`, and nothing is emitted while the decoded text ends in an incomplete UTF-8
//! sequence (U+FFFD). Each step decodes only a few tokens, so the cost per token is constant.

use tokenizers::Tokenizer;

use crate::batch::TextError;
use crate::pieces::PieceDecoder;

/// What decodes ids: the tokenizer, and its precomputed piece table when its decoder has one (the
/// same text, without `tokenizers`' per-call allocations and regex).
#[derive(Debug, Clone, Copy)]
pub struct Detok<'a> {
    /// The checkpoint's tokenizer.
    pub tok: &'a Tokenizer,
    /// [`PieceDecoder::new`] of `tok`, if any.
    pub pieces: Option<&'a PieceDecoder>,
}

impl<'a> From<&'a Tokenizer> for Detok<'a> {
    fn from(tok: &'a Tokenizer) -> Self {
        Detok { tok, pieces: None }
    }
}

/// Incremental decoder of one sequence's output: turns tokens into text as they arrive, with the
/// same result as decoding the whole output at once (prefix/read offsets, see the module docs).
#[derive(Debug, Clone, Default)]
pub struct IncrementalDecoder {
    /// Context tokens (the prompt's tail) followed by the output tokens fed so far.
    ids: Vec<u32>,
    /// Start of the window decoded as context for the next chunk.
    prefix_offset: usize,
    /// End of what has been emitted as text.
    read_offset: usize,
}

impl IncrementalDecoder {
    /// A decoder whose first output token is decoded after `context` (the prompt's last tokens).
    pub fn new(context: &[u32]) -> Self {
        Self {
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
        }
    }

    /// Feeds one token; returns the text it completes (often empty while a multi-byte character
    /// is still incomplete).
    pub fn push<'a>(
        &mut self,
        tok: impl Into<Detok<'a>>,
        id: u32,
        skip_special: bool,
    ) -> Result<String, TextError> {
        let mut out = String::new();
        let mut scratch = DecodeScratch::default();
        self.push_into(tok.into(), id, skip_special, &mut scratch, &mut out)?;
        Ok(out)
    }

    /// [`IncrementalDecoder::push`] appending the text to `out`, decoding in `scratch`: no
    /// allocation per token once the buffers have grown (the batch's path).
    pub fn push_into(
        &mut self,
        tok: Detok<'_>,
        id: u32,
        skip_special: bool,
        scratch: &mut DecodeScratch,
        out: &mut String,
    ) -> Result<(), TextError> {
        self.ids.push(id);
        self.emit(tok, skip_special, false, scratch, out)
    }

    /// Appends tokens without decoding them (the next `push`/`flush` decodes them together).
    pub fn extend(&mut self, ids: &[u32]) {
        self.ids.extend_from_slice(ids);
    }

    /// Emits whatever is still held back (an incomplete UTF-8 sequence decodes to U+FFFD), at finish.
    pub fn flush<'a>(
        &mut self,
        tok: impl Into<Detok<'a>>,
        skip_special: bool,
    ) -> Result<String, TextError> {
        let mut out = String::new();
        if self.read_offset == self.ids.len() {
            return Ok(out);
        }
        let mut scratch = DecodeScratch::default();
        self.emit(tok.into(), skip_special, true, &mut scratch, &mut out)?;
        Ok(out)
    }

    /// Appends to `out` the text the tokens since the last emission complete, unless it still
    /// ends in an incomplete character or adds nothing (then it waits), or when `force`d.
    fn emit(
        &mut self,
        tok: Detok<'_>,
        skip_special: bool,
        force: bool,
        scratch: &mut DecodeScratch,
        out: &mut String,
    ) -> Result<(), TextError> {
        let DecodeScratch {
            prefix,
            full,
            bytes,
        } = scratch;
        let window = &self.ids[self.prefix_offset..];
        let read = self.read_offset - self.prefix_offset;
        decode_into(tok, &window[..read], skip_special, prefix, bytes)?;
        decode_into(tok, window, skip_special, full, bytes)?;
        if !force && (full.len() <= prefix.len() || full.ends_with('\u{FFFD}')) {
            return Ok(());
        }
        if full.starts_with(prefix.as_str()) {
            out.push_str(&full[prefix.len()..]);
        } else {
            // The decoder rewrote the context (rare); emit from the first char boundary past it.
            let mut cut = prefix.len().min(full.len());
            while !full.is_char_boundary(cut) {
                cut += 1;
            }
            out.push_str(&full[cut..]);
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(())
    }
}

/// Buffers an [`IncrementalDecoder`] decodes its windows into, reused across tokens and requests
/// (a [`crate::TextBatch`] holds one).
#[derive(Debug, Default)]
pub struct DecodeScratch {
    prefix: String,
    full: String,
    bytes: Vec<u8>,
}

/// `decode`, into `out` (cleared first); `bytes` is scratch for byte-fallback runs.
fn decode_into(
    tok: Detok<'_>,
    ids: &[u32],
    skip_special: bool,
    out: &mut String,
    bytes: &mut Vec<u8>,
) -> Result<(), TextError> {
    out.clear();
    if ids.is_empty() {
        return Ok(());
    }
    match tok.pieces {
        Some(p) => p.decode_into(ids, skip_special, out, bytes),
        None => out.push_str(
            &tok.tok
                .decode(ids, skip_special)
                .map_err(|e| TextError::Tokenizer(e.to_string()))?,
        ),
    }
    Ok(())
}

pub(crate) fn decode(tok: Detok<'_>, ids: &[u32], skip_special: bool) -> Result<String, TextError> {
    if ids.is_empty() {
        return Ok(String::new());
    }
    if let Some(p) = tok.pieces {
        return Ok(p.decode(ids, skip_special));
    }
    tok.tok
        .decode(ids, skip_special)
        .map_err(|e| TextError::Tokenizer(e.to_string()))
}
