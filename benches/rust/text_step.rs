//! `TextBatch::step` at 256 streaming rows (one token each per step, a stop string each): the step
//! loop's text cost, with the precomputed piece table (`PieceDecoder`, the default for the bundled
//! SentencePiece-style tokenizer) and through `tokenizers`' decoder chain (the reference). Rounds
//! alternate the two; CPU time of this thread per step (wall time is the other processes on a shared
//! box), median of the rounds.
//!
//! `cargo bench -p yoco-text --bench text_step`

#[path = "cpu_time.rs"]
mod cpu_time;

use yoco_text::{SeqOptions, TextBatch, Tokenizer};

const ROWS: usize = 256;
const STEPS: usize = 400;
const ROUNDS: usize = 5;

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../python/yoco_rs/default_model/tokenizer.json"
    );
    let tok = Tokenizer::from_file(path).expect("bundled tokenizer");
    let text = "Once upon a time, in a land far away, a small boat sailed across the calm sea. \
                The sailors sang songs about the stars, the wind and the long way home. ";
    let ids: Vec<u32> = tok
        .encode(text.repeat(8), false)
        .unwrap()
        .get_ids()
        .to_vec();
    let mut per_step = [Vec::new(), Vec::new()];
    for _ in 0..ROUNDS {
        for (k, fast) in [true, false].into_iter().enumerate() {
            let mut b = if fast {
                TextBatch::new(tok.clone())
            } else {
                TextBatch::without_piece_table(tok.clone())
            };
            assert_eq!(b.uses_piece_table(), fast);
            let req_ids: Vec<u64> = (0..ROWS as u64).collect();
            for &id in &req_ids {
                let opts = SeqOptions {
                    skip_special_tokens: true,
                    include_stop_str_in_output: false,
                    stop: vec!["\n\n\n".into()],
                    stream: true,
                    detokenize: true,
                };
                b.add(id, &ids[..4], opts).unwrap();
            }
            let fin = vec![0u8; ROWS];
            let mut toks = vec![0i32; ROWS];
            let t = cpu_time::thread_ns();
            for s in 0..STEPS {
                for (r, x) in toks.iter_mut().enumerate() {
                    *x = ids[(s + r * 7) % ids.len()] as i32;
                }
                let out = b.step(&req_ids, &toks, &fin).unwrap();
                std::hint::black_box(out.deltas.len());
            }
            per_step[k].push((cpu_time::thread_ns() - t) as f64 / STEPS as f64 / 1e3);
        }
    }
    println!("| decoder | CPU µs per step at {ROWS} rows (median of {ROUNDS}) | min |");
    println!("|---|---|---|");
    for (k, name) in ["piece table", "tokenizers"].iter().enumerate() {
        let v = &mut per_step[k];
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("| {name} | {:.1} | {:.1} |", v[v.len() / 2], v[0]);
    }
}
