//! Tool calling over HTTP against the mock model (which picks an allowed token where a grammar
//! forbids its own): `required` and a named function forced by their grammars, `auto` parsed from
//! a reply pinned to the pythonic form by a regex, `tool_calls` in bodies and in streamed deltas
//! that concatenate to the non-streamed calls, the tools in the tool-aware template, and the 400s
//! naming the field (before this, every request with tools was a 400).

use crate::common;

use common::{sse_events, Opts, TestServer};
use serde_json::{json, Value};
use yoco_server::{ToolConfig, ToolParser};

const TOOL_TEMPLATE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../python/yoco_rs/serve/templates/gemma3n_tools.jinja"
));

fn server() -> TestServer {
    TestServer::start(Opts {
        compact_json: true,
        cfg: Some(|c| {
            c.tools = ToolConfig {
                auto_enabled: true,
                parser: Some(ToolParser::Pythonic),
                template: Some(TOOL_TEMPLATE.to_string()),
            };
        }),
        ..Default::default()
    })
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                             "unit": {"enum": ["c", "f"]}},
                            "required": ["city", "unit"], "additionalProperties": false}}},
           {"type": "function", "function": {"name": "get_time",
             "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                            "required": ["zone"], "additionalProperties": false}}}])
}

fn body(extra: Value) -> String {
    let mut b = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools(),
                       "max_tokens": 120, "temperature": 0.0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

/// `(name, arguments)` of a body's first choice, and its content and finish reason.
fn answer(s: &TestServer, extra: Value) -> (Vec<(String, Value)>, Value, Value) {
    let (st, v) = s.json("/v1/chat/completions", &body(extra));
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    let calls = c["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            assert_eq!(t["type"], "function");
            assert!(t["id"].as_str().unwrap().starts_with("call_"));
            let args = t["function"]["arguments"].as_str().unwrap();
            (
                t["function"]["name"].as_str().unwrap().to_string(),
                serde_json::from_str::<Value>(args).unwrap(),
            )
        })
        .collect();
    (
        calls,
        c["message"]["content"].clone(),
        c["finish_reason"].clone(),
    )
}

/// The same from the stream's deltas: a call's first delta carries id, type and name, later ones
/// argument fragments only; returns the calls, the content, the finish reason and the most
/// deltas any call took.
fn streamed(s: &TestServer, extra: Value) -> (Vec<(String, Value)>, String, Value, usize) {
    let mut b: Value = serde_json::from_str(&body(extra)).unwrap();
    b["stream"] = json!(true);
    let (st, sse) = s.post("/v1/chat/completions", &b.to_string());
    assert_eq!(st, 200, "{sse}");
    let mut calls: Vec<(String, String, usize)> = Vec::new();
    let (mut content, mut reason) = (String::new(), Value::Null);
    for e in sse_events(&sse).iter().filter(|e| e.as_str() != "[DONE]") {
        let c = &serde_json::from_str::<Value>(e).unwrap()["choices"][0];
        content += c["delta"]["content"].as_str().unwrap_or("");
        if !c["finish_reason"].is_null() {
            reason = c["finish_reason"].clone();
        }
        for tc in c["delta"]["tool_calls"].as_array().into_iter().flatten() {
            let i = tc["index"].as_u64().unwrap() as usize;
            let args = tc["function"]["arguments"].as_str().unwrap_or("");
            if i == calls.len() {
                assert!(tc["id"].as_str().unwrap().starts_with("call_"), "{tc}");
                assert_eq!(tc["type"], "function");
                let name = tc["function"]["name"].as_str().unwrap().to_string();
                calls.push((name, args.to_string(), 1));
            } else {
                assert!(
                    tc.get("id").is_none() && tc["function"].get("name").is_none(),
                    "{tc}"
                );
                calls[i].1 += args;
                calls[i].2 += 1;
            }
        }
    }
    let most = calls.iter().map(|c| c.2).max().unwrap_or(0);
    let calls = calls
        .into_iter()
        .map(|(n, a, _)| {
            (
                n,
                serde_json::from_str::<Value>(&a).unwrap_or_else(|e| panic!("{a}: {e}")),
            )
        })
        .collect();
    (calls, content, reason, most)
}

fn valid(name: &str, args: &Value) -> bool {
    match name {
        "get_weather" => {
            args.as_object().is_some_and(|o| o.len() == 2)
                && args["city"]
                    .as_str()
                    .is_some_and(|c| c.chars().count() <= 8)
                && (args["unit"] == "c" || args["unit"] == "f")
        }
        "get_time" => args == &json!({"zone": "utc"}) || args == &json!({"zone": "cet"}),
        _ => false,
    }
}

#[test]
fn required_and_named_tool_choices_are_forced_calls_streamed_as_deltas() {
    let s = server();
    let cases = [
        (
            json!({"tool_choice": "required", "parallel_tool_calls": false}),
            "tool_calls",
        ),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
            "stop",
        ),
    ];
    for (extra, want_reason) in cases {
        let (calls, content, reason) = answer(&s, extra.clone());
        assert_eq!(content, Value::Null, "{extra}");
        assert_eq!(reason, want_reason, "{extra}");
        assert_eq!(calls.len(), 1, "{extra}: {calls:?}");
        assert!(calls.iter().all(|(n, a)| valid(n, a)), "{calls:?}");
        if extra["tool_choice"].is_object() {
            assert_eq!(calls[0].0, "get_time");
        }
        let (scalls, scontent, sreason, most) = streamed(&s, extra.clone());
        assert_eq!(
            (scalls, scontent.as_str(), sreason),
            (calls, "", json!(want_reason))
        );
        assert!(most >= 2, "{extra}: arguments arrived whole");
    }
}

#[test]
fn auto_parses_a_pythonic_reply_and_leaves_other_text_as_content() {
    let s = server();
    let pinned = json!({"tool_choice": "auto", "structured_outputs": {
        "regex": r#"\[get_weather\(city="[A-Z][a-z]{2,6}", unit="[cf]"\), get_time\(zone="utc"\)\]"#}});
    let (calls, content, reason) = answer(&s, pinned.clone());
    assert_eq!((content, reason), (Value::Null, json!("tool_calls")));
    assert_eq!(
        calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
        ["get_weather", "get_time"]
    );
    assert!(calls.iter().all(|(n, a)| valid(n, a)), "{calls:?}");
    let (scalls, scontent, sreason, _) = streamed(&s, pinned);
    assert_eq!(
        (scalls, scontent.as_str(), sreason),
        (calls, "", json!("tool_calls"))
    );
    // Tools without tool_choice mean auto; a reply that is not a call is content.
    let plain = json!({"structured_outputs": {"choice": ["It is sunny."]}});
    let (calls, content, reason) = answer(&s, plain.clone());
    assert_eq!(
        (calls.len(), content, reason),
        (0, json!("It is sunny."), json!("stop"))
    );
    let (calls, content, reason, _) = streamed(&s, plain);
    assert_eq!(
        (calls.len(), content.as_str(), reason),
        (0, "It is sunny.", json!("stop"))
    );
}

#[test]
fn tools_reach_the_tool_aware_template_and_none_gives_plain_content() {
    let s = server();
    let render = |extra: Value| {
        let (st, v) = s.json("/v1/chat/completions/render", &body(extra));
        assert_eq!(st, 200, "{v}");
        let ids: Vec<u32> = serde_json::from_value(v["token_ids"].clone()).unwrap();
        common::tokenizer().decode(&ids, false).unwrap()
    };
    let with_tools = render(json!({"tool_choice": "none"}));
    assert!(
        with_tools.contains(r#""name": "get_weather""#),
        "{with_tools}"
    );
    let without = {
        let (st, v) = s.json(
            "/v1/chat/completions/render",
            &json!({"messages": [{"role": "user", "content": "Weather in Paris?"}]}).to_string(),
        );
        assert_eq!(st, 200);
        let ids: Vec<u32> = serde_json::from_value(v["token_ids"].clone()).unwrap();
        common::tokenizer().decode(&ids, false).unwrap()
    };
    assert!(!without.contains("get_weather"));
    let (st, v) = s.json(
        "/v1/chat/completions",
        &body(json!({"tool_choice": "none", "max_tokens": 4})),
    );
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert!(
        m.get("tool_calls").is_none() && m["content"].is_string(),
        "{m}"
    );
}

#[test]
fn tool_request_errors_are_400s_naming_the_field() {
    let s = server();
    let cases = [
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
            "nope",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"description": "x"}}]}),
            "tools",
            "tools[0]",
        ),
        (
            json!({"tools": null, "tool_choice": "required"}),
            "tool_choice",
            "needs tools",
        ),
        (
            json!({"tool_choice": "sometimes"}),
            "tool_choice",
            "got 'sometimes'",
        ),
        (json!({"tools": "x"}), "tools", "must be a list"),
        (
            json!({"tool_choice": "required", "guided_regex": "a"}),
            "guided_regex",
            "only one",
        ),
        (
            json!({"tools": [{"function": {"name": "a", "parameters": 3}}]}),
            "tools",
            "parameters must be a JSON Schema object",
        ),
    ];
    for (extra, param, needle) in cases {
        s.assert_400("/v1/chat/completions", &body(extra.clone()), param, needle);
    }
    // Without --enable-auto-tool-choice, tools without tool_choice (auto) are refused.
    let plain = TestServer::start(Opts::default());
    let (st, v) = plain.json("/v1/chat/completions", &body(json!({})));
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("--enable-auto-tool-choice"));
}
