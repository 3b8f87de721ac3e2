//! The bitmask applied to host logits in place: the CPU form of the sampler's grammar mask.
//!
//! One pass over the packed words with no temporaries: a word with every bit set (free text) is
//! skipped whole, one with none set (most words under a narrow constraint) filled whole, rows run in
//! parallel when there is enough work. The torch form
//! (unpack to a bool tensor, gather the rows, fill, scatter back) allocates four `[rows, vocab]`
//! temporaries and cost about as much as the masks themselves at 64 rows.

use rayon::prelude::*;

use crate::GrammarError;

/// Row-elements below which the rows are masked on the calling thread (rayon's dispatch costs more).
const PARALLEL_ELEMS: usize = 1 << 20;

/// `logits` is `[n, vocab]` row-major. For each `i`, in row `rows[i]`, every token whose bit in
/// `bitmask[i]` (`words` packed `i32`s: bit `t % 32` of word `t / 32`) is clear, and every token past
/// `32 * words`, becomes `-inf`. Rows must be distinct and in range.
pub fn mask_logits(
    logits: &mut [f32],
    vocab: usize,
    rows: &[usize],
    bitmask: &[i32],
    words: usize,
) -> Result<(), GrammarError> {
    let bad = |m: String| GrammarError::Invalid {
        kind: "bitmask",
        message: m,
    };
    if vocab == 0 || logits.len() % vocab != 0 {
        return Err(bad(format!(
            "logits of {} elements are not rows of {vocab}",
            logits.len()
        )));
    }
    if bitmask.len() != rows.len() * words {
        return Err(bad(format!(
            "bitmask of {} words for {} rows of {words}",
            bitmask.len(),
            rows.len()
        )));
    }
    let n = logits.len() / vocab;
    let mut slots: Vec<Option<&mut [f32]>> = logits.chunks_mut(vocab).map(Some).collect();
    let mut work = Vec::with_capacity(rows.len());
    for (i, &r) in rows.iter().enumerate() {
        let row = slots
            .get_mut(r)
            .and_then(Option::take)
            .ok_or_else(|| bad(format!("row {r} out of {n} or repeated")))?;
        work.push((row, &bitmask[i * words..(i + 1) * words]));
    }
    if rows.len() * vocab >= PARALLEL_ELEMS {
        crate::grammar_pool()
            .install(|| work.into_par_iter().for_each(|(row, bm)| mask_row(row, bm)));
    } else {
        work.into_iter().for_each(|(row, bm)| mask_row(row, bm));
    }
    Ok(())
}

fn mask_row(row: &mut [f32], bm: &[i32]) {
    for (w, chunk) in row.chunks_mut(32).enumerate() {
        let bits = bm.get(w).map_or(0u32, |&b| b as u32);
        if bits == u32::MAX {
            continue;
        }
        if bits == 0 {
            chunk.fill(f32::NEG_INFINITY); // the common case inside a constrained token class
            continue;
        }
        for (b, x) in chunk.iter_mut().enumerate() {
            if bits >> b & 1 == 0 {
                *x = f32::NEG_INFINITY;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clears_exactly_the_disallowed_tokens_of_the_named_rows() {
        let vocab = 70; // three words, the last partly past the vocabulary; 70 > 64 covered by word 2
        let mut logits = vec![1.0f32; 3 * vocab];
        let mut bm = vec![0i32; 2 * 3];
        bm[0] = 1 | (1 << 5); // row 2: tokens 0 and 5
        bm[3 + 1] = 1 << 31; // row 0: token 63
        mask_logits(&mut logits, vocab, &[2, 0], &bm, 3).unwrap();
        let allowed = |r: usize| {
            (0..vocab)
                .filter(|&t| logits[r * vocab + t] == 1.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(allowed(2), vec![0, 5]);
        assert_eq!(allowed(0), vec![63]);
        assert_eq!(allowed(1).len(), vocab); // unconstrained row untouched
    }

    #[test]
    fn tokens_past_the_words_are_disallowed_and_bad_shapes_are_errors() {
        let mut logits = vec![0.0f32; 40];
        mask_logits(&mut logits, 40, &[0], &[-1], 1).unwrap();
        assert!(
            logits[..32].iter().all(|&x| x == 0.0)
                && logits[32..].iter().all(|&x| x == f32::NEG_INFINITY)
        );
        assert!(mask_logits(&mut logits, 40, &[1], &[-1], 1).is_err());
        assert!(mask_logits(&mut logits, 40, &[0, 0], &[-1, -1], 1).is_err());
        assert!(mask_logits(&mut logits, 40, &[0], &[-1, -1], 1).is_err());
    }
}
