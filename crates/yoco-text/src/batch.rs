//! [`TextBatch`]: the text state of every live request, advanced for a whole step in one call.

use rustc_hash::FxHashMap;
use tokenizers::Tokenizer;

use crate::incremental::{decode, DecodeScratch, Detok, IncrementalDecoder};
use crate::pieces::PieceDecoder;
use crate::stop::StopStrings;
use crate::PROMPT_CONTEXT_TOKENS;

/// Why a text operation failed; `yoco-py` raises each as a Python exception carrying the message.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// The tokenizer failed to load (`tokenizer.json` missing or malformed) or to decode ids (an id
    /// outside the vocabulary); the tokenizer's own message.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// [`TextBatch::add`] was given an id that is still live: its text state would be overwritten.
    #[error("request {0} is already registered")]
    Duplicate(u64),
}

/// Finish codes of `yoco_core::sched::plan::FinishReason` that mean "stopped by a sampled stop token
/// or EOS": that token's text is left out unless `include_stop_str_in_output` (vLLM semantics).
const FINISH_EOS: u8 = 1;
const FINISH_STOP_TOKEN: u8 = 2;

/// Per-request text options (from `SamplingParams`).
#[derive(Debug, Clone, Default)]
pub struct SeqOptions {
    /// Leave special tokens (BOS, turn markers, ...) out of the text, as vLLM does by default.
    pub skip_special_tokens: bool,
    /// Keep the matched stop string, or the text of the EOS / stop token that ended the request,
    /// at the end of the output (vLLM's flag of that name); otherwise the text stops before it.
    pub include_stop_str_in_output: bool,
    /// Stop strings: the request ends at the earliest occurrence of any (empty strings ignored).
    pub stop: Vec<String>,
    /// Produce per-step deltas (streaming); otherwise only the final text is read.
    pub stream: bool,
    /// Decode text at all (false: only the token ids are kept, like vLLM's `detokenize=False`).
    pub detokenize: bool,
}

#[derive(Debug)]
struct SeqText {
    decoder: IncrementalDecoder,
    /// Every output token received (stop tokens included).
    tokens: Vec<u32>,
    text: String,
    /// Bytes of `text` already returned as deltas.
    emitted: usize,
    stops: StopStrings,
    opts: SeqOptions,
    /// Stopped by a stop string (text truncated, nothing more is appended).
    stopped: bool,
    /// Output tokens fed to `decoder` so far (a lazy request feeds them all at finish or on `take`).
    decoded: usize,
    /// The core finished the request (its text is final).
    finished: bool,
}

impl SeqText {
    /// Neither streamed nor searched for stop strings: decoded once when it finishes.
    fn lazy(&self) -> bool {
        !self.opts.stream && self.stops.is_empty()
    }

    /// Feeds `tokens[decoded..n]` to the decoder one at a time, exactly as streaming does, so a
    /// request's text does not depend on whether it streamed (vLLM builds both from one incremental
    /// detokenizer). Text still held back at the end (an incomplete UTF-8 sequence) is never
    /// emitted, as in vLLM.
    fn catch_up(
        &mut self,
        tok: Detok<'_>,
        scratch: &mut DecodeScratch,
        n: usize,
    ) -> Result<(), TextError> {
        let skip = self.opts.skip_special_tokens;
        while self.decoded < n {
            let id = self.tokens[self.decoded];
            self.decoder
                .push_into(tok, id, skip, scratch, &mut self.text)?;
            self.decoded += 1;
        }
        Ok(())
    }
}

/// What one [`TextBatch::step`] produced, as flat arrays over the step's input positions `k`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StepText {
    /// Positions whose (streaming) request has new text, ascending.
    pub delta_idx: Vec<u32>,
    /// The new text of each `delta_idx` entry.
    pub deltas: Vec<String>,
    /// Positions whose request matched a stop string this step (the engine finishes it in the core).
    pub stop_idx: Vec<u32>,
    /// Which of the request's stop strings matched, per `stop_idx` entry.
    pub stop_which: Vec<u32>,
}

impl StepText {
    fn clear(&mut self) {
        self.delta_idx.clear();
        self.deltas.clear();
        self.stop_idx.clear();
        self.stop_which.clear();
    }
}

/// The text state of all live requests.
pub struct TextBatch {
    tok: Tokenizer,
    /// The tokenizer's piece table, when its decoder has one ([`PieceDecoder`]).
    pieces: Option<PieceDecoder>,
    /// Decoding buffers shared by every request (no allocation per token).
    scratch: DecodeScratch,
    seqs: FxHashMap<u64, SeqText>,
    out: StepText,
}

impl TextBatch {
    /// An empty batch decoding with `tok` (the checkpoint's tokenizer).
    pub fn new(tok: Tokenizer) -> Self {
        Self {
            pieces: PieceDecoder::new(&tok),
            scratch: DecodeScratch::default(),
            tok,
            seqs: FxHashMap::default(),
            out: StepText::default(),
        }
    }

    /// An empty batch that always decodes through `tokenizers` (the reference the piece table is
    /// tested and benchmarked against).
    pub fn without_piece_table(tok: Tokenizer) -> Self {
        Self {
            pieces: None,
            ..Self::new(tok)
        }
    }

    /// Whether decoding uses the precomputed piece table (the tokenizer's decoder is the
    /// SentencePiece kind [`PieceDecoder`] reproduces) rather than `tokenizers`' decoder chain.
    pub fn uses_piece_table(&self) -> bool {
        self.pieces.is_some()
    }

    /// An empty batch with the tokenizer loaded from a `tokenizer.json` at `path`
    /// ([`TextError::Tokenizer`] names the load failure).
    pub fn from_file(path: &str) -> Result<Self, TextError> {
        Ok(Self::new(
            Tokenizer::from_file(path).map_err(|e| TextError::Tokenizer(e.to_string()))?,
        ))
    }

    /// The tokenizer, for callers that encode prompts with the same vocabulary.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tok
    }

    /// Registers a request; its first output token is decoded in the context of the prompt's tail.
    pub fn add(&mut self, id: u64, prompt: &[u32], opts: SeqOptions) -> Result<(), TextError> {
        if self.seqs.contains_key(&id) {
            return Err(TextError::Duplicate(id));
        }
        let ctx = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT_TOKENS)..];
        let stops = StopStrings::new(opts.stop.clone());
        let seq = SeqText {
            decoder: IncrementalDecoder::new(ctx),
            tokens: Vec::new(),
            text: String::new(),
            emitted: 0,
            stops,
            opts,
            stopped: false,
            decoded: 0,
            finished: false,
        };
        self.seqs.insert(id, seq);
        Ok(())
    }

    /// Forgets a request (abort, or after its final text was taken). Unknown ids: false.
    pub fn remove(&mut self, id: u64) -> bool {
        self.seqs.remove(&id).is_some()
    }

    /// Whether `id` is registered (added and not yet removed or taken).
    pub fn contains(&self, id: u64) -> bool {
        self.seqs.contains_key(&id)
    }

    /// Registered requests: each holds decoder state until it is removed or taken.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    /// No request is registered.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The request's text so far (stop string already cut; empty until the end for requests that
    /// neither stream nor have stop strings).
    pub fn text(&self, id: u64) -> Option<&str> {
        self.seqs.get(&id).map(|s| s.text.as_str())
    }

    /// The request's output token ids so far.
    pub fn tokens(&self, id: u64) -> Option<&[u32]> {
        self.seqs.get(&id).map(|s| s.tokens.as_slice())
    }

    /// Removes the request and returns its final text and output token ids. A lazy request taken
    /// before it finished (an abort) is decoded now, so its partial text matches its tokens.
    pub fn take(&mut self, id: u64) -> Option<(String, Vec<u32>)> {
        let mut s = self.seqs.remove(&id)?;
        if s.lazy() && s.opts.detokenize && !s.finished {
            let n = s.tokens.len();
            if s.catch_up(
                Detok {
                    tok: &self.tok,
                    pieces: self.pieces.as_ref(),
                },
                &mut self.scratch,
                n,
            )
            .is_err()
            {
                s.text.clear();
            }
        }
        Some((s.text, s.tokens))
    }

    /// Advances the requests of one step. `ids[k]` received `tokens[k]` (-1: none) and has core
    /// finish code `finish[k]` (0 = running). Ids this batch does not know (requests without
    /// detokenization) are skipped. A request that matched a stop string ignores later tokens.
    pub fn step(
        &mut self,
        ids: &[u64],
        tokens: &[i32],
        finish: &[u8],
    ) -> Result<&StepText, TextError> {
        self.out.clear();
        for k in 0..ids.len() {
            let Some(seq) = self.seqs.get_mut(&ids[k]) else {
                continue;
            };
            if seq.stopped {
                continue;
            }
            let code = finish.get(k).copied().unwrap_or(0);
            let tok = tokens[k];
            if tok >= 0 {
                seq.tokens.push(tok as u32);
            }
            if !seq.opts.detokenize {
                continue;
            }
            let skip = seq.opts.skip_special_tokens;
            let old_len = seq.text.len();
            let stop_token = code == FINISH_EOS || code == FINISH_STOP_TOKEN;
            let decode_tok = tok >= 0 && (!stop_token || seq.opts.include_stop_str_in_output);
            if seq.lazy() {
                // Nobody reads this text before the end: decode it at finish, token by token as
                // streaming does (the same text).
                if code != 0 {
                    let n = seq.tokens.len() - usize::from(tok >= 0 && !decode_tok);
                    seq.catch_up(
                        Detok {
                            tok: &self.tok,
                            pieces: self.pieces.as_ref(),
                        },
                        &mut self.scratch,
                        n,
                    )?;
                    seq.finished = true;
                }
                continue;
            }
            if decode_tok {
                let d = Detok {
                    tok: &self.tok,
                    pieces: self.pieces.as_ref(),
                };
                seq.decoder
                    .push_into(d, tok as u32, skip, &mut self.scratch, &mut seq.text)?;
            }
            seq.decoded = seq.tokens.len();
            if code != 0 {
                seq.finished = true;
            }
            if let Some((at, which)) = seq.stops.find(&seq.text, old_len) {
                let keep = if seq.opts.include_stop_str_in_output {
                    at + seq.opts.stop[which].len()
                } else {
                    at
                };
                seq.text.truncate(keep);
                seq.stopped = true;
                self.out.stop_idx.push(k as u32);
                self.out.stop_which.push(which as u32);
            }
            if seq.opts.stream {
                let done = seq.stopped || code != 0;
                let mut limit = seq.text.len();
                if !done && !seq.opts.include_stop_str_in_output && !seq.stops.is_empty() {
                    // Hold back what could be the start of a stop string, so text is never retracted.
                    limit = limit
                        .saturating_sub(seq.stops.max_len() - 1)
                        .max(seq.emitted);
                    while !seq.text.is_char_boundary(limit) {
                        limit -= 1;
                    }
                }
                if limit > seq.emitted {
                    self.out.delta_idx.push(k as u32);
                    self.out
                        .deltas
                        .push(seq.text[seq.emitted..limit].to_string());
                    seq.emitted = limit;
                }
            }
        }
        Ok(&self.out)
    }

    /// Moves the last [`TextBatch::step`]'s result out (its strings without copying); the next
    /// step starts from empty buffers unless this one is given back ([`TextBatch::recycle_step`]).
    pub fn take_step(&mut self) -> StepText {
        std::mem::take(&mut self.out)
    }

    /// Gives back a [`StepText`] from [`TextBatch::take_step`] once its strings were moved out, so
    /// the next step writes into its already allocated arrays.
    pub fn recycle_step(&mut self, mut old: StepText) {
        if old.delta_idx.capacity() > self.out.delta_idx.capacity() {
            old.clear();
            self.out = old;
        }
    }

    /// Decodes a whole id sequence.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TextError> {
        decode(
            Detok {
                tok: &self.tok,
                pieces: self.pieces.as_ref(),
            },
            ids,
            skip_special,
        )
    }

    /// Decodes each id on its own (logprob tokens), special tokens included.
    pub fn decode_each(&self, ids: &[u32]) -> Result<Vec<String>, TextError> {
        ids.iter()
            .map(|&i| {
                decode(
                    Detok {
                        tok: &self.tok,
                        pieces: self.pieces.as_ref(),
                    },
                    &[i],
                    false,
                )
            })
            .collect()
    }
}
