//! The encoder budget of one step (vLLM's `encoder_compute_budget`): how many multimodal encoder
//! output tokens (image / audio soft tokens) the step may ask the executor to compute.
//!
//! A chunk that reaches into an item's placeholder run needs the item's encoder output. The item
//! is charged to the step whose chunk first touches its run: the chunk containing the run's start,
//! or the request's first chunk after admission when a prefix hit (or a preemption's recompute)
//! starts inside the run. A chunk whose items do not fit in what is left of the step's budget stops
//! just before the first item that does not fit (the text before it still runs), or is not
//! scheduled at all when it starts at that item. Decodes carry no items, so one large image delays
//! only its own prefill, never the decodes sharing the step. Every item fits in an empty budget
//! (validated at `add_request`), so a request never waits forever.

/// `(offset, length)` of each placeholder run of a request, sorted and disjoint.
pub(super) type MmRanges = Vec<(u32, u32)>;

/// The tokens of a chunk `computed .. computed + n` the encoder budget allows, and the encoder
/// tokens that costs. `fresh`: the request's first chunk since admission (an item begun before
/// `computed` has no encoder output yet). Returns `(n', cost)` with `n' <= n` and `cost <= budget`.
pub(super) fn limit_chunk(
    items: &[(u32, u32)],
    computed: u32,
    n: u32,
    fresh: bool,
    budget: u32,
) -> (u32, u32) {
    let end = computed as u64 + n as u64;
    let first = items.partition_point(|&(o, l)| o as u64 + l as u64 <= computed as u64);
    let mut cost = 0u32;
    for &(offset, length) in &items[first..] {
        if offset as u64 >= end {
            break;
        }
        let needs_encoder = offset >= computed || fresh;
        if !needs_encoder {
            continue; // encoded by an earlier chunk of this run
        }
        if cost as u64 + length as u64 > budget as u64 {
            // Stop before the item; a chunk that would start inside it runs nothing.
            return (offset.saturating_sub(computed), cost);
        }
        cost += length;
    }
    (n, cost)
}

#[cfg(test)]
mod tests {
    use super::limit_chunk;

    #[test]
    fn a_chunk_stops_before_the_item_that_does_not_fit() {
        let items = [(4, 8), (20, 8)];
        // both fit
        assert_eq!(limit_chunk(&items, 0, 32, true, 16), (32, 16));
        // the second does not: stop at its start
        assert_eq!(limit_chunk(&items, 0, 32, true, 10), (20, 8));
        // none fits: only the text before the first item
        assert_eq!(limit_chunk(&items, 0, 32, true, 7), (4, 0));
        // a chunk starting at an item that does not fit runs nothing
        assert_eq!(limit_chunk(&items, 4, 28, false, 7), (0, 0));
        assert_eq!(limit_chunk(&items, 20, 12, false, 0), (0, 0));
    }

    #[test]
    fn an_item_is_charged_once_when_its_run_is_split_across_chunks() {
        let items = [(4, 8)];
        assert_eq!(limit_chunk(&items, 0, 6, false, 8), (6, 8));
        // the next chunk continues inside the run: already encoded
        assert_eq!(limit_chunk(&items, 6, 10, false, 0), (10, 0));
        // ... unless the request was just admitted there (prefix hit, resumed after preemption)
        assert_eq!(limit_chunk(&items, 6, 10, true, 8), (10, 8));
        assert_eq!(limit_chunk(&items, 6, 10, true, 7), (0, 0));
        // chunks before or after the run cost nothing
        assert_eq!(limit_chunk(&items, 0, 4, true, 0), (4, 0));
        assert_eq!(limit_chunk(&items, 12, 5, true, 0), (5, 0));
        assert_eq!(limit_chunk(&[], 0, 5, true, 0), (5, 0));
    }
}
