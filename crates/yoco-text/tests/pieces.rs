//! `PieceDecoder` (the precomputed decode of SentencePiece-style decoders) against
//! `tokenizers`' own `decode`, the independent reference: random id sequences heavy in byte-fallback
//! tokens (valid and invalid UTF-8 runs) and special tokens, with and without skipping them, and
//! incremental decoding through both.

use rand::{rngs::StdRng, Rng, SeedableRng};
use yoco_text::{Detok, IncrementalDecoder, PieceDecoder, TextBatch, Tokenizer};

const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../python/yoco_rs/default_model/tokenizer.json"
);

fn tokenizer() -> Tokenizer {
    Tokenizer::from_file(TOKENIZER).unwrap()
}

/// Ids drawn to stress the decoder: byte tokens (runs that are and are not UTF-8), specials, ids
/// beyond the vocabulary, and ordinary tokens.
fn random_ids(rng: &mut StdRng, tok: &Tokenizer, n: usize) -> Vec<u32> {
    let vocab = tok.get_vocab_size(true) as u32;
    let byte = |b: u8| tok.token_to_id(&format!("<0x{b:02X}>")).unwrap();
    let mut ids = Vec::new();
    while ids.len() < n {
        match rng.random_range(0..10) {
            0 => ids.extend(
                "é€😀"
                    .chars()
                    .nth(rng.random_range(0..3))
                    .map(|c| {
                        let mut buf = [0u8; 4];
                        c.encode_utf8(&mut buf)
                            .bytes()
                            .map(byte)
                            .collect::<Vec<_>>()
                    })
                    .unwrap(),
            ),
            1 => ids.push(byte(rng.random_range(0x80..=0xFF))),
            2 => ids.push(byte(rng.random_range(0..0x80))),
            3 => ids.push(rng.random_range(0..8)), // <pad>, <eos>, <bos>, ... turn markers
            4 => ids.push(vocab + rng.random_range(0..4)), // not in the vocabulary
            _ => ids.push(rng.random_range(0..vocab)),
        }
    }
    ids.truncate(n);
    ids
}

#[test]
fn the_piece_table_decodes_every_sequence_as_the_tokenizer_does() {
    let tok = tokenizer();
    let p = PieceDecoder::new(&tok).expect("the bundled decoder is Replace + ByteFallback + Fuse");
    let mut rng = StdRng::seed_from_u64(5);
    for trial in 0..20_000 {
        let n = rng.random_range(0..12);
        let ids = random_ids(&mut rng, &tok, n);
        for skip in [false, true] {
            let want = tok.decode(&ids, skip).unwrap();
            assert_eq!(
                p.decode(&ids, skip),
                want,
                "trial {trial} ids {ids:?} skip {skip}"
            );
        }
    }
}

#[test]
fn incremental_text_is_the_same_through_the_piece_table() {
    let tok = tokenizer();
    let p = PieceDecoder::new(&tok).unwrap();
    let mut rng = StdRng::seed_from_u64(6);
    for trial in 0..2_000 {
        let ctx = random_ids(&mut rng, &tok, 5);
        let ids = random_ids(&mut rng, &tok, 40);
        let skip = rng.random_bool(0.5);
        let (mut a, mut b) = (IncrementalDecoder::new(&ctx), IncrementalDecoder::new(&ctx));
        let fast = Detok {
            tok: &tok,
            pieces: Some(&p),
        };
        for &id in &ids {
            assert_eq!(
                a.push(fast, id, skip).unwrap(),
                b.push(&tok, id, skip).unwrap(),
                "trial {trial}"
            );
        }
        assert_eq!(a.flush(fast, skip).unwrap(), b.flush(&tok, skip).unwrap());
    }
}

#[test]
fn other_decoders_are_left_to_the_tokenizer() {
    // A Metaspace decoder strips the first token's leading space: not a concatenation of pieces.
    let json = r#"{
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": true},
        "model": {"type": "WordLevel", "vocab": {"\u2581a": 0, "\u2581b": 1, "<unk>": 2}, "unk_token": "<unk>"}
    }"#;
    let tok = Tokenizer::from_bytes(json).unwrap();
    assert!(PieceDecoder::new(&tok).is_none());
    assert!(!TextBatch::new(tok).uses_piece_table());
    assert!(TextBatch::from_file(TOKENIZER).unwrap().uses_piece_table());
}
