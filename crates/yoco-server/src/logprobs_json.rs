//! Logprobs in the API's shapes, as the Python server writes them (`serve/logprobs.py`):
//! completions (`tokens` / `token_logprobs` / `top_logprobs` / `text_offset`), chat (`content:
//! [{token, logprob, bytes, top_logprobs}]`), and vLLM's `prompt_logprobs` (per prompt position
//! null or `{token_id: {logprob, rank, decoded_token}}`).
//!
//! A position's entries are the chosen token (with its own rank) and the `k` most likely tokens,
//! ordered by rank; JSON has no `-inf`, so non-finite logprobs are written `-9999.0` (vLLM's
//! clamp). Keys of `top_logprobs` are token texts: two tokens with one text keep one key (the
//! later one's logprob, as Python's dict does). Text offsets count characters, as Python does.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use serde_json::{json, Map, Value};

use crate::app::AppState;
use crate::logprobs::{PromptLogprobs, TokenLogprob};

/// JSON has no -inf: clamp like vLLM.
fn clamp(x: f32) -> Value {
    json!(if x.is_finite() { x as f64 } else { -9999.0 })
}

/// Token id -> display text: the token decoded alone with special tokens kept, or `token_id:N`
/// (`return_tokens_as_token_ids`). Decodes each id once per response.
pub(crate) struct TokenText {
    state: Arc<AppState>,
    as_ids: bool,
    cache: FxHashMap<u32, String>,
}

impl TokenText {
    /// Texts from the server's tokenizer; `as_ids`: `return_tokens_as_token_ids`.
    pub(crate) fn new(state: Arc<AppState>, as_ids: bool) -> Self {
        Self {
            state,
            as_ids,
            cache: FxHashMap::default(),
        }
    }

    /// The display text of `id`.
    pub(crate) fn text(&mut self, id: u32) -> String {
        if self.as_ids {
            return format!("token_id:{id}");
        }
        self.decoded(id)
    }

    /// `id` decoded alone (what `decoded_token` holds whatever the display setting).
    pub(crate) fn decoded(&mut self, id: u32) -> String {
        let tok = &self.state.tok;
        self.cache
            .entry(id)
            .or_insert_with(|| tok.decode(&[id], false).unwrap_or_default())
            .clone()
    }
}

/// A position's entries in rank order (ties: higher logprob first): the chosen token with its
/// rank and the alternatives not equal to it, with theirs (`i + 1`).
fn ranked(lp: &TokenLogprob) -> Vec<(u32, f32, u32)> {
    let mut v = Vec::with_capacity(lp.top.len() + 1);
    v.push((lp.token, lp.logprob, lp.rank));
    for (j, &(t, l)) in lp.top.iter().enumerate() {
        if t != lp.token {
            v.push((t, l, j as u32 + 1));
        }
    }
    v.sort_by(|a, b| a.2.cmp(&b.2).then(b.1.total_cmp(&a.1)));
    v
}

/// The completions-form logprobs of one choice, accumulated across its blocks (streaming sends one
/// block per chunk; offsets continue).
#[derive(Default)]
pub(crate) struct CompletionLogprobs {
    offset: usize,
}

impl CompletionLogprobs {
    /// The block of `tokens`, each with its logprobs when known (`None`: nulls, as the first
    /// prompt token of an echo).
    pub(crate) fn block<'l>(
        &mut self,
        text: &mut TokenText,
        tokens: impl IntoIterator<Item = (u32, Option<&'l TokenLogprob>)>,
    ) -> Value {
        let (mut toks, mut lps, mut tops, mut offs) = (vec![], vec![], vec![], vec![]);
        for (id, lp) in tokens {
            let s = text.text(id);
            offs.push(json!(self.offset));
            self.offset += s.chars().count();
            match lp {
                Some(lp) => {
                    lps.push(clamp(lp.logprob));
                    let mut top = Map::new();
                    for (t, l, _) in ranked(lp) {
                        top.insert(text.text(t), clamp(l));
                    }
                    tops.push(Value::Object(top));
                }
                None => {
                    lps.push(Value::Null);
                    tops.push(Value::Null);
                }
            }
            toks.push(json!(s));
        }
        json!({"tokens": toks, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offs})
    }
}

/// The block of an echoed prompt (`prompt_logprobs[j]` for token j; position 0 has none) followed
/// by the generated tokens': one completions-form object.
pub(crate) fn echo_and_output(
    lp: &mut CompletionLogprobs,
    text: &mut TokenText,
    prompt: Option<(&[u32], Option<&PromptLogprobs>)>,
    tokens: &[u32],
    logprobs: &[TokenLogprob],
) -> Value {
    let out = |lp: &mut CompletionLogprobs, text: &mut TokenText| {
        lp.block(
            text,
            tokens
                .iter()
                .enumerate()
                .map(|(j, &t)| (t, logprobs.get(j))),
        )
    };
    let Some((ids, plp)) = prompt else {
        return out(lp, text);
    };
    let mut head = lp.block(
        text,
        ids.iter()
            .enumerate()
            .map(|(j, &t)| (t, plp.and_then(|p| p.get(j)).and_then(Option::as_ref))),
    );
    let tail = out(lp, text);
    for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        if let (Some(a), Some(Value::Array(b))) = (head[k].as_array_mut(), tail.get(k)) {
            a.extend(b.iter().cloned());
        }
    }
    head
}

/// The chat-form logprobs (`content` entries with UTF-8 bytes and the `top_n` most likely
/// alternatives) of `tokens` (for `/v1/chat/completions`' `logprobs` + `top_logprobs`).
pub(crate) fn chat_logprobs(
    text: &mut TokenText,
    tokens: &[u32],
    logprobs: &[TokenLogprob],
    top_n: usize,
) -> Value {
    let content: Vec<Value> = tokens
        .iter()
        .enumerate()
        .map(|(j, &id)| {
            let s = text.text(id);
            let (logprob, top) = match logprobs.get(j) {
                Some(lp) => (
                    clamp(lp.logprob),
                    ranked(lp)
                        .into_iter()
                        .take(top_n)
                        .map(|(t, l, _)| {
                            let ts = text.text(t);
                            json!({"token": ts, "logprob": clamp(l), "bytes": ts.as_bytes()})
                        })
                        .collect::<Vec<_>>(),
                ),
                None => (json!(-9999.0), vec![]),
            };
            json!({"token": s, "logprob": logprob, "bytes": s.as_bytes(), "top_logprobs": top})
        })
        .collect();
    json!({ "content": content })
}

/// vLLM's `prompt_logprobs`: per prompt position null (the first) or `{token_id: {logprob, rank,
/// decoded_token}}` (the prompt's token first, then the alternatives).
pub(crate) fn prompt_logprobs_json(text: &mut TokenText, plp: Option<&PromptLogprobs>) -> Value {
    let Some(plp) = plp else {
        return Value::Null;
    };
    let out: Vec<Value> = plp
        .iter()
        .map(|pos| match pos {
            None => Value::Null,
            Some(lp) => {
                let mut m = Map::new();
                m.insert(
                    lp.token.to_string(),
                    json!({"logprob": clamp(lp.logprob), "rank": lp.rank, "decoded_token": text.decoded(lp.token)}),
                );
                for (j, &(t, l)) in lp.top.iter().enumerate() {
                    if t != lp.token {
                        m.insert(
                            t.to_string(),
                            json!({"logprob": clamp(l), "rank": j + 1, "decoded_token": text.decoded(t)}),
                        );
                    }
                }
                Value::Object(m)
            }
        })
        .collect();
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lp(token: u32, logprob: f32, rank: u32, top: &[(u32, f32)]) -> TokenLogprob {
        TokenLogprob {
            token,
            logprob,
            rank,
            top: top.to_vec(),
        }
    }

    #[test]
    fn entries_are_ranked_with_the_chosen_token_once_and_non_finite_values_clamped() {
        let a = lp(7, -3.0, 4, &[(1, -0.5), (2, -1.0)]);
        assert_eq!(ranked(&a), vec![(1, -0.5, 1), (2, -1.0, 2), (7, -3.0, 4)]);
        let b = lp(2, -1.0, 2, &[(1, -0.5), (2, -1.0)]);
        assert_eq!(ranked(&b), vec![(1, -0.5, 1), (2, -1.0, 2)]);
        assert_eq!(clamp(f32::NEG_INFINITY), json!(-9999.0));
        assert_eq!(clamp(f32::NAN), json!(-9999.0));
        assert_eq!(clamp(-0.5), json!(-0.5));
    }
}
