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
        self.ids.push(id);
        self.emit(tok.into(), skip_special, false)
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
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        self.emit(tok.into(), skip_special, true)
    }

    fn emit(
        &mut self,
        tok: Detok<'_>,
        skip_special: bool,
        force: bool,
    ) -> Result<String, TextError> {
        let prefix = decode(
            tok,
            &self.ids[self.prefix_offset..self.read_offset],
            skip_special,
        )?;
        let full = decode(tok, &self.ids[self.prefix_offset..], skip_special)?;
        if !force && (full.len() <= prefix.len() || full.ends_with('\u{FFFD}')) {
            return Ok(String::new());
        }
        let delta = if full.starts_with(&prefix) {
            full[prefix.len()..].to_string()
        } else {
            // The decoder rewrote the context (rare); emit from the first char boundary past it.
            let mut cut = prefix.len().min(full.len());
            while !full.is_char_boundary(cut) {
                cut += 1;
            }
            full[cut..].to_string()
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(delta)
    }
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
