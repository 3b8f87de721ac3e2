//! TextBatch against whole-sequence decoding on the bundled tokenizer (byte-fallback BPE, Gemma-style).

use rand::{rngs::StdRng, Rng, SeedableRng};
use yoco_text::{SeqOptions, TextBatch, Tokenizer};

const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../python/yoco_rs/default_model/tokenizer.json"
);

fn batch() -> TextBatch {
    TextBatch::from_file(TOKENIZER).unwrap()
}

fn enc(t: &Tokenizer, s: &str) -> Vec<u32> {
    t.encode(s, false).unwrap().get_ids().to_vec()
}

fn opts(stop: &[&str], stream: bool) -> SeqOptions {
    SeqOptions {
        skip_special_tokens: true,
        include_stop_str_in_output: false,
        stop: stop.iter().map(|s| s.to_string()).collect(),
        stream,
        detokenize: true,
    }
}

/// Feeds `ids` one per step to request 7; returns (streamed deltas, stop match step).
fn run(b: &mut TextBatch, ids: &[u32], last_code: u8) -> (Vec<String>, Option<(usize, u32)>) {
    let mut deltas = vec![];
    let mut stop = None;
    for (i, &t) in ids.iter().enumerate() {
        let code = if i + 1 == ids.len() { last_code } else { 0 };
        let out = b.step(&[7], &[t as i32], &[code]).unwrap().clone();
        deltas.extend(out.deltas);
        if let (Some(_), Some(&w)) = (out.stop_idx.first(), out.stop_which.first()) {
            stop = Some((i, w));
            break;
        }
    }
    (deltas, stop)
}

#[test]
fn streamed_deltas_concatenate_to_the_whole_sequence_decode() {
    let mut rng = StdRng::seed_from_u64(1);
    let vocab = batch().tokenizer().get_vocab_size(true) as u32;
    for case in 0..200 {
        let mut b = batch();
        let skip = case % 2 == 0;
        let n = rng.random_range(1..40);
        // Ordinary pieces, special tokens, and multi-byte characters spelled as byte-fallback pieces
        // (ids 6..262). Invalid byte runs are left out: the ByteFallback decoder turns a whole run
        // with one bad byte into U+FFFDs, which no incremental decoder can reproduce (see below).
        let mut ids = vec![];
        for _ in 0..n {
            if rng.random_bool(0.3) {
                let ch = ['é', '日', '🙂', 'ж', '€'][rng.random_range(0..5)];
                let mut buf = [0u8; 4];
                ids.extend(ch.encode_utf8(&mut buf).bytes().map(|b| 6 + b as u32));
            } else if rng.random_bool(0.1) {
                ids.push(rng.random_range(0..6));
            } else {
                ids.push(rng.random_range(262..vocab));
            }
        }
        let mut o = opts(&[], true);
        o.skip_special_tokens = skip;
        b.add(7, &[], o.clone()).unwrap();
        // Request 8: the same tokens, not streamed (decoded once at finish).
        o.stream = false;
        b.add(8, &[], o).unwrap();
        let mut deltas = vec![];
        for (i, &t) in ids.iter().enumerate() {
            let code = if i + 1 == ids.len() { 3 } else { 0 };
            let out = b
                .step(&[8, 7], &[t as i32, t as i32], &[code, code])
                .unwrap();
            assert!(out.delta_idx.iter().all(|&k| k == 1));
            deltas.extend(out.deltas.iter().cloned());
        }
        let whole = b.tokenizer().decode(&ids, skip).unwrap();
        assert_eq!(deltas.concat(), whole, "case {case}: ids {ids:?}");
        assert_eq!(b.take(7).unwrap(), (whole.clone(), ids.clone()));
        assert_eq!(b.take(8).unwrap(), (whole, ids.clone()));
    }
}

#[test]
fn a_split_multibyte_character_is_held_back_until_complete() {
    let mut b = batch();
    let tok = b.tokenizer().clone();
    let e_acute: Vec<u32> = ["<0xC3>", "<0xA9>"]
        .iter()
        .map(|t| tok.token_to_id(t).unwrap())
        .collect();
    b.add(7, &[], opts(&[], true)).unwrap();
    let first = b.step(&[7], &[e_acute[0] as i32], &[0]).unwrap().clone();
    assert!(first.deltas.is_empty(), "no text for half a character");
    let second = b.step(&[7], &[e_acute[1] as i32], &[0]).unwrap().clone();
    assert_eq!(second.deltas, vec!["é".to_string()]);
}

#[test]
fn the_first_token_keeps_its_leading_space_after_the_prompt() {
    let mut b = batch();
    let tok = b.tokenizer().clone();
    let (prompt, out) = (enc(&tok, "the"), enc(&tok, " cache warm"));
    assert_eq!(tok.id_to_token(out[0]).unwrap(), "▁cache");
    b.add(7, &prompt, opts(&[], true)).unwrap();
    let (deltas, _) = run(&mut b, &out, 0);
    assert_eq!(deltas.concat(), " cache warm");
}

#[test]
fn a_stop_string_spanning_tokens_is_cut_and_reported() {
    let mut b = batch();
    let tok = b.tokenizer().clone();
    let ids = enc(&tok, "hello world, the cache is warm today");
    b.add(7, &[], opts(&["xyz", "e is w"], true)).unwrap();
    let (deltas, stop) = run(&mut b, &ids, 0);
    let (_, which) = stop.expect("stop string found");
    assert_eq!(which, 1);
    assert_eq!(deltas.concat(), "hello world, the cach");
    assert_eq!(b.text(7).unwrap(), "hello world, the cach");
}

#[test]
fn include_stop_str_in_output_keeps_the_stop_string() {
    let mut b = batch();
    let tok = b.tokenizer().clone();
    let ids = enc(&tok, "one two three four");
    let mut o = opts(&["three"], true);
    o.include_stop_str_in_output = true;
    b.add(7, &[], o).unwrap();
    let (deltas, stop) = run(&mut b, &ids, 0);
    assert!(stop.is_some());
    assert_eq!(deltas.concat(), "one two three");
}

#[test]
fn streaming_never_emits_text_that_a_stop_string_later_removes() {
    let mut rng = StdRng::seed_from_u64(2);
    let words = ["a", "b", "ab", "abc", "c", " ", "bca"];
    for _ in 0..200 {
        let s: String = (0..rng.random_range(1..20))
            .map(|_| words[rng.random_range(0..words.len())])
            .collect();
        let mut b = batch();
        let tok = b.tokenizer().clone();
        b.add(7, &[], opts(&["abca", "cc"], true)).unwrap();
        let ids = enc(&tok, &s);
        let (deltas, _) = run(&mut b, &ids, 3);
        let streamed = deltas.concat();
        let cut = [s.find("abca"), s.find("cc")]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(s.len());
        assert_eq!(streamed, &s[..cut], "text {s:?}");
    }
}

#[test]
fn eos_and_stop_token_text_is_left_out_unless_include_stop_str() {
    let tok = batch().tokenizer().clone();
    let mut ids = enc(&tok, "done");
    let stop_tok = enc(&tok, "!")[0];
    ids.push(stop_tok);
    for (include, want) in [(false, "done"), (true, "done!")] {
        let mut b = batch();
        let mut o = opts(&[], false);
        o.include_stop_str_in_output = include;
        b.add(7, &[], o).unwrap();
        let (deltas, _) = run(&mut b, &ids, 2);
        assert!(
            deltas.is_empty(),
            "non-streaming requests produce no deltas"
        );
        assert_eq!(b.take(7).unwrap().0, want);
        // the stop token stays in the ids even when its text is left out
    }
}

#[test]
fn unknown_ids_are_skipped_and_duplicates_rejected() {
    let mut b = batch();
    b.add(1, &[], opts(&[], true)).unwrap();
    assert!(b.add(1, &[], opts(&[], true)).is_err());
    let out = b.step(&[99, 1], &[300, 300], &[0, 0]).unwrap();
    assert_eq!(out.delta_idx, vec![1]);
    assert!(b.remove(1) && !b.remove(1));
}

#[test]
fn an_unfinished_byte_sequence_is_held_back_and_never_emitted_streamed_or_not() {
    // vLLM's behaviour: text that ends in an incomplete UTF-8 sequence is held back, and what is
    // still held back when the request finishes is dropped; the non-streamed text is the same.
    let mut b = batch();
    let tok = b.tokenizer().clone();
    let ids = [
        enc(&tok, "ok")[0],
        tok.token_to_id("<0xE6>").unwrap(),
        tok.token_to_id("<0x97>").unwrap(),
    ];
    b.add(7, &[], opts(&[], true)).unwrap();
    b.add(8, &[], opts(&[], false)).unwrap();
    let mid = b
        .step(
            &[7, 7, 8, 8],
            &[ids[0] as i32, ids[1] as i32, ids[0] as i32, ids[1] as i32],
            &[0, 0, 0, 0],
        )
        .unwrap()
        .clone();
    let head = tok.decode(&ids[..1], true).unwrap();
    assert_eq!(mid.deltas.concat(), head);
    let end = b
        .step(&[7, 8], &[ids[2] as i32, ids[2] as i32], &[3, 3])
        .unwrap()
        .clone();
    assert!(end.deltas.is_empty(), "{:?}", end.deltas);
    assert_eq!(b.take(7).unwrap().0, head);
    assert_eq!(b.take(8).unwrap().0, head);
}

#[test]
fn a_lazy_request_taken_before_it_finished_returns_the_text_of_its_tokens() {
    // An aborted non-streamed request: its partial text is decoded on take, like a streamed one's.
    let mut b = batch();
    let tok = b.tokenizer().clone();
    let ids = enc(&tok, "hello there world");
    b.add(7, &[], opts(&[], false)).unwrap();
    for &t in &ids {
        b.step(&[7], &[t as i32], &[0]).unwrap();
    }
    let (text, toks) = b.take(7).unwrap();
    assert_eq!(toks, ids);
    assert_eq!(text, tok.decode(&ids, true).unwrap());
}

#[test]
fn without_detokenize_only_token_ids_are_kept() {
    let mut b = batch();
    let mut o = opts(&["a"], true);
    o.detokenize = false;
    b.add(7, &[], o).unwrap();
    let out = b.step(&[7, 7], &[300, 301], &[0, 3]).unwrap();
    assert!(out.deltas.is_empty() && out.stop_idx.is_empty());
    assert_eq!(b.tokens(7).unwrap(), &[300, 301]);
    assert_eq!(b.take(7).unwrap(), (String::new(), vec![300, 301]));
}
