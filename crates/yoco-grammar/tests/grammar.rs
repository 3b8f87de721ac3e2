//! yoco-grammar end to end on the bundled tokenizer: masks allow exactly what the grammar can continue
//! with, EOS only where it accepts, compiled grammars are cached by canonical text, bad grammars and
//! hostile ones are errors within the budget. Token ids come from the tokenizer, never hard-coded.

use std::time::Instant;

use yoco_grammar::{
    CompileLimits, GrammarCompiler, GrammarError, GrammarKind, GrammarSpec, MatcherTable,
};

const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../python/yoco_rs/default_model/tokenizer.json"
);

fn tokenizer() -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(TOKENIZER).unwrap()
}

fn eos_ids(t: &tokenizers::Tokenizer) -> Vec<u32> {
    ["<eos>", "<end_of_turn>"]
        .iter()
        .filter_map(|s| t.token_to_id(s))
        .collect()
}

/// A compiler whose masks are wider than the tokenizer (padding rows, as models have).
fn setup(
    extra_vocab: usize,
    limits: CompileLimits,
) -> (GrammarCompiler, tokenizers::Tokenizer, usize) {
    let t = tokenizer();
    let n = t.get_vocab_size(true);
    let bytes = std::fs::read(TOKENIZER).unwrap();
    let c = GrammarCompiler::from_tokenizer_json(&bytes, n + extra_vocab, &eos_ids(&t), limits)
        .unwrap();
    (c, t, n)
}

fn allowed(mask: &[i32], tok: u32) -> bool {
    (mask[(tok / 32) as usize] >> (tok % 32)) & 1 != 0
}

fn allowed_ids(mask: &[i32], vocab: usize) -> Vec<u32> {
    (0..vocab as u32).filter(|&t| allowed(mask, t)).collect()
}

/// Drive one sequence greedily through the grammar, always taking the lowest allowed non-EOS id, until
/// only EOS is allowed; returns the decoded text.
fn walk(
    table: &MatcherTable,
    id: u64,
    tok: &tokenizers::Tokenizer,
    eos: &[u32],
    vocab: usize,
) -> String {
    let mut out = vec![];
    for _ in 0..200 {
        let m = table.masks(&[id]);
        assert_eq!(m.rows, vec![0]);
        let ids = allowed_ids(&m.bitmask, vocab);
        let next = ids.iter().copied().find(|t| !eos.contains(t));
        match next {
            None => {
                assert!(
                    eos.iter().all(|&e| allowed(&m.bitmask, e)),
                    "a finished grammar allows every EOS id"
                );
                return tok.decode(&out, false).unwrap();
            }
            Some(t) => {
                assert!(table.advance(&[id], &[t]).is_empty());
                out.push(t);
            }
        }
    }
    panic!("grammar did not finish")
}

#[test]
fn regex_walk_spells_the_only_string_and_eos_comes_only_at_the_end() {
    let (c, tok, _) = setup(0, CompileLimits::default());
    let eos = c.eos_ids().to_vec();
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::Regex, "hello world").unwrap())
        .unwrap();
    let mut table = MatcherTable::new(c.vocab_size(), &eos);
    table.add(7, &g).unwrap();
    let first = table.masks(&[7]);
    assert!(
        eos.iter().all(|&e| !allowed(&first.bitmask, e)),
        "EOS before the grammar accepts"
    );
    assert_eq!(walk(&table, 7, &tok, &eos, c.vocab_size()), "hello world");
    assert!(table.is_accepting(7).unwrap());
}

#[test]
fn choice_masks_allow_only_prefixes_of_the_choices() {
    let (c, tok, n) = setup(0, CompileLimits::default());
    let eos = c.eos_ids().to_vec();
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::Choice, r#"["yes", "no"]"#).unwrap())
        .unwrap();
    let mut table = MatcherTable::new(c.vocab_size(), &eos);
    table.add(1, &g).unwrap();
    let m = table.masks(&[1]);
    let ids = allowed_ids(&m.bitmask, n);
    assert!(!ids.is_empty());
    for t in ids {
        let s = tok.decode(&[t], false).unwrap();
        assert!(
            "yes".starts_with(&s) || "no".starts_with(&s),
            "token {t} ({s:?}) is not a prefix of a choice"
        );
    }
}

#[test]
fn json_schema_walk_produces_a_document_the_schema_accepts() {
    let (c, tok, _) = setup(0, CompileLimits::default());
    let eos = c.eos_ids().to_vec();
    let schema = r#"{"type":"object","properties":{"a":{"type":"integer","minimum":3,"maximum":3},"b":{"const":"x"}},"required":["a","b"],"additionalProperties":false,"x-guidance":{"whitespace_flexible":false}}"#;
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::JsonSchema, schema).unwrap())
        .unwrap();
    let mut table = MatcherTable::new(c.vocab_size(), &eos);
    table.add(1, &g).unwrap();
    let text = walk(&table, 1, &tok, &eos, c.vocab_size());
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v, serde_json::json!({"a": 3, "b": "x"}));
}

#[test]
fn padding_ids_beyond_the_tokenizer_are_never_allowed() {
    let (c, _tok, n) = setup(100, CompileLimits::default());
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::JsonObject, "").unwrap())
        .unwrap();
    let mut table = MatcherTable::new(c.vocab_size(), c.eos_ids());
    table.add(1, &g).unwrap();
    let m = table.masks(&[1]);
    assert_eq!(m.words, (n + 100).div_ceil(32));
    assert!((n as u32..(n + 100) as u32).all(|t| !allowed(&m.bitmask, t)));
}

#[test]
fn background_masks_equal_inline_masks_and_skip_unconstrained_rows() {
    let (c, tok, _) = setup(0, CompileLimits::default());
    let g1 = c
        .compile(&GrammarSpec::parse(GrammarKind::Regex, "[a-c]+x").unwrap())
        .unwrap();
    let g2 = c
        .compile(&GrammarSpec::parse(GrammarKind::JsonObject, "").unwrap())
        .unwrap();
    let mut table = MatcherTable::new(c.vocab_size(), c.eos_ids());
    table.add(10, &g1).unwrap();
    table.add(30, &g2).unwrap();
    let a = tok.encode("ab", false).unwrap().get_ids().to_vec();
    for &t in &a {
        assert!(table.advance(&[10, 20], &[t, 5]).is_empty());
    }
    let ids = [20u64, 10, 99, 30];
    let inline = table.masks(&ids);
    let bg = table.start_masks(&ids, &[], &[]).wait();
    assert_eq!(inline.rows, vec![1, 3]);
    assert_eq!(bg.rows, inline.rows);
    assert_eq!(bg.bitmask, inline.bitmask);
}

#[test]
fn n_matchers_of_one_grammar_are_independent() {
    let (c, tok, _) = setup(0, CompileLimits::default());
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::Choice, r#"["alpha", "beta"]"#).unwrap())
        .unwrap();
    let mut table = MatcherTable::new(c.vocab_size(), c.eos_ids());
    table.add(1, &g).unwrap();
    table.add(2, &g).unwrap();
    let before = table.masks(&[2]).bitmask;
    let t = tok.encode("alpha", false).unwrap().get_ids().to_vec();
    for &x in &t {
        assert!(table.advance(&[1], &[x]).is_empty());
    }
    assert!(table.is_accepting(1).unwrap());
    assert!(!table.is_accepting(2).unwrap());
    assert_eq!(table.masks(&[2]).bitmask, before);
}

#[test]
fn a_rejected_token_stops_the_sequence_with_eos_only() {
    let (c, tok, n) = setup(0, CompileLimits::default());
    let eos = c.eos_ids().to_vec();
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::Regex, "abc").unwrap())
        .unwrap();
    let mut table = MatcherTable::new(c.vocab_size(), &eos);
    table.add(1, &g).unwrap();
    let z = tok.encode("z", false).unwrap().get_ids()[0];
    assert_eq!(table.advance(&[1], &[z]), vec![1]);
    assert!(table.error(1).unwrap().contains("rejected"));
    let m = table.masks(&[1]);
    let mut want = eos.clone();
    want.sort();
    assert_eq!(allowed_ids(&m.bitmask, n), want);
}

#[test]
fn compiled_grammars_are_cached_by_canonical_text() {
    let (c, _, _) = setup(0, CompileLimits::default());
    let a = c
        .compile(&GrammarSpec::parse(GrammarKind::JsonSchema, r#"{"type": "integer"}"#).unwrap())
        .unwrap();
    let b = c
        .compile(
            &GrammarSpec::parse(GrammarKind::JsonSchema, "{\n  \"type\":\"integer\" }").unwrap(),
        )
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    assert_eq!(c.cached(), 1);
    c.compile(&GrammarSpec::parse(GrammarKind::Regex, "integer").unwrap())
        .unwrap();
    c.compile(&GrammarSpec::parse(GrammarKind::Lark, r#"start: "integer""#).unwrap())
        .unwrap();
    assert_eq!(c.cached(), 3);
}

#[test]
fn bad_grammars_are_invalid_errors_naming_the_problem() {
    let (c, _, _) = setup(0, CompileLimits::default());
    let cases = [
        (
            GrammarKind::JsonSchema,
            r#"{"type": "nosuchtype"}"#,
            "nosuchtype",
        ),
        (GrammarKind::Regex, "(unclosed", "regex"),
        (GrammarKind::Lark, "start: missing_rule", "missing_rule"),
        (GrammarKind::Lark, "this is not lark", "grammar"),
    ];
    for (kind, text, needle) in cases {
        let e = GrammarSpec::parse(kind, text)
            .and_then(|s| c.compile(&s))
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(e, GrammarError::Invalid { .. }),
            "{kind:?} {text}: {e}"
        );
        assert!(e.to_string().contains(needle), "{kind:?} {text}: {e}");
    }
}

#[test]
fn hostile_schemas_are_refused_or_compiled_within_the_budget() {
    let limits = CompileLimits {
        time_budget_ms: 2_000,
        ..CompileLimits::default()
    };
    let (c, _, _) = setup(0, limits);
    let mut deep = String::from(r#"{"type":"integer"}"#);
    for _ in 0..300 {
        deep = format!(r#"{{"type":"object","properties":{{"a":{deep}}},"required":["a"]}}"#);
    }
    let huge_enum =
        serde_json::json!({"enum": (0..200_000).map(|i| format!("value-{i}")).collect::<Vec<_>>()})
            .to_string();
    let nested_patterns =
        r#"{"type":"string","pattern":"^((a|b)*(c|d)*){1,50}(e{1,30}f{1,30}){1,30}$"}"#;
    for schema in [deep, huge_enum, nested_patterns.to_string()] {
        let spec = GrammarSpec::parse(GrammarKind::JsonSchema, &schema);
        let t0 = Instant::now();
        let r = spec.and_then(|s| c.compile(&s));
        let dt = t0.elapsed();
        // The budget bounds the wait for the compile thread (plus scheduling slack on a loaded machine).
        assert!(dt.as_millis() < 3_000, "took {dt:?}");
        if let Err(e) = r {
            assert!(
                matches!(
                    e,
                    GrammarError::Invalid { .. } | GrammarError::Timeout { .. }
                ),
                "{e}"
            );
        }
    }
}

#[test]
fn deferred_advance_in_the_mask_job_equals_advancing_first() {
    let (c, tok, _) = setup(0, CompileLimits::default());
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::Regex, "[a-c]+x").unwrap())
        .unwrap();
    let mut t1 = MatcherTable::new(c.vocab_size(), c.eos_ids());
    let mut t2 = MatcherTable::new(c.vocab_size(), c.eos_ids());
    t1.add(1, &g).unwrap();
    t2.add(1, &g).unwrap();
    let a = tok.encode("a", false).unwrap().get_ids()[0];
    let z = tok.encode("z", false).unwrap().get_ids()[0];
    assert!(t1.advance(&[1], &[a]).is_empty());
    let want = t1.masks(&[1]);
    let got = t2.start_masks(&[1], &[1], &[a]).wait();
    assert_eq!(got.bitmask, want.bitmask);
    assert!(got.failed.is_empty());
    let bad = t2.start_masks(&[1], &[1], &[z]).wait();
    assert_eq!(bad.failed, vec![1]);
}

#[test]
fn finished_sequences_donate_their_matcher_as_the_next_template_and_forks_start_from_it() {
    let (c, tok, n) = setup(0, CompileLimits::default());
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::Regex, "(ab|cd)+x").unwrap())
        .unwrap();
    let mut table = MatcherTable::new(c.vocab_size(), c.eos_ids());
    table.add(1, &g).unwrap();
    table.add(2, &g).unwrap();
    let start = table.masks(&[1, 2]);
    let ab: Vec<u32> = tok.encode("abab", false).unwrap().get_ids().to_vec();
    for &t in &ab {
        assert!(table.advance(&[1, 2], &[t, t]).is_empty());
    }
    assert_eq!(g.template_lineage(), 0);
    assert!(table.remove(1)); // the first finisher becomes the template
    assert_eq!(g.template_lineage(), 1);
    assert!(table.remove(2)); // forked from the older template: refused
    assert_eq!(g.template_lineage(), 1);
    // A fork of the donated template is rewound to the start: the same mask as a pristine start.
    table.add(3, &g).unwrap();
    let again = table.masks(&[3]);
    assert_eq!(
        allowed_ids(&again.bitmask, n),
        allowed_ids(&start.bitmask[..start.words], n)
    );
    // A failed sequence is not donated.
    let z = tok.encode("z", false).unwrap().get_ids()[0];
    assert_eq!(table.advance(&[3], &[z]), vec![3]);
    assert!(table.remove(3));
    assert_eq!(g.template_lineage(), 1);
}

#[test]
fn rows_of_one_grammar_each_own_their_matcher_so_parallel_masks_equal_serial_ones() {
    let (c, tok, _) = setup(0, CompileLimits::default());
    let schema = r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":{"type":"integer"}}},"required":["a","b"]}"#;
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::JsonSchema, schema).unwrap())
        .unwrap();
    let mut par = MatcherTable::new(c.vocab_size(), c.eos_ids());
    let ids: Vec<u64> = (1..=32).collect();
    let prefixes: Vec<Vec<u32>> = (0..32)
        .map(|i| {
            tok.encode(
                format!("{{\"a\": \"{}\", \"b\": [{}", "xy".repeat(i % 5), i).as_str(),
                false,
            )
            .unwrap()
            .get_ids()
            .to_vec()
        })
        .collect();
    for (&id, p) in ids.iter().zip(&prefixes) {
        par.add(id, &g).unwrap();
        for &t in p {
            assert!(par.advance(&[id], &[t]).is_empty(), "row {id}");
        }
    }
    let all = par.masks(&ids);
    for (k, &id) in ids.iter().enumerate() {
        // The same state reached alone, in a table of its own.
        let mut one = MatcherTable::new(c.vocab_size(), c.eos_ids());
        one.add(id, &g).unwrap();
        for &t in &prefixes[k] {
            assert!(one.advance(&[id], &[t]).is_empty());
        }
        assert_eq!(
            one.masks(&[id]).bitmask,
            all.bitmask[k * all.words..(k + 1) * all.words],
            "row {id}"
        );
    }
}

#[test]
fn token_bytes_of_a_byte_fallback_vocabulary_follow_the_conventions() {
    let t = tokenizer();
    let tb = yoco_grammar::token_bytes(&t).unwrap();
    assert_eq!(tb.bytes.len(), t.get_vocab_size(true));
    let id = |s: &str| t.token_to_id(s).unwrap() as usize;
    assert_eq!(tb.bytes[id("<0x41>")], b"A");
    assert_eq!(tb.bytes[id("<0x0A>")], b"\n");
    let mut eos = vec![0xFF];
    eos.extend_from_slice(b"<eos>");
    assert_eq!(tb.bytes[id("<eos>")], eos);
    assert_eq!(tb.info.tok_eos as usize, id("<eos>"));
    assert_eq!(tb.info.tok_pad, Some(id("<pad>") as u32));
    assert_eq!(tb.info.tok_unk, Some(id("<unk>") as u32));
    // A word piece: the space stand-in is a space.
    let (piece, pid) = t
        .get_vocab(true)
        .into_iter()
        .find(|(p, _)| p.starts_with('▁') && p.chars().count() > 2)
        .unwrap();
    assert_eq!(tb.bytes[pid as usize], piece.replace('▁', " ").into_bytes());
}

#[test]
fn token_bytes_of_a_byte_level_vocabulary_map_chars_back_to_bytes() {
    let json = r#"{"version":"1.0","truncation":null,"padding":null,
      "added_tokens":[{"id":4,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
      "normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
      "post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},
      "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":"","end_of_word_suffix":"",
               "fuse_unk":false,"vocab":{"a":0,"Ġa":1,"Ċ":2,"Ġ":3},"merges":[["Ġ","a"]]}}"#;
    let t = tokenizers::Tokenizer::from_bytes(json).unwrap();
    let tb = yoco_grammar::token_bytes(&t).unwrap();
    assert_eq!(tb.bytes[0], b"a");
    assert_eq!(tb.bytes[1], b" a");
    assert_eq!(tb.bytes[2], b"\n");
    assert_eq!(tb.bytes[3], b" ");
    assert_eq!(tb.bytes[4], b"\xFF<|endoftext|>");
    assert_eq!(tb.info.tok_eos, 4);
    // And a grammar over it: after "a", the regex `a a` continues with "Ġa" (its bytes are " a", and it
    // is how the tokenizer spells " a"), never with "a" or "Ċ".
    let c =
        GrammarCompiler::from_tokenizer_json(json.as_bytes(), 8, &[4], CompileLimits::default())
            .unwrap();
    let g = c
        .compile(&GrammarSpec::parse(GrammarKind::Regex, "a a").unwrap())
        .unwrap();
    let mut table = MatcherTable::new(8, &[4]);
    table.add(1, &g).unwrap();
    assert_eq!(allowed_ids(&table.masks(&[1]).bitmask, 8), vec![0]);
    assert!(table.advance(&[1], &[0]).is_empty());
    let next = allowed_ids(&table.masks(&[1]).bitmask, 8);
    assert!(
        next.contains(&1) && !next.contains(&0) && !next.contains(&2),
        "{next:?}"
    );
}

#[test]
fn a_tokenizer_whose_decoder_spells_no_bytes_is_an_error() {
    let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,
      "pre_tokenizer":null,"post_processor":null,"decoder":null,
      "model":{"type":"WordLevel","vocab":{"a":0,"[UNK]":1},"unk_token":"[UNK]"}}"#;
    let e = GrammarCompiler::from_tokenizer_json(json.as_bytes(), 2, &[], CompileLimits::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("spells bytes"), "{e}");
}
