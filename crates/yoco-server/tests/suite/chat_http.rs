//! `/v1/chat/completions` and the text endpoints (render, tokenize, detokenize, version) over a
//! real port against the mock executor: the rendered prompt, the texts, the exact chunk sequence of
//! a stream, usage, `n`, the errors naming fields, template budgets, metrics, CORS.

use crate::common;

use common::{reference_tokens, sse_events, tokenizer, Opts, TestServer};
use serde_json::{json, Value};

/// The bundled template's rendering of one user turn (it writes `<bos>` itself).
const HI: &str = "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n";

/// Token ids of `text` as the chat path encodes a rendering: no `<bos>` added.
fn ids(text: &str) -> Vec<u32> {
    tokenizer().encode(text, false).unwrap().get_ids().to_vec()
}

fn decode(ids: &[u32]) -> String {
    tokenizer().decode(ids, true).unwrap()
}

fn user_hi(extra: Value) -> String {
    let mut b = json!({"messages": [{"role": "user", "content": "Hi"}]});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

fn chunks(body: &str) -> Vec<Value> {
    let ev = sse_events(body);
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{body}");
    ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

#[test]
fn the_prompt_is_the_bundled_template_rendered_and_tokenized_without_a_second_bos() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json(
        "/v1/chat/completions/render",
        &user_hi(json!({"max_tokens": 4, "temperature": 0})),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["token_ids"], json!(ids(HI)));
    assert_eq!(v["token_ids"][0], 2, "one <bos>, the template's");
    assert!(v["request_id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["sampling_params"]["max_tokens"], 4);
    assert_eq!(v["sampling_params"]["temperature"], json!(0.0));
    assert_eq!(v["model"], "mock");
    // System turns fold into the first user turn; the bundled template reads a list of text parts
    // itself (vLLM's "openai" content format, detected): each part trimmed, then concatenated.
    let (_, v) = s.json(
        "/v1/chat/completions/render",
        &json!({"messages": [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": [{"type": "text", "text": "a"},
                                                           {"type": "text", "text": "b"}]},
                              {"role": "assistant", "content": " ok "},
                              {"role": "user", "content": "more"}]})
        .to_string(),
    );
    let want = "<bos><start_of_turn>user\nBe brief.\n\nab<end_of_turn>\n<start_of_turn>model\nok<end_of_turn>\n\
                <start_of_turn>user\nmore<end_of_turn>\n<start_of_turn>model\n";
    assert_eq!(v["token_ids"], json!(ids(want)));
}

#[test]
fn chat_text_is_the_mock_models_output_for_the_rendered_prompt() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json(
        "/v1/chat/completions",
        &user_hi(json!({"max_completion_tokens": 6, "max_tokens": 99, "temperature": 0})),
    );
    assert_eq!(st, 200, "{v}");
    let prompt = ids(HI);
    let want = decode(&reference_tokens(&prompt, 6));
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(
        v["choices"],
        json!([{"index": 0, "message": {"role": "assistant", "content": want}, "logprobs": null,
                "finish_reason": "length", "stop_reason": null}])
    );
    let p = prompt.len() as u64;
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": p, "completion_tokens": 6, "total_tokens": p + 6,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
}

#[test]
fn a_stream_is_a_role_chunk_then_one_content_chunk_per_token_then_usage_and_done() {
    let s = TestServer::start(Opts::default());
    let body = user_hi(json!({"max_tokens": 5, "stream": true,
                              "stream_options": {"include_usage": true}}));
    let (st, text) = s.post("/v1/chat/completions", &body);
    assert_eq!(st, 200, "{text}");
    let c = chunks(&text);
    let id = c[0]["id"].clone();
    for x in &c {
        assert_eq!(x["object"], "chat.completion.chunk");
        assert_eq!(x["id"], id);
        assert_eq!(x["model"], "mock");
    }
    assert_eq!(
        c[0]["choices"],
        json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null,
                "finish_reason": null}])
    );
    // 5 tokens: 4 deltas, the last token rides on the finishing chunk.
    let content = &c[1..c.len() - 1];
    assert_eq!(content.len(), 5, "{text}");
    for x in &content[..4] {
        let ch = &x["choices"][0];
        assert_eq!(ch["finish_reason"], Value::Null);
        assert_eq!(ch["stop_reason"], Value::Null);
        assert!(ch["delta"].as_object().unwrap().keys().eq(["content"]));
    }
    let last = &content[4]["choices"][0];
    assert_eq!(last["finish_reason"], "length");
    let joined: String = content
        .iter()
        .map(|x| x["choices"][0]["delta"]["content"].as_str().unwrap_or(""))
        .collect();
    let prompt = ids(HI);
    assert_eq!(joined, decode(&reference_tokens(&prompt, 5)));
    let u = c.last().unwrap();
    assert_eq!(u["choices"], json!([]));
    let p = prompt.len() as u64;
    assert_eq!(
        u["usage"],
        json!({"prompt_tokens": p, "completion_tokens": 5, "total_tokens": p + 5,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    assert!(content.iter().all(|x| x.get("usage").is_none()));
}

#[test]
fn continuous_usage_stats_put_the_running_usage_on_every_chunk() {
    let s = TestServer::start(Opts::default());
    let body = user_hi(json!({"max_tokens": 4, "stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true}}));
    let c = chunks(&s.post("/v1/chat/completions", &body).1);
    let counts: Vec<u64> = c
        .iter()
        .map(|x| x["usage"]["completion_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(
        counts,
        vec![0, 1, 2, 3, 4, 4],
        "role, 4 tokens, the final usage"
    );
}

#[test]
fn n_choices_each_open_with_a_role_chunk_and_usage_counts_every_token() {
    let s = TestServer::start(Opts::default());
    let body = user_hi(json!({"max_tokens": 3, "n": 3, "stream": true, "seed": 7,
                              "stream_options": {"include_usage": true}}));
    let c = chunks(&s.post("/v1/chat/completions", &body).1);
    for idx in 0..3 {
        let mine: Vec<&Value> = c
            .iter()
            .filter(|x| x["choices"].get(0).is_some_and(|ch| ch["index"] == idx))
            .collect();
        assert_eq!(mine.len(), 4, "role + 3 tokens for choice {idx}");
        assert_eq!(mine[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(mine[3]["choices"][0]["finish_reason"], "length");
    }
    assert_eq!(c.last().unwrap()["usage"]["completion_tokens"], 9);
    let (_, v) = s.json(
        "/v1/chat/completions",
        &user_hi(json!({"max_tokens": 3, "n": 2})),
    );
    let idx: Vec<u64> = v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["index"].as_u64().unwrap())
        .collect();
    assert_eq!(idx, vec![0, 1]);
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["usage"]["prompt_tokens"], ids(HI).len() as u64);
}

#[test]
fn a_stop_string_ends_the_text_before_it_and_is_the_stop_reason() {
    let s = TestServer::start(Opts::default());
    let full = decode(&reference_tokens(&ids(HI), 12));
    let chars: Vec<char> = full.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
    let cut = full.find(&stop).unwrap();
    let body = user_hi(json!({"max_tokens": 12, "stop": [stop.clone()]}));
    let (_, v) = s.json("/v1/chat/completions", &body);
    let ch = &v["choices"][0];
    assert_eq!(ch["message"]["content"], json!(&full[..cut]), "{v}");
    assert_eq!(ch["finish_reason"], "stop");
    assert_eq!(ch["stop_reason"], json!(stop));
    let c = chunks(
        &s.post(
            "/v1/chat/completions",
            &user_hi(json!({"max_tokens": 12,
        "stop": [stop.clone()], "stream": true})),
        )
        .1,
    );
    let last = &c.last().unwrap()["choices"][0];
    assert_eq!(last["finish_reason"], "stop");
    assert_eq!(last["stop_reason"], json!(stop));
    let joined: String = c
        .iter()
        .map(|x| x["choices"][0]["delta"]["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(joined, &full[..cut]);
}

#[test]
fn continue_final_message_leaves_the_last_turn_open() {
    let s = TestServer::start(Opts::default());
    let body = json!({"messages": [{"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "Once upon"}],
                      "add_generation_prompt": false, "continue_final_message": true});
    let (st, v) = s.json("/v1/chat/completions/render", &body.to_string());
    assert_eq!(st, 200, "{v}");
    let want = "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nOnce upon";
    assert_eq!(v["token_ids"], json!(ids(want)));
}

#[test]
fn bad_chat_requests_are_400s_naming_the_field() {
    let s = TestServer::start(Opts::default());
    let hi = json!([{"role": "user", "content": "Hi"}]);
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({}), 400, "messages"),
        (json!({"messages": []}), 400, "messages"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            400,
            "messages",
        ),
        (
            json!({"messages": [{"role": 7, "content": "x"}]}),
            400,
            "messages.0.role",
        ),
        (
            json!({"messages": [{"content": "x"}]}),
            400,
            "messages.0.role",
        ),
        (json!({"messages": ["hello"]}), 400, "messages"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            400,
            "messages",
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            400,
            "messages",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),
            400,
            "messages",
        ),
        // Tools without tool_choice mean auto, which needs --enable-auto-tool-choice (the
        // Python server's 400; tools themselves are served, tests/tools_http.rs).
        (
            json!({"messages": hi, "tools": [{"type": "function", "function": {"name": "f"}}]}),
            400,
            "tool_choice",
        ),
        (
            json!({"messages": hi, "tool_choice": "required"}),
            400,
            "tool_choice",
        ),
        (
            json!({"messages": hi, "logit_bias": {"5": 1}}),
            400,
            "logit_bias",
        ),
        (json!({"messages": hi, "echo": true}), 400, "echo"),
        (json!({"messages": hi, "n": 0}), 400, "n"),
        (json!({"messages": hi, "n": 1000}), 400, "n"),
        (json!({"messages": hi, "best_of": 3}), 400, "best_of"),
        (
            json!({"messages": hi, "chat_template": "{{ 'x' }}"}),
            400,
            "chat_template",
        ),
        (
            json!({"messages": hi, "chat_template_kwargs": {"chat_template": "x"}}),
            400,
            "chat_template_kwargs",
        ),
        (
            json!({"messages": hi, "continue_final_message": true}),
            400,
            "continue_final_message",
        ),
        (
            json!({"messages": hi, "max_completion_tokens": 100000}),
            400,
            "max_tokens",
        ),
        (json!({"messages": hi, "max_tokens": 0}), 400, "max_tokens"),
        (
            json!({"messages": hi, "stream_options": {"include_usage": true}}),
            400,
            "stream_options",
        ),
        (
            json!({"messages": hi, "truncate_prompt_tokens": 0}),
            400,
            "truncate_prompt_tokens",
        ),
        (
            json!({"messages": hi, "temperature": -1}),
            400,
            "temperature",
        ),
        (json!({"messages": hi, "model": "gpt-4"}), 404, "model"),
    ];
    for (body, status, param) in cases {
        let (st, v) = s.json("/v1/chat/completions", &body.to_string());
        assert_eq!(st, status, "{body}: {v}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        assert_eq!(v["error"]["code"], status);
    }
    let (_, v) = s.json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
            .to_string(),
    );
    assert_eq!(
        v["error"]["message"],
        "chat template error: Conversation roles must alternate user/assistant/user/assistant/..."
    );
    // Still serving.
    assert_eq!(
        s.json("/v1/chat/completions", &user_hi(json!({"max_tokens": 1})))
            .0,
        200
    );
}

#[test]
fn a_trusted_request_template_is_used_and_bombs_are_400s_within_the_budget() {
    let s = TestServer::start(Opts {
        trust_templates: true,
        ..Opts::default()
    });
    let (st, v) = s.json(
        "/v1/chat/completions/render",
        &user_hi(
            json!({"chat_template": "X{{ messages[0].content }}Y{{ greeting }}",
                        "chat_template_kwargs": {"greeting": "!", "bos_token": "ignored"}}),
        ),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["token_ids"], json!(ids("XHiY!")));
    let bombs = [
        "{% for a in range(100000) %}{% for b in range(100000) %}{{ b }}{% endfor %}{% endfor %}",
        "{{ 'x' * 1000000000 }}",
        "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "{{ 7 ** 99999999 }}",
        "{% for x in",
    ];
    for b in bombs {
        let t = std::time::Instant::now();
        let (st, v) = s.json(
            "/v1/chat/completions",
            &user_hi(json!({"chat_template": b})),
        );
        assert_eq!(st, 400, "{b}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("chat template"),
            "{v}"
        );
        assert!(t.elapsed().as_secs_f64() < 3.0, "{b}: {:?}", t.elapsed());
    }
    assert_eq!(
        s.json("/v1/chat/completions", &user_hi(json!({"max_tokens": 1})))
            .0,
        200
    );
}

#[test]
fn tokenize_and_detokenize_answer_in_vllms_shape() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json(
        "/tokenize",
        r#"{"prompt": "Hello world", "return_token_strs": true}"#,
    );
    assert_eq!(st, 200, "{v}");
    let mut want = vec![2u32];
    want.extend(ids("Hello world"));
    assert_eq!(v["tokens"], json!(want));
    assert_eq!(v["count"], want.len());
    assert_eq!(v["max_model_len"], 512);
    let strs: Vec<Option<String>> = want.iter().map(|&i| tokenizer().id_to_token(i)).collect();
    assert_eq!(v["token_strs"], json!(strs));
    let (_, v) = s.json(
        "/tokenize",
        r#"{"prompt": "Hello world", "add_special_tokens": false}"#,
    );
    assert_eq!(v["tokens"], json!(ids("Hello world")));
    // A conversation tokenizes as chat renders it.
    let (_, v) = s.json("/tokenize", &user_hi(json!({})));
    assert_eq!(v["tokens"], json!(ids(HI)));
    let (_, v) = s.json("/detokenize", &json!({"tokens": ids(HI)}).to_string());
    assert_eq!(v["prompt"], HI);
    for (path, body, param) in [
        ("/tokenize", r#"{"model": "mock"}"#, "prompt"),
        ("/tokenize", r#"{"messages": []}"#, "messages"),
        ("/detokenize", r#"{"tokens": [1, 99999999]}"#, "tokens"),
        ("/detokenize", r#"{"tokens": [-1]}"#, "tokens"),
    ] {
        let (st, v) = s.json(path, body);
        assert_eq!(
            (st, v["error"]["param"].as_str()),
            (400, Some(param)),
            "{body}: {v}"
        );
    }
}

#[test]
fn completions_render_lists_one_generate_request_per_prompt() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.json(
        "/v1/completions/render",
        r#"{"prompt": ["The sea", "A hill"], "max_tokens": 3, "seed": 4, "stop": ["x", ""]}"#,
    );
    assert_eq!(st, 200, "{v}");
    let a = v.as_array().unwrap();
    assert_eq!(a.len(), 2);
    let mut sea = vec![2u32];
    sea.extend(ids("The sea"));
    assert_eq!(a[0]["token_ids"], json!(sea));
    let mut hill = vec![2u32];
    hill.extend(ids("A hill"));
    assert_eq!(a[1]["token_ids"], json!(hill));
    let rid = a[0]["request_id"].as_str().unwrap();
    assert!(rid.starts_with("cmpl-") && rid.ends_with("-0"), "{rid}");
    let sp = &a[0]["sampling_params"];
    assert_eq!(sp["max_tokens"], 3);
    assert_eq!(sp["seed"], 4);
    assert_eq!(sp["stop"], json!(["x"]));
    assert_eq!(sp["n"], 1);
    assert_eq!(a[0]["features"], Value::Null);
    assert_eq!(a[0]["priority"], 0);
    // Nothing ran.
    assert_eq!(s.metric("yoco:prompt_tokens_total"), 0.0);
}

#[test]
fn version_and_the_model_card_are_served() {
    let s = TestServer::start(Opts::default());
    let (st, v) = s.get("/version");
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    let (st, v) = s.get("/v1/models/mock");
    assert_eq!(st, 200);
    let v: Value = serde_json::from_str(&v).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["max_model_len"].as_u64()),
        (Some("mock"), Some(512))
    );
    assert_eq!(s.get("/v1/models/other").0, 404);
}

fn series(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no series {prefix} in\n{metrics}"))
}

#[test]
fn metrics_count_what_one_chat_request_did_under_vllms_names() {
    let s = TestServer::start(Opts {
        cfg: Some(|c| {
            c.compat_metric_names = true;
            c.cache_config_info = vec![("block_size".into(), "16".into())];
        }),
        ..Opts::default()
    });
    let (st, _) = s.json(
        "/v1/chat/completions",
        &user_hi(json!({"max_tokens": 5, "n": 2})),
    );
    assert_eq!(st, 200);
    let (_, m) = s.get("/metrics");
    let l = "{model_name=\"mock\",engine=\"0\"}";
    for (name, want) in [
        ("yoco:time_to_first_token_seconds_count", 2.0),
        ("yoco:inter_token_latency_seconds_count", 8.0),
        ("yoco:time_per_output_token_seconds_count", 8.0),
        ("yoco:e2e_request_latency_seconds_count", 2.0),
        ("yoco:request_queue_time_seconds_count", 2.0),
        ("yoco:request_prefill_time_seconds_count", 2.0),
        ("yoco:request_decode_time_seconds_count", 2.0),
        ("yoco:request_generation_tokens_sum", 10.0),
        ("yoco:request_prompt_tokens_sum", 2.0 * ids(HI).len() as f64),
        ("yoco:request_params_n_sum", 2.0),
        ("yoco:request_params_max_tokens_sum", 5.0),
        (
            "yoco:gpu_prefix_cache_queries_total",
            series(&m, "yoco:prefix_cache_queries_total"),
        ),
    ] {
        assert_eq!(series(&m, &format!("{name}{l}")), want, "{name}");
    }
    assert!(series(&m, "yoco:iteration_tokens_total_count") >= 5.0);
    assert!(series(&m, "yoco:scheduled_tokens_total") >= 2.0 * ids(HI).len() as f64);
    assert!(series(&m, "yoco:kv_blocks_total") > 0.0);
    assert_eq!(series(&m, "yoco:kv_blocks_used"), 0.0, "nothing leaked");
    assert!(m.contains(
        "yoco:time_to_first_token_seconds_bucket{model_name=\"mock\",engine=\"0\",le=\"0.001\"}"
    ));
    assert!(m.contains(
        "yoco:request_prompt_tokens_bucket{model_name=\"mock\",engine=\"0\",le=\"1.0\"}"
    ));
    assert!(m.contains(
        "yoco:cache_config_info{model_name=\"mock\",engine=\"0\",block_size=\"16\"} 1.0"
    ));
    assert_eq!(
        series(
            &m,
            "http_requests_total{method=\"POST\",status=\"2xx\",handler=\"/v1/chat/completions\"}"
        ),
        1.0
    );
    s.get("/nope");
    let (_, m) = s.get("/metrics");
    assert_eq!(
        series(
            &m,
            "http_requests_total{method=\"GET\",status=\"4xx\",handler=\"other\"}"
        ),
        1.0
    );
}

#[test]
fn cors_answers_only_allowed_origins_and_request_ids_are_echoed() {
    let s = TestServer::start(Opts {
        cfg: Some(|c| c.allowed_origins = vec!["http://ui.local".into()]),
        ..Opts::default()
    });
    let send = |method: &str, origin: &str| {
        let req = hyper::Request::builder()
            .method(method)
            .uri(s.url("/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type")
            .header("x-request-id", "abc123")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        s.rt.block_on(async { s.client.request(req).await.unwrap() })
    };
    let ok = send("OPTIONS", "http://ui.local");
    assert_eq!(ok.status(), 200);
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "http://ui.local"
    );
    assert_eq!(ok.headers()["x-request-id"], "abc123");
    let bad = send("OPTIONS", "http://evil.example");
    assert_eq!(bad.status(), 400);
    assert!(bad.headers().get("access-control-allow-origin").is_none());
    let post = send("POST", "http://ui.local");
    assert_eq!(
        post.headers()["access-control-allow-origin"],
        "http://ui.local"
    );
    let post = send("POST", "http://evil.example");
    assert!(post.headers().get("access-control-allow-origin").is_none());
    // Off by default.
    let plain = TestServer::start(Opts::default());
    let (st, _) = plain.post("/v1/chat/completions", &user_hi(json!({"max_tokens": 1})));
    assert_eq!(st, 200);
}

#[test]
fn the_vllm_prefix_names_vllms_series_and_leaves_yocos_own() {
    let s = TestServer::start(Opts {
        cfg: Some(|c| c.metrics_prefix = "vllm".into()),
        ..Opts::default()
    });
    assert_eq!(
        s.json("/v1/chat/completions", &user_hi(json!({"max_tokens": 2})))
            .0,
        200
    );
    let (_, m) = s.get("/metrics");
    assert_eq!(series(&m, "vllm:time_to_first_token_seconds_count"), 1.0);
    assert_eq!(series(&m, "vllm:request_params_n_count"), 1.0);
    assert!(series(&m, "yoco:scheduled_tokens_total") > 0.0);
    assert!(!m.contains("yoco:time_to_first_token"));
}
