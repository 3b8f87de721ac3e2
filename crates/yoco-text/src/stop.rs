//! Stop strings: found in the text a step added (plus the longest stop string's overlap with what
//! came before), so the search per step is proportional to the new text, not the whole output.

/// One request's stop strings, searched incrementally: [`StopStrings::find`] only scans the text a
/// step added plus the overlap a match could straddle.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    strings: Vec<String>,
    /// Bytes of the longest stop string.
    max_len: usize,
}

impl StopStrings {
    /// The set of `strings`, in the caller's order (ties between matches go to the earlier one);
    /// empty strings are dropped, since they would match everywhere.
    pub fn new(strings: Vec<String>) -> Self {
        let strings: Vec<String> = strings.into_iter().filter(|s| !s.is_empty()).collect();
        let max_len = strings.iter().map(|s| s.len()).max().unwrap_or(0);
        Self { strings, max_len }
    }

    /// No stop string: the caller can skip searching (and holding back streamed text).
    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }

    /// Bytes of the longest stop string.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The earliest stop string occurrence in `text` that ends after byte `new_from` (where this
    /// step's text starts): `(byte offset, index of the stop string)`. Ties go to the earlier string
    /// in the list.
    pub fn find(&self, text: &str, new_from: usize) -> Option<(usize, usize)> {
        if self.strings.is_empty() || new_from >= text.len() {
            return None;
        }
        let mut start = new_from.saturating_sub(self.max_len - 1);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let hay = &text.as_bytes()[start..];
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in self.strings.iter().enumerate() {
            // The first occurrence that reaches into the new text (one wholly in the old text was
            // already seen by an earlier step).
            if let Some(at) = first_reaching(hay, s.as_bytes(), new_from - start) {
                let at = start + at;
                if best.is_none_or(|(b, _)| at < b) {
                    best = Some((at, i));
                }
            }
        }
        best
    }
}

/// The first position `i` where `pat` occurs in `hay` and ends after byte `min_end` (`i +
/// pat.len() > min_end`), overlapping occurrences included. The haystack is one step's text plus a
/// stop string's overlap (a few bytes), where a direct scan beats building a substring searcher
/// per call. A match of valid UTF-8 in valid UTF-8 starts on a character boundary.
fn first_reaching(hay: &[u8], pat: &[u8], min_end: usize) -> Option<usize> {
    let n = pat.len();
    let mut i = (min_end + 1).saturating_sub(n);
    while i + n <= hay.len() {
        i += hay[i..=hay.len() - n].iter().position(|&b| b == pat[0])?;
        if &hay[i..i + n] == pat {
            return Some(i);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_occurrence_reaching_the_new_text_is_found_overlaps_included() {
        let s = StopStrings::new(vec!["aa".into(), "b".into(), String::new()]);
        assert_eq!(s.find("xaa", 2), Some((1, 0)));
        assert_eq!(s.find("xaa", 3), None, "nothing new");
        // "aa" at 0 ends in the old text; the one at 1 reaches the new byte.
        assert_eq!(s.find("aaa", 2), Some((1, 0)));
        // Ties go to the earlier string; an earlier position wins over the list order.
        let t = StopStrings::new(vec!["cd".into(), "bcd".into()]);
        assert_eq!(t.find("abcd", 3), Some((1, 1)));
        assert_eq!(t.find("éé stop", 2), None);
        let u = StopStrings::new(vec!["é".into()]);
        assert_eq!(u.find("aé", 1), Some((1, 0)));
    }

    #[test]
    fn find_agrees_with_a_brute_force_search_on_random_texts() {
        // The reference: every (position, string) pair, the smallest position ending after
        // `new_from`, ties to the earlier string.
        let alphabet = ["a", "b", "é", "ab", "\n"];
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = |m: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % m as u64) as usize
        };
        for _ in 0..20_000 {
            let word = |next: &mut dyn FnMut(usize) -> usize, n: usize| -> String {
                (0..n).map(|_| alphabet[next(alphabet.len())]).collect()
            };
            let k = 1 + next(3);
            let stops: Vec<String> = (0..k)
                .map(|_| {
                    let n = 1 + next(3);
                    word(&mut next, n)
                })
                .collect();
            let n = next(8);
            let text = word(&mut next, n);
            let mut new_from = next(text.len() + 1);
            while !text.is_char_boundary(new_from) {
                new_from -= 1;
            }
            let mut want: Option<(usize, usize)> = None;
            for at in (0..text.len()).filter(|&a| text.is_char_boundary(a)) {
                for (i, s) in stops.iter().enumerate() {
                    if text[at..].starts_with(s.as_str())
                        && at + s.len() > new_from
                        && want.is_none_or(|(b, _)| at < b)
                    {
                        want = Some((at, i));
                    }
                }
            }
            let got = StopStrings::new(stops.clone()).find(&text, new_from);
            assert_eq!(got, want, "{stops:?} in {text:?} from {new_from}");
        }
    }
}
