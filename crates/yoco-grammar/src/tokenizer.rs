//! The grammar engine's view of a Hugging Face tokenizer: every token's bytes (the token trie llguidance
//! walks) and a tokenizer for the few places llguidance re-tokenizes text.
//!
//! Built on the `tokenizers` crate the workspace already uses (`yoco-text`), rather than
//! `toktrie_hf_tokenizers`, which pins an older `tokenizers` and so compiles a second copy of it. The
//! mapping follows the conventions llguidance's own integration uses, so masks are the same:
//! - added tokens that are `special`, or look like `<...>`, are special: their trie entry is the marker
//!   byte `0xFF` then the name (grammars reach them only by name, text never produces them);
//! - byte-fallback vocabularies (SentencePiece, Gemma): `<0xHH>` is the byte `HH`; other pieces are
//!   their text with the decoder's space stand-in (`▁`, read from its `Replace` step) turned into `' '`;
//! - byte-level vocabularies (GPT-2 style): each char maps back to the byte it stands for;
//! - ids past the tokenizer (a model's padding rows) are special placeholders no text matches;
//! - text is re-tokenized with normalizers that prepend a space and pre-tokenizers that prepend `▁`
//!   turned off (a continuation is not the start of a sentence).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use tokenizers::normalizers::{self, NormalizerWrapper};
use tokenizers::pre_tokenizers::{self, PreTokenizerWrapper};
use tokenizers::{DecoderWrapper, Tokenizer};

use crate::GrammarError;

/// How the vocabulary spells bytes (from its decoder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spelling {
    /// `<0xHH>` byte pieces, text pieces with `space` standing for `' '`.
    ByteFallback { space: char },
    /// GPT-2's byte-to-char table.
    ByteLevel,
}

/// Every token's bytes as the token trie holds them, and the tokenizer's special ids.
pub struct TokenBytes {
    pub info: TokRxInfo,
    pub bytes: Vec<Vec<u8>>,
}

/// The bytes of every token of `tok` (see the module docs for the conventions).
pub fn token_bytes(tok: &Tokenizer) -> Result<TokenBytes, GrammarError> {
    let spelling = spelling(tok)?;
    let n = tok.get_vocab_size(true) as u32;
    let mut info = TokRxInfo::new(n, 0);
    let mut bytes: Vec<Vec<u8>> = vec![Vec::new(); n as usize];
    let mut added: Vec<_> = tok.get_added_tokens_decoder().into_iter().collect();
    added.sort_by_key(|(id, _)| *id);
    let mut special = HashSet::new();
    for (id, t) in &added {
        if (*id as usize) >= bytes.len() {
            continue;
        }
        if t.special || (t.content.starts_with('<') && t.content.ends_with('>')) {
            match t.content.as_str() {
                "</s>"
                | "<|endoftext|>"
                | "<|end_of_text|>"
                | "<｜end▁of▁sentence｜>"
                | "<eos>" => info.tok_eos = *id,
                "<|end|>" | "<|eot_id|>" | "<|im_end|>" => info.tok_end_of_turn = Some(*id),
                "<unk>" | "<|unk|>" => info.tok_unk = Some(*id),
                "<pad>" | "<|pad|>" => info.tok_pad = Some(*id),
                _ => {}
            }
            special.insert(*id);
        } else {
            bytes[*id as usize] = t.content.clone().into_bytes();
        }
    }
    let chars = byte_level_chars();
    for id in 0..n {
        let Some(name) = tok.id_to_token(id) else {
            continue;
        };
        let b = if special.contains(&id) {
            let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            b.extend_from_slice(name.as_bytes());
            b
        } else {
            match spelling {
                Spelling::ByteFallback { space } => match byte_piece(&name) {
                    Some(byte) => vec![byte],
                    None => name.replace(space, " ").into_bytes(),
                },
                Spelling::ByteLevel => match name
                    .chars()
                    .map(|c| chars.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                {
                    Some(b) => b,
                    None => continue, // not a byte-level spelling: keep what the added tokens gave
                },
            }
        };
        bytes[id as usize] = b;
    }
    Ok(TokenBytes { info, bytes })
}

/// `<0xHH>` → `HH`.
fn byte_piece(name: &str) -> Option<u8> {
    let hex = name.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// GPT-2's table: printable Latin-1 bytes stand for themselves, the others for `U+0100` onwards in order.
fn byte_level_chars() -> HashMap<char, u8> {
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            let c = b as char;
            if matches!(c, '!'..='~' | '\u{A1}'..='\u{AC}' | '\u{AE}'..='\u{FF}') {
                (c, b)
            } else {
                let c = char::from_u32(next).expect("valid char");
                next += 1;
                (c, b)
            }
        })
        .collect()
}

fn spelling(tok: &Tokenizer) -> Result<Spelling, GrammarError> {
    fn walk(d: &DecoderWrapper, fallback: &mut bool, level: &mut bool, space: &mut char) {
        match d {
            DecoderWrapper::ByteFallback(_) => *fallback = true,
            DecoderWrapper::ByteLevel(_) => *level = true,
            DecoderWrapper::Replace(r) if r.content == " " => {
                // The pattern is private; its serialized form names it.
                if let Ok(v) = serde_json::to_value(r) {
                    if let Some(s) = v["pattern"]["String"].as_str() {
                        let mut it = s.chars();
                        if let (Some(c), None) = (it.next(), it.next()) {
                            *space = c;
                        }
                    }
                }
            }
            DecoderWrapper::Sequence(s) => {
                for d in s.get_decoders() {
                    walk(d, fallback, level, space);
                }
            }
            _ => {}
        }
    }
    let (mut fallback, mut level, mut space) = (false, false, ' ');
    if let Some(d) = tok.get_decoder() {
        walk(d, &mut fallback, &mut level, &mut space);
    }
    if fallback {
        Ok(Spelling::ByteFallback { space })
    } else if level {
        Ok(Spelling::ByteLevel)
    } else {
        Err(GrammarError::Tokenizer(format!(
            "cannot tell how the tokenizer spells bytes (its decoder has neither ByteFallback nor ByteLevel): {:?}",
            tok.get_decoder()
        )))
    }
}

/// `tok` set up to tokenize continuations: no prepended space from its normalizer or pre-tokenizer.
fn for_continuations(mut tok: Tokenizer) -> Result<Tokenizer, GrammarError> {
    fn norm(n: NormalizerWrapper) -> Option<NormalizerWrapper> {
        match n {
            NormalizerWrapper::Prepend(_) => None,
            NormalizerWrapper::Sequence(s) => {
                let kept: Vec<_> = s.as_ref().iter().filter_map(|n| norm(n.clone())).collect();
                (!kept.is_empty())
                    .then(|| NormalizerWrapper::Sequence(normalizers::Sequence::new(kept)))
            }
            n => Some(n),
        }
    }
    fn pre(p: PreTokenizerWrapper) -> PreTokenizerWrapper {
        match p {
            PreTokenizerWrapper::Metaspace(mut m) => {
                m.prepend_scheme = pre_tokenizers::metaspace::PrependScheme::Never;
                PreTokenizerWrapper::Metaspace(m)
            }
            PreTokenizerWrapper::Sequence(s) => {
                PreTokenizerWrapper::Sequence(pre_tokenizers::sequence::Sequence::new(
                    s.as_ref().iter().map(|p| pre(p.clone())).collect(),
                ))
            }
            p => p,
        }
    }
    if let Some(n) = tok.get_normalizer().cloned() {
        tok.with_normalizer(norm(n))
            .map_err(|e| GrammarError::Tokenizer(format!("normalizer: {e}")))?;
    }
    if let Some(p) = tok.get_pre_tokenizer().cloned() {
        tok.with_pre_tokenizer(Some(pre(p)));
    }
    Ok(tok)
}

/// The token trie plus the tokenizer, as llguidance's `TokenizerEnv`.
struct HfEnv {
    trie: TokTrie,
    tok: Tokenizer,
}

impl HfEnv {
    fn encode(&self, s: &str) -> Vec<TokenId> {
        self.tok
            .encode(s, false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }
}

impl TokenizerEnv for HfEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie
            .tokenize_with_greedy_fallback(s, |s| self.encode(s))
    }

    fn tokenize_bytes_special(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |s| {
            self.trie.tokenize_with_special(s, |s| self.encode(s))
        })
    }
}

/// llguidance's tokenizer environment for a `tokenizer.json`: masks `vocab_size` wide (ids past the
/// tokenizer are placeholders never allowed), `eos_ids` (those inside the tokenizer) the EOS set.
/// Returns the environment and the EOS ids kept.
pub fn tok_env(
    json: &[u8],
    vocab_size: usize,
    eos_ids: &[TokenId],
) -> Result<(TokEnv, Vec<TokenId>), GrammarError> {
    let tok = Tokenizer::from_bytes(json)
        .map_err(|e| GrammarError::Tokenizer(format!("error loading tokenizer: {e}")))?;
    let TokenBytes {
        mut info,
        mut bytes,
    } = token_bytes(&tok)?;
    let n = bytes.len();
    let eos: Vec<TokenId> = eos_ids
        .iter()
        .copied()
        .filter(|&t| (t as usize) < n)
        .collect();
    if let Some(&first) = eos.first() {
        info.tok_eos = first;
    }
    while bytes.len() < vocab_size {
        let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        b.extend_from_slice(format!("<[{}]>", bytes.len()).as_bytes());
        bytes.push(b);
    }
    info.vocab_size = bytes.len() as u32;
    let mut trie = TokTrie::from(&info, &bytes);
    if eos.len() > 1 {
        trie = trie.with_eos_tokens(&eos);
    }
    Ok((
        Arc::new(HfEnv {
            trie,
            tok: for_continuations(tok)?,
        }),
        eos,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_pieces_parse_only_the_two_digit_hex_form() {
        assert_eq!(byte_piece("<0x41>"), Some(0x41));
        assert_eq!(byte_piece("<0x0A>"), Some(0x0A));
        assert_eq!(byte_piece("<0x4>"), None);
        assert_eq!(byte_piece("<0xZZ>"), None);
        assert_eq!(byte_piece("0x41"), None);
    }

    #[test]
    fn byte_level_table_is_a_bijection_with_printables_fixed() {
        let m = byte_level_chars();
        assert_eq!(m.len(), 256);
        let bytes: HashSet<u8> = m.values().copied().collect();
        assert_eq!(bytes.len(), 256);
        assert_eq!(m[&'a'], b'a');
        assert_eq!(m[&'Ġ'], b' '); // GPT-2's space
        assert_eq!(m[&'Ċ'], b'\n');
    }
}
