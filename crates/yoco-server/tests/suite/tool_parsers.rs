//! The tool-call parsers and the streamed deltas, alone: exact calls for well-formed replies (the
//! Python server's `parse_tool_calls` answers, arguments as `json.dumps` writes them), other text
//! left as content, seeded garbage and every truncation never panicking, and the streamed deltas of
//! a reply split at random points concatenating to the non-streamed calls.

use serde_json::{json, Value};
use yoco_server::pylit::parse_call_list;
use yoco_server::tool_parse::parse_reply;
use yoco_server::tool_stream::{CallDelta, ToolCallStream};
use yoco_server::tools::{plan_tools, ToolConfig, ToolMode, ToolParser, ToolPlan};

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "w",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
           {"type": "function", "function": {"name": "get_time"}}])
}

fn plan(choice: Value, parser: ToolParser) -> ToolPlan {
    let cfg = ToolConfig {
        auto_enabled: true,
        parser: Some(parser),
        template: None,
    };
    plan_tools(Some(&tools()), Some(&choice), None, &cfg).unwrap()
}

fn calls_of(text: &str, p: &ToolPlan) -> (Option<String>, Vec<(String, String)>) {
    let (content, calls) = parse_reply(text, p);
    (
        content,
        calls.into_iter().map(|c| (c.name, c.arguments)).collect(),
    )
}

fn pair(name: &str, args: &str) -> (String, String) {
    (name.to_string(), args.to_string())
}

#[test]
fn pythonic_calls_parse_to_json_dumps_arguments() {
    let p = plan(json!("auto"), ToolParser::Pythonic);
    let (content, calls) = calls_of(
        " [get_weather(city=\"Oslo\", n=-3, x=1.5, big=1e16, t=True, none=None, l=[1, (2, 3)], \
         d={'k': 'v', 1: 2}, s='it\\'s \\u00e9' \"x\"), get_time()]\n",
        &p,
    );
    assert_eq!(content, None);
    assert_eq!(
        calls,
        vec![
            pair(
                "get_weather",
                r#"{"city": "Oslo", "n": -3, "x": 1.5, "big": 1e+16, "t": true, "none": null, "l": [1, [2, 3]], "d": {"k": "v", "1": 2}, "s": "it's éx"}"#
            ),
            pair("get_time", "{}"),
        ]
    );
    // A repeated keyword keeps its first place and its last value, as the Python dict does.
    assert_eq!(
        calls_of("[get_time(a=1, b=2, a=3)]", &p),
        (None, vec![pair("get_time", r#"{"a": 3, "b": 2}"#)])
    );
}

#[test]
fn text_that_is_not_a_pythonic_call_list_is_content() {
    let p = plan(json!("auto"), ToolParser::Pythonic);
    for text in [
        "hello",
        "[unknown_fn(a=1)]",
        "[get_time(zone=utc)]",
        "[get_time('x')]",
        "[]",
        // Python's json.dumps fails on these (a 500 there); here they are content.
        "[get_time(a={1, 2})]",
        "[get_time(a=b'x')]",
        "[get_time(a=1j)]",
        "[get_time(a=007)]",
        "[get_time(if=1)]",
        "[get_time(a=1)] trailing",
        "[get_time(a=\"unterminated)]",
        "[get_time(a=[[[[",
    ] {
        assert_eq!(
            calls_of(text, &p),
            (Some(text.to_string()), vec![]),
            "{text:?}"
        );
    }
}

#[test]
fn json_blocks_are_calls_and_the_rest_is_content() {
    let p = plan(json!("auto"), ToolParser::Json);
    let text = "Sure. <tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"cet\", \"n\": 1.0}}\n</tool_call> \
                <tool_call>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}</tool_call>";
    assert_eq!(
        calls_of(text, &p),
        (
            Some("Sure.".into()),
            vec![
                pair("get_time", r#"{"zone": "cet", "n": 1.0}"#),
                pair("get_weather", r#"{"city": "Rome"}"#)
            ]
        )
    );
    for text in [
        "no calls",
        "<tool_call>{\"name\": \"nope\"}</tool_call>",
        "<tool_call>not json</tool_call>",
    ] {
        assert_eq!(calls_of(text, &p), (Some(text.to_string()), vec![]));
    }
}

#[test]
fn forced_replies_are_calls_and_finish_reasons_follow_the_mode() {
    let named = plan(
        json!({"type": "function", "function": {"name": "get_time"}}),
        ToolParser::Pythonic,
    );
    assert_eq!(
        calls_of("{\"zone\":\"utc\"}", &named),
        (None, vec![pair("get_time", r#"{"zone": "utc"}"#)])
    );
    assert_eq!(
        calls_of("{\"zone\":", &named),
        (Some("{\"zone\":".into()), vec![])
    );
    let required = plan(json!("required"), ToolParser::Pythonic);
    assert_eq!(
        calls_of(
            r#"[{"name":"get_time","parameters":{"zone":"utc"}},{"name":"get_weather","parameters":{}}]"#,
            &required
        ),
        (
            None,
            vec![
                pair("get_time", r#"{"zone": "utc"}"#),
                pair("get_weather", "{}")
            ]
        )
    );
    use yoco_server::tools::finish_reason;
    assert_eq!(finish_reason("stop", &required, true), "tool_calls");
    assert_eq!(finish_reason("length", &required, true), "length");
    assert_eq!(finish_reason("stop", &named, true), "stop");
    assert_eq!(finish_reason("stop", &required, false), "stop");
}

#[test]
fn plans_mirror_the_python_servers_validation() {
    let off = ToolConfig::default();
    let err = |tools: Value, choice: Value| {
        plan_tools(Some(&tools), Some(&choice), None, &off)
            .unwrap_err()
            .message
    };
    assert_eq!(
        err(tools(), json!("auto")),
        "\"auto\" tool choice requires the server to run with --enable-auto-tool-choice and --tool-call-parser"
    );
    assert_eq!(
        err(json!([]), json!("required")),
        "tool_choice needs tools: give at least one tool or omit tool_choice"
    );
    assert_eq!(
        err(tools(), json!({"type": "function", "function": {"name": "nope"}})),
        "tool_choice names function 'nope', which is not among the tools ['get_weather', 'get_time']"
    );
    assert_eq!(
        err(
            json!([{"type": "function", "function": {"description": "x"}}]),
            json!("none")
        ),
        "tools[0] must be {'type': 'function', 'function': {'name': ..., 'parameters': {...}}}"
    );
    assert_eq!(
        err(
            json!([{"function": {"name": "a"}}, {"function": {"name": "a"}}]),
            json!("none")
        ),
        "tools have duplicate names: ['a', 'a']"
    );
    assert_eq!(
        err(tools(), json!("sometimes")),
        "tool_choice must be 'none', 'auto', 'required' or a named function, got 'sometimes'"
    );
    // Tools without tool_choice mean auto (never silently ignored); none needs no flags.
    assert!(plan_tools(Some(&tools()), None, None, &off).is_err());
    let none = plan_tools(Some(&tools()), Some(&json!("none")), None, &off).unwrap();
    assert_eq!(none.mode, ToolMode::None);
    assert_eq!(none.tools.len(), 2);
}

/// A small deterministic generator (the tests' seeds).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn seeded_garbage_and_every_truncation_never_panic() {
    let alphabet: Vec<char> = "[](){}'\"\\=,.:-+0123456789eEjxuU_ abc get_time<>/tool_call\n\té€😀"
        .chars()
        .collect();
    let plans = [
        plan(json!("auto"), ToolParser::Pythonic),
        plan(json!("auto"), ToolParser::Json),
        plan(json!("required"), ToolParser::Pythonic),
        plan(
            json!({"type": "function", "function": {"name": "get_time"}}),
            ToolParser::Pythonic,
        ),
    ];
    let mut r = Lcg(7);
    let mut texts: Vec<String> = (0..400)
        .map(|_| {
            let n = (r.next() % 60) as usize;
            let mut t = String::from(if r.next() % 2 == 0 { "[get_time(" } else { "" });
            t.extend((0..n).map(|_| alphabet[(r.next() as usize) % alphabet.len()]));
            t
        })
        .collect();
    let good = "[get_weather(city='Oslo', l=[1, {'a': (2,)}]), get_time()]";
    texts.extend(good.char_indices().map(|(i, _)| good[..i].to_string()));
    texts.push("[".repeat(10_000) + &"]".repeat(10_000));
    texts.push(format!(
        "[get_time(a={}1{})]",
        "[".repeat(5000),
        "]".repeat(5000)
    ));
    for t in &texts {
        assert!(parse_call_list(t, &["get_time", "get_weather"]).is_none() || t.starts_with('['));
        for p in &plans {
            let _ = parse_reply(t, p);
            let mut st = ToolCallStream::new(p);
            for (i, ch) in t.char_indices() {
                let _ = st.feed(&t[i..i + ch.len_utf8()]);
            }
            let _ = st.end();
        }
    }
}

/// The calls a stream sent: `(name, arguments)` per index, checking each call's first delta
/// carries its id and name and later ones only fragments.
fn streamed(p: &ToolPlan, text: &str, seed: u64) -> (String, Vec<(String, String)>, bool) {
    let mut st = ToolCallStream::new(p);
    let mut r = Lcg(seed);
    let mut deltas: Vec<CallDelta> = Vec::new();
    let mut content = String::new();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut at = 0;
    while at < chars.len() {
        let step = 1 + (r.next() % 4) as usize;
        let end = chars.get(at + step).map_or(text.len(), |c| c.0);
        let (c, d) = st.feed(&text[chars[at].0..end]);
        content += &c;
        deltas.extend(d);
        at += step;
    }
    let (c, d) = st.end();
    content += &c;
    deltas.extend(d);
    let mut calls: Vec<(String, String)> = Vec::new();
    for d in deltas {
        match d.header {
            Some((id, name)) => {
                assert_eq!(d.index, calls.len());
                assert!(id.starts_with("call_") && id.len() == 29, "{id}");
                calls.push((name, d.arguments));
            }
            None => calls[d.index].1 += &d.arguments,
        }
    }
    (content, calls, st.called())
}

#[test]
fn streamed_deltas_concatenate_to_the_non_streamed_calls() {
    let cases = [
        (
            plan(json!("required"), ToolParser::Pythonic),
            r#"[{"name":"get_weather","parameters":{"city":"Oslo, \"N\" {x}"}},{"name":"get_time","parameters":{}}]"#,
        ),
        (
            plan(
                json!({"type": "function", "function": {"name": "get_time"}}),
                ToolParser::Pythonic,
            ),
            r#"{"zone":"utc","n":[1,2]}"#,
        ),
        (
            plan(json!("auto"), ToolParser::Pythonic),
            "[get_weather(city=\"Par,is\", unit='c'), get_time(zone=\"utc\")]",
        ),
        (
            plan(json!("auto"), ToolParser::Json),
            "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"cet\"}}</tool_call>",
        ),
    ];
    for (p, text) in &cases {
        let (_, whole) = parse_reply(text, p);
        for seed in 0..20 {
            let (content, calls, called) = streamed(p, text, seed);
            assert_eq!(content, "", "{text}");
            assert!(called);
            assert_eq!(calls.len(), whole.len(), "{text}");
            for ((name, args), w) in calls.iter().zip(&whole) {
                assert_eq!(name, &w.name);
                let a: Value = serde_json::from_str(args).unwrap_or_else(|e| panic!("{args}: {e}"));
                let b: Value = serde_json::from_str(&w.arguments).unwrap();
                assert_eq!(a, b, "{text} seed {seed}");
            }
        }
    }
    // Text that is not a call streams as content, whole.
    let p = plan(json!("auto"), ToolParser::Pythonic);
    for text in ["It is sunny.", "[not a call"] {
        let (content, calls, called) = streamed(&p, text, 3);
        assert_eq!((content.as_str(), calls.len(), called), (text, 0, false));
    }
    let p = plan(json!("auto"), ToolParser::Json);
    let (content, calls, _) = streamed(&p, "a <tool_ca b", 1);
    assert_eq!((content.as_str(), calls.len()), ("a <tool_ca b", 0));
}
