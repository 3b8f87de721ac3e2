//! Logprobs through the step loop and the executor seam, black-box over HTTP with the mock model:
//! each request (under `n`, batched prompts, concurrency, chunked prefill and preemption) gets
//! its own sampled-token and prompt logprobs, in the Python server's shapes, streamed and not.
//!
//! The mock's logprobs are pure functions of what the client sees (`MockModel::sample_logprob` of
//! the token, `MockModel::prompt_logprob` of the prompt token and its position), so a value routed
//! to the wrong request, row or position shows.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{encode, sse_events, tokenizer, Opts, TestServer};
use serde_json::{json, Value};
use yoco_server::MockModel;

fn vocab() -> u32 {
    tokenizer().get_vocab_size(true) as u32
}

fn id_of(tok: &Value) -> u32 {
    tok.as_str()
        .and_then(|t| t.strip_prefix("token_id:"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("not a token_id:N token: {tok}"))
}

/// `{text: logprob}` as the server writes a position's alternatives (the chosen token included,
/// ranked), from the mock's entry for it.
fn expected_top(chosen: u32, (lp, _, top): &(f32, i32, Vec<(i32, f32)>)) -> BTreeMap<String, f64> {
    let mut m: BTreeMap<String, f64> = top
        .iter()
        .map(|&(t, l)| (format!("token_id:{t}"), l as f64))
        .collect();
    m.insert(format!("token_id:{chosen}"), *lp as f64);
    m
}

fn top_of(v: &Value) -> BTreeMap<String, f64> {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, x)| (k.clone(), x.as_f64().unwrap()))
        .collect()
}

/// A choice's completions-form logprobs are the mock's for its own tokens; the tokens are the
/// choice's (`token_ids` of the text); offsets count characters.
fn check_sampled(lp: &Value, k: usize, first: usize) {
    let v = vocab();
    let toks = lp["tokens"].as_array().unwrap();
    assert!(!toks.is_empty());
    let mut offset = lp["text_offset"][0].as_u64().unwrap() as usize;
    for (j, t) in toks.iter().enumerate().skip(first) {
        let id = id_of(t);
        let want = MockModel::sample_logprob(v, id, k);
        assert_eq!(
            lp["token_logprobs"][j].as_f64().unwrap(),
            want.0 as f64,
            "token {j}"
        );
        assert_eq!(
            top_of(&lp["top_logprobs"][j]),
            expected_top(id, &want),
            "token {j}"
        );
        assert_eq!(lp["text_offset"][j].as_u64().unwrap() as usize, offset);
        offset += t.as_str().unwrap().chars().count();
    }
}

#[test]
fn sampled_logprobs_reach_their_own_choice_under_n_and_batched_prompts() {
    let s = TestServer::start(Opts {
        forward: Duration::from_millis(1),
        ..Default::default()
    });
    let (st, v) = s.json(
        "/v1/completions",
        r#"{"prompt": ["a b c", "d e"], "n": 2, "max_tokens": 6, "logprobs": 3,
            "return_tokens_as_token_ids": true, "ignore_eos": true}"#,
    );
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for c in choices {
        let lp = &c["logprobs"];
        assert_eq!(lp["tokens"].as_array().unwrap().len(), 6);
        check_sampled(lp, 3, 0);
        // The tokens are the text's: decoding them gives the choice's text.
        let ids: Vec<u32> = lp["tokens"].as_array().unwrap().iter().map(id_of).collect();
        assert_eq!(c["text"], json!(tokenizer().decode(&ids, true).unwrap()));
    }
    // Prompt 0's two samples are distinct requests; their tokens differ from prompt 1's.
    assert_ne!(
        choices[0]["logprobs"]["tokens"],
        choices[2]["logprobs"]["tokens"]
    );
    // No logprobs asked: null, as the Python server answers.
    let (_, v) = s.json("/v1/completions", r#"{"prompt": "a", "max_tokens": 2}"#);
    assert_eq!(v["choices"][0]["logprobs"], Value::Null);
}

#[test]
fn concurrent_requests_with_different_logprobs_each_get_their_own() {
    let s = TestServer::start(Opts {
        forward: Duration::from_millis(2),
        ..Default::default()
    });
    // Six requests batched together (a 2 ms forward, 20 steps each), asking 0..=4 alternatives or none.
    let asks: Vec<Option<usize>> = vec![Some(0), Some(1), None, Some(4), Some(2), None];
    let bodies: Vec<String> = asks
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let mut b = json!({"prompt": format!("request number {i}"), "max_tokens": 20, "ignore_eos": true,
                               "return_tokens_as_token_ids": true, "stream": i % 2 == 1});
            if let Some(k) = k {
                b["logprobs"] = json!(k);
            }
            b.to_string()
        })
        .collect();
    let outs: Vec<(u16, String)> = std::thread::scope(|sc| {
        let hs: Vec<_> = bodies
            .iter()
            .map(|b| sc.spawn(|| s.post("/v1/completions", b)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, ((st, body), k)) in outs.iter().zip(&asks).enumerate() {
        assert_eq!(*st, 200, "{body}");
        let blocks: Vec<Value> = if i % 2 == 1 {
            sse_events(body)
                .iter()
                .filter(|e| e.as_str() != "[DONE]")
                .map(|e| {
                    serde_json::from_str::<Value>(e).unwrap()["choices"][0]["logprobs"].clone()
                })
                .collect()
        } else {
            vec![serde_json::from_str::<Value>(body).unwrap()["choices"][0]["logprobs"].clone()]
        };
        let Some(k) = k else {
            assert!(blocks.iter().all(Value::is_null), "{body}");
            continue;
        };
        let mut n = 0;
        for b in &blocks {
            check_sampled(b, *k, 0);
            n += b["tokens"].as_array().unwrap().len();
        }
        assert_eq!(n, 20, "request {i}");
    }
}

#[test]
fn streamed_logprobs_concatenate_to_the_non_streamed_ones() {
    let s = TestServer::start(Opts::default());
    let body = json!({"prompt": "Hello there friend", "max_tokens": 12, "logprobs": 2, "ignore_eos": true,
                      "echo": true});
    let (_, whole) = s.json("/v1/completions", &body.to_string());
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, sse) = s.post("/v1/completions", &streamed.to_string());
    let mut cat =
        json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    let mut text = String::new();
    for e in sse_events(&sse).iter().filter(|e| e.as_str() != "[DONE]") {
        let c = &serde_json::from_str::<Value>(e).unwrap()["choices"][0];
        text.push_str(c["text"].as_str().unwrap());
        for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
            let add = c["logprobs"][k].as_array().unwrap().clone();
            cat[k].as_array_mut().unwrap().extend(add);
        }
    }
    let w = &whole["choices"][0];
    assert_eq!(cat, w["logprobs"]);
    assert_eq!(json!(text), w["text"]);
    // Echo: the prompt's tokens lead (the first with no logprob), then the 12 generated ones.
    let n_prompt = encode("Hello there friend").len();
    assert_eq!(
        w["logprobs"]["tokens"].as_array().unwrap().len(),
        n_prompt + 12
    );
    assert_eq!(w["logprobs"]["token_logprobs"][0], Value::Null);
    assert_eq!(w["logprobs"]["top_logprobs"][0], Value::Null);
    assert_eq!(w["logprobs"]["tokens"][0], json!("<bos>"));
}

/// vLLM's `prompt_logprobs` of `prompt` are the mock's for each position (`k` alternatives).
fn check_prompt(plp: &Value, prompt: &[u32], k: usize) {
    let v = vocab();
    let tok = tokenizer();
    let a = plp
        .as_array()
        .unwrap_or_else(|| panic!("prompt_logprobs: {plp}"));
    assert_eq!(a.len(), prompt.len());
    assert_eq!(a[0], Value::Null);
    for (p, pos) in a.iter().enumerate().skip(1) {
        let (lp, rank, top) = MockModel::prompt_logprob(v, prompt[p], p as u32, k);
        let own = &pos[prompt[p].to_string()];
        assert_eq!(own["logprob"].as_f64().unwrap(), lp as f64, "position {p}");
        assert_eq!(own["rank"], json!(rank), "position {p}");
        assert_eq!(
            own["decoded_token"],
            json!(tok.decode(&[prompt[p]], false).unwrap())
        );
        let mut want: Vec<String> = top.iter().map(|(t, _)| t.to_string()).collect();
        want.push(prompt[p].to_string());
        want.sort();
        want.dedup();
        let mut got: Vec<String> = pos.as_object().unwrap().keys().cloned().collect();
        got.sort();
        assert_eq!(got, want, "position {p}");
        for (j, (t, l)) in top.iter().enumerate() {
            if *t as u32 != prompt[p] {
                assert_eq!(pos[t.to_string()]["logprob"].as_f64().unwrap(), *l as f64);
                assert_eq!(pos[t.to_string()]["rank"], json!(j + 1));
            }
        }
    }
}

#[test]
fn prompt_logprobs_follow_their_positions_across_prefill_chunks() {
    // A 16-token step budget: the 70-token prompts are prefilled in chunks, two requests at once.
    let s = TestServer::start(Opts {
        batched_tokens: 16,
        forward: Duration::from_millis(1),
        ..Default::default()
    });
    let prompts: Vec<Vec<u32>> = (0..2)
        .map(|i| (0..70).map(|t| 300 + 7 * t + i).collect())
        .collect();
    let outs: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let s = &s;
                sc.spawn(move || {
                    let b = json!({"prompt": p, "max_tokens": 3, "prompt_logprobs": 1 + i, "n": 2,
                                   "stream": i == 1});
                    s.post("/v1/completions", &b.to_string())
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                let (st, b) = h.join().unwrap();
                assert_eq!(st, 200, "{b}");
                if b.starts_with("data: ") {
                    // The first chunk of each choice carries the prompt logprobs.
                    let firsts: Vec<Value> = sse_events(&b)
                        .iter()
                        .filter(|e| e.as_str() != "[DONE]")
                        .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0].clone())
                        .filter(|c| c.get("prompt_logprobs").is_some())
                        .collect();
                    json!({ "choices": firsts })
                } else {
                    serde_json::from_str(&b).unwrap()
                }
            })
            .collect()
    });
    for (i, v) in outs.iter().enumerate() {
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 2, "{v}");
        for c in choices {
            check_prompt(&c["prompt_logprobs"], &prompts[i], 1 + i);
        }
    }
}

#[test]
fn logprobs_survive_preemption_without_gaps_or_repeats() {
    // 20 blocks of 16 tokens for 4 requests of 80 + 60 tokens (9 blocks each), prefilled 16 tokens
    // a step: requests are preempted mid-prefill and mid-decode and recompute their prompts; each
    // position is still reported exactly once, each sampled token once.
    let s = TestServer::start(Opts {
        num_blocks: 20,
        max_num_seqs: 4,
        max_model_len: 256,
        batched_tokens: 16,
        forward: Duration::from_millis(2),
        ..Default::default()
    });
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| (0..80).map(|t| 400 + 11 * i + t).collect())
        .collect();
    let outs: Vec<(u16, Value)> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let s = &s;
                sc.spawn(move || {
                    let b = json!({"prompt": p, "max_tokens": 60, "ignore_eos": true, "logprobs": 1,
                                   "prompt_logprobs": 2, "return_tokens_as_token_ids": true});
                    s.json("/v1/completions", &b.to_string())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        s.metric("yoco:num_preemptions_total") > 0.0,
        "the pool was meant to run out"
    );
    for (p, (st, v)) in prompts.iter().zip(&outs) {
        assert_eq!(*st, 200, "{v}");
        let c = &v["choices"][0];
        check_prompt(&c["prompt_logprobs"], p, 2);
        assert_eq!(c["logprobs"]["tokens"].as_array().unwrap().len(), 60);
        check_sampled(&c["logprobs"], 1, 0);
    }
}
