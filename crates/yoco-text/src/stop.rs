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
        let hay = &text[start..];
        let mut best: Option<(usize, usize)> = None;
        for (i, s) in self.strings.iter().enumerate() {
            // The first occurrence that reaches into the new text (one wholly in the old text was
            // already seen by an earlier step).
            let hit = hay
                .match_indices(s.as_str())
                .map(|(pos, _)| start + pos)
                .find(|&at| at + s.len() > new_from);
            if let Some(at) = hit {
                if best.map_or(true, |(b, _)| at < b) {
                    best = Some((at, i));
                }
            }
        }
        best
    }
}
